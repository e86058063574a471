"""HTTP side of the fake API server: routing, verbs, chunked watch streams.

An object answered or sent in a watch event is encoded once per stored version
(:meth:`~tests.support.fakekube_store.Store.wire`), and shared by the write's answer
and every watcher's event; a watcher writes each batch of events it is woken for in
one write to its socket (one chunk per event, as before), and waits
:data:`WATCH_BATCH_S` before it looks for the next batch.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.support.fakekube_admission import ApiSecurity, WriteRequest
from tests.support.fakekube_auth import User, request_attributes
from tests.support.fakekube_namespaces import SUBRESOURCES as NAMESPACE_SUBRESOURCES
from tests.support.fakekube_namespaces import is_namespace
from tests.support.fakekube_raw import decode_body, encode_wire, event_line, raw_paths, under
from tests.support.fakekube_selectors import parse_field_selector, parse_label_selector
from tests.support.fakekube_store import Admit, Store, WatchFilter, without
from tests.support.fakekube_types import (
    FakeApiError,
    JsonObj,
    ResourceKind,
    bad_request,
    unknown_path,
)


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it."""

    method: str
    path: str
    """Without the query string."""
    query: Mapping[str, list[str]]
    content_type: str | None
    body: bytes = b""
    """Exactly the bytes sent."""
    authorization: str | None = None
    user_agent: str | None = None
    at: float = 0.0
    """``time.monotonic()`` when the request was read (benchmarks: when a write arrived)."""


@dataclass(frozen=True)
class Answer:
    """How the fake answered one request: the HTTP status, and when the answer went out
    (``time.monotonic()``, after the store was changed). Watch streams are not answered
    here (their status is sent before the stream and they end much later)."""

    request: RecordedRequest
    code: int
    at: float


@dataclass
class Fault:
    """An injected failure for the next ``remaining`` matching requests."""

    method: str
    """Upper-case HTTP method, or ``*``."""
    path_substring: str
    status: int | None
    """``None``: close the connection without any response."""
    remaining: int
    message: str
    retry_after: int | None


@dataclass(frozen=True)
class Route:
    """What a REST path names."""

    kind: ResourceKind
    namespace: str | None
    name: str | None
    subresource: str | None


class Server(ThreadingHTTPServer):
    """Serves ``store`` on 127.0.0.1 at a free port, one thread per connection.

    ``record`` logs each request and returns the fault it triggers, if any;
    ``track`` is told of each connection opening (True) and closing (False);
    ``version_info`` is the body of ``GET /version``; ``security``, when given,
    authenticates, authorizes and admits every request (else everything is allowed,
    as with ``--authorization-mode=AlwaysAllow``).
    """

    daemon_threads = True
    request_queue_size = 128  # the default 5 drops SYNs when tests connect in parallel

    def __init__(
        self,
        store: Store,
        record: Callable[[RecordedRequest, str], Fault | None],
        track: Callable[[socket.socket, bool], None],
        version_info: JsonObj,
        *,
        tls: ssl.SSLContext | None = None,
        security: ApiSecurity | None = None,
        answered: Callable[[Answer], None] | None = None,
        write_delay_s: float = 0.0,
    ) -> None:
        self.store = store
        self.answered = answered
        self.write_delay_s = write_delay_s
        self._delayed_lock = threading.Lock()
        self._delayed_now = 0
        self.peak_delayed_writes = 0
        """The most writes ever held by ``write_delay_s`` at one moment: how many of a
        client's writes were in flight side by side."""
        self.security = security
        self.record = record
        self.track = track
        self.version_info = version_info
        self.tls = tls
        super().__init__(("127.0.0.1", 0), _Handler)

    def hold_write(self) -> None:
        with self._delayed_lock:
            self._delayed_now += 1
            self.peak_delayed_writes = max(self.peak_delayed_writes, self._delayed_now)
        try:
            time.sleep(self.write_delay_s)
        finally:
            with self._delayed_lock:
                self._delayed_now -= 1

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is None:
            return sock, address
        # The handshake happens on the handler thread's first read, not here on
        # the accept loop's: one slow client must not hold up the others.
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-response, or refusing our certificate (a test of an
        # untrusted server), is normal in tests; anything else is a bug.
        if not isinstance(sys.exc_info()[1], ConnectionError | ssl.SSLError):
            super().handle_error(request, client_address)


_WATCH_TRUE = ("true", "1")
WATCH_BATCH_S = 0.001
"""After sending a batch of events, a watch waits this long before it looks for more:
the events committed meanwhile go as one batch, instead of waking the watch's thread
for each (in a burst of writes, a thread hand-off and a socket write per event cost the
fake more CPU than the events themselves)."""
_dates: dict[int, str] = {}
"""The ``Date`` header of the current second (:meth:`_Handler.date_time_string`)."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watch streams
    server: Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle's
        # algorithm holds the body back until the client's delayed ACK (40 ms).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the per-request stderr log; tests read ``FakeKubeApi.requests``."""

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The ``Date`` header, formatted once per second (the same text each time)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        second = int(time.time())
        held = _dates.get(second)
        if held is None:
            held = super().date_time_string(second)
            _dates.clear()
            _dates[second] = held
        return held

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        store = self.server.store
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        content_type = self.headers.get("Content-Type")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        request = RecordedRequest(
            method,
            url.path,
            query,
            content_type,
            raw,
            self.headers.get("Authorization"),
            self.headers.get("User-Agent"),
            time.monotonic(),
        )
        fault = self.server.record(request, self.path)
        if fault is not None:
            self._send_fault(fault)
            return
        if self.server.write_delay_s and method in _WRITES:
            # A slow storage round trip: this handler thread waits, the others go on,
            # so concurrent writes are delayed side by side, not one after another.
            self.server.hold_write()
        try:
            user = self._authorized(method, url.path, query)
            if method == "GET" and url.path.rstrip("/") == "/version":
                self._send_json(200, self.server.version_info)
                return
            route = route_for(store.kinds, url.path)
            try:
                body = decode_body(raw.decode(), raw_paths(route.kind)) if raw else None
            except ValueError:
                raise bad_request("the request body is not valid JSON") from None

            def param(name: str) -> str:
                return query.get(name, [""])[-1]

            if method == "GET" and route.name is None and param("watch") in _WATCH_TRUE:
                self._serve_watch(route, param)
                return
            code, obj = _handle(
                store,
                method,
                route,
                body=body,
                content_type=content_type or "",
                param=param,
                admit=self._admission(user, method, route),
            )
            listed = method == "GET" and route.name is None
            paths = raw_paths(route.kind)
            raw_at: frozenset[tuple[str, ...]] = under(("items", "*"), paths) if listed else paths
            # One object from the store (not a list): its encoding is shared.
            stored_kind: ResourceKind | None = None if listed else route.kind
        except FakeApiError as err:
            code, obj, raw_at, stored_kind = err.code, err.status(), frozenset(), None
        except Exception as err:  # a bug in the fake: make the test fail loudly, not hang
            code, obj = 500, FakeApiError(500, f"fake API server bug: {err!r}").status()
            raw_at, stored_kind = frozenset(), None
        if stored_kind is not None:
            self._send_data(code, store.wire(stored_kind, obj))
        else:
            self._send_json(code, obj, raw_at=raw_at)
        if self.server.answered is not None:
            self.server.answered(Answer(request, code, time.monotonic()))

    def _authorized(self, method: str, path: str, query: Mapping[str, list[str]]) -> User | None:
        """The request's user; 401 or 403 (raised) as the API server answers before routing."""
        security = self.server.security
        if security is None:
            return None
        user = security.authenticator.authenticate(self.headers.get("Authorization"))
        security.rbac.check(user, request_attributes(method, path, query))
        return user

    def _admission(self, user: User | None, method: str, route: Route) -> Admit | None:
        security = self.server.security
        if security is None or user is None or method not in _WRITES:
            return None
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]

        def admit(operation: str, old: JsonObj | None, new: JsonObj | None) -> None:
            name = route.name or str(((new or {}).get("metadata") or {}).get("name", ""))
            request = WriteRequest(
                user,
                operation,
                verb,
                route.kind,
                route.namespace or "",
                name,
                route.subresource or "",
            )
            security.admission.admit(request, old, new)

        return admit

    def _send_json(
        self,
        code: int,
        obj: JsonObj,
        headers: Mapping[str, str] | None = None,
        *,
        raw_at: frozenset[tuple[str, ...]] | None = None,
    ) -> None:
        """``raw_at``: where ``obj`` may hold opaque values (:func:`encode_wire`)."""
        self._send_data(code, encode_wire(obj, raw_at), headers)

    def _send_data(self, code: int, data: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        # The blank line and the body join the buffered headers: one write to the socket
        # (one TLS record, one segment), the same bytes as end_headers() and a write.
        buffered = getattr(self, "_headers_buffer", None)
        if isinstance(buffered, list):
            buffered += (b"\r\n", data)
            self.flush_headers()
        else:
            self.end_headers()
            self.wfile.write(data)

    def _send_fault(self, fault: Fault) -> None:
        if fault.status is None:
            self.close_connection = True  # the client sees the connection drop
            return
        headers = {} if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
        self._send_json(fault.status, FakeApiError(fault.status, fault.message).status(), headers)

    def _serve_watch(self, route: Route, param: Callable[[str], str]) -> None:
        store = self.server.store
        flt = WatchFilter(
            route.kind,
            route.namespace,
            parse_label_selector(param("labelSelector")),
            parse_field_selector(param("fieldSelector")),
        )
        timeout = param("timeoutSeconds")
        if timeout and not timeout.isdigit():
            raise bad_request(f"invalid timeoutSeconds {timeout!r}")
        deadline = time.monotonic() + int(timeout) if timeout else None
        expired: FakeApiError | None = None
        initial: list[JsonObj] = []
        cursor = 0
        try:
            initial, cursor = store.watch_start(flt, param("resourceVersion"))
        except FakeApiError as err:
            if err.code != 410:
                raise
            expired = err  # like the API server: 200, then an ERROR event
        # Counted before the headers go out, so close() waits for this stream
        # once a client can see it open.
        store.watch_opened()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.close_connection = True
            if expired is None:
                self._stream(store, flt, initial, cursor, deadline)
            else:
                self._write_event("ERROR", expired.status())
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away
        except Exception as err:  # a bug in the fake: end the stream with an error event
            with contextlib.suppress(OSError):
                self._write_event("ERROR", FakeApiError(500, f"fake bug: {err!r}").status())
                self.wfile.write(b"0\r\n\r\n")
        finally:
            store.watch_closed()

    def _stream(
        self,
        store: Store,
        flt: WatchFilter,
        initial: list[JsonObj],
        cursor: int,
        deadline: float | None,
    ) -> None:
        kind = flt.kind
        self._write_chunks([event_line("ADDED", store.wire(kind, obj)) for obj in initial])
        while True:
            try:
                events, cursor, done = store.next_events(flt, cursor, deadline)
            except FakeApiError as err:  # history trimmed under a slow watcher
                self._write_event("ERROR", err.status())
                return
            self._write_chunks([event_line(t, store.wire(kind, obj)) for t, obj in events])
            if done:
                return
            if events:
                time.sleep(WATCH_BATCH_S)

    def _write_chunks(self, lines: list[bytes]) -> None:
        """Each line as one chunk, all in one write to the socket."""
        if lines:
            self.wfile.write(b"".join(b"%X\r\n%s\r\n" % (len(line), line) for line in lines))

    def _write_event(
        self, event_type: str, obj: JsonObj, raw_at: frozenset[tuple[str, ...]] | None = None
    ) -> None:
        """``raw_at``: where the event may hold opaque values (None: anywhere)."""
        line = encode_wire({"type": event_type, "object": obj}, raw_at) + b"\n"
        self.wfile.write(b"%X\r\n%s\r\n" % (len(line), line))


def _handle(
    store: Store,
    method: str,
    route: Route,
    *,
    body: Any,
    content_type: str,
    param: Callable[[str], str],
    admit: Admit | None = None,
) -> tuple[int, JsonObj]:
    """Everything but watch: one verb on one route, returning (HTTP code, body)."""
    kind, namespace, name = route.kind, route.namespace, route.name
    dry_run = _dry_run(param("dryRun")) if method in _WRITES else False
    if name is None:
        if method == "GET":
            return 200, _list(store, kind, namespace, param)
        if method == "POST" and (namespace is not None or not kind.namespaced):
            return 201, store.create(
                kind, namespace, body, dry_run=dry_run, checked=True, admit=admit
            )
    else:
        status_only = route.subresource == "status"
        if route.subresource == "finalize" and method != "PUT":  # it serves updates only
            raise FakeApiError(405, _NOT_ALLOWED)
        if method == "GET":
            return 200, store.get(kind, namespace, name)
        if method == "PUT":
            if route.subresource == "finalize":
                obj = store.finalize(kind, name, body, dry_run=dry_run, admit=admit)
            else:
                obj = store.replace(
                    kind,
                    namespace,
                    name,
                    body,
                    status_only=status_only,
                    dry_run=dry_run,
                    checked=True,
                    admit=admit,
                )
            return 200, obj
        if method == "PATCH":
            return 200, store.patch(
                kind,
                namespace,
                name,
                body,
                content_type,
                status_only=status_only,
                dry_run=dry_run,
                field_manager=param("fieldManager"),
                force=param("force") == "true",
                checked=True,
                admit=admit,
            )
        if method == "DELETE" and not status_only:
            gone, obj = store.delete(kind, namespace, name, body, dry_run=dry_run, admit=admit)
            # A Namespace the controller will end is answered 200, as the API server does.
            return (200 if gone or is_namespace(kind) else 202), obj
    raise FakeApiError(405, _NOT_ALLOWED)


_NOT_ALLOWED = "the server does not allow this method on the requested resource"
_WRITES = ("POST", "PUT", "PATCH", "DELETE")


def _list(
    store: Store, kind: ResourceKind, namespace: str | None, param: Callable[[str], str]
) -> JsonObj:
    """A list, whole or in chunks (``limit``, ``continue``)."""
    labels = parse_label_selector(param("labelSelector"))
    fields = parse_field_selector(param("fieldSelector"))
    limit, token = param("limit"), param("continue")
    if limit and not limit.isdigit():
        raise bad_request(f"invalid limit {limit!r}: a non-negative integer")
    if token and param("resourceVersion"):
        raise bad_request("specifying resource version is not allowed when using continue")
    meta: JsonObj
    if int(limit or 0) > 0 or token:
        items, rv, following, left = store.list_page(
            kind, namespace, labels, fields, limit=int(limit or 0), token=token
        )
        meta = {"resourceVersion": str(rv)}
        if following:
            meta |= {"continue": following, "remainingItemCount": left}
    else:
        items, rv = store.list_objects(kind, namespace, labels, fields)
        meta = {"resourceVersion": str(rv)}
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.api_version,
        "metadata": meta,
        "items": [without(i, "kind", "apiVersion") for i in items],
    }


def _dry_run(value: str) -> bool:
    """The ``dryRun`` query parameter: absent, or ``All`` (the only stage there is)."""
    if value in ("", "All"):
        return value == "All"
    raise bad_request(f'dryRun: Unsupported value: "{value}": supported values: "All"')


def route_for(kinds: tuple[ResourceKind, ...], path: str) -> Route:
    """Parse a REST path; 404 (no details) for anything not served."""
    parts = [unquote(p) for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise unknown_path()
    namespace = None
    own_subresource = len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES
    if len(rest) >= 3 and rest[0] == "namespaces" and not own_subresource:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else ""
    found = [k for k in kinds if (k.group, k.version, k.plural) == (group, version, plural)]
    if not found or len(rest) > 3:
        raise unknown_path()
    kind = found[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    # A namespaced kind is also listed and watched across namespaces at its cluster path.
    scoped = (namespace is not None) == kind.namespaced or (kind.namespaced and name is None)
    status_ok = subresource is None or (subresource == "status" and kind.status_subresource)
    status_ok = status_ok or (subresource == "finalize" and is_namespace(kind))
    if not scoped or not status_ok:
        raise unknown_path()
    return Route(kind, namespace, name, subresource)
