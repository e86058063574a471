"""Raw list and watch of any kind, as JSON: the informers' only contact with the client.

Why raw: kubernetes 37.0.2's typed ``watch.Watch`` deserialises resource.k8s.io
events into the wrong models (and its models drop fields they do not know), so
the watch is one ``GET ...?watch=true`` through the client's request machinery
(auth, TLS, proxies) with the body left unread (the pydantic client always
answers ``_preload_content=False``-style: a ``RESTResponse`` around the urllib3
response), and the newline-delimited JSON events are read from the stream
here.

Every call blocks; the controller runs them in a thread. Errors come out as
:class:`~dra_driver.base.errors.ApiError` (through :func:`translate_api_errors`);
an ``ERROR`` event with a 410 Status (resourceVersion too old) is
:class:`WatchExpiredError`, and the caller relists.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable

import urllib3

from dra_driver.base.errors import ApiError
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.errors import translate_api_errors, truncate
from dra_driver.k8s.rest import JsonObj, api_exception, open_request, request_json

DEFAULT_WATCH_TIMEOUT_S = 300
"""Server-side ``timeoutSeconds`` of one watch request."""


class WatchExpiredError(ApiError):
    """The watch's resourceVersion is older than the server keeps (410 Gone/Expired)."""


class WatchCanceller:
    """Ends a watch blocked in another thread at once (the stream's socket is shut down).

    Without it a stopping process waits for the blocked read to time out (the
    read timeout, 30 s by default): threads are joined at interpreter exit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._response: urllib3.BaseHTTPResponse | None = None
        self.cancelled = False

    def attach(self, response: urllib3.BaseHTTPResponse | None) -> None:
        """The stream now open (None: none is); one opened after :meth:`cancel` ends at once."""
        with self._lock:
            self._response = response
            if self.cancelled and response is not None:
                _shutdown(response)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._response is not None:
                _shutdown(self._response)


def _shutdown(response: urllib3.BaseHTTPResponse) -> None:
    shutdown = getattr(response, "shutdown", None)  # urllib3 2.3+
    # A stream that ended meanwhile has closed its socket: shutting it down then
    # fails (EBADF, or urllib3's ValueError once the response is closed), and
    # there is nothing left to end.
    with contextlib.suppress(OSError, ValueError):
        if shutdown is not None:
            shutdown()
        else:
            response.close()


def list_objects(api_client: KubeClient, path: str) -> tuple[list[JsonObj], str]:
    """Every object at ``path`` (a collection) and the list's resourceVersion.

    Items get ``kind``/``apiVersion`` filled in from the list when absent (the
    API server leaves them out of list items).
    """
    items: list[JsonObj] = []
    version = list_in_chunks(api_client, path, 0, items.append)
    return items, version


def list_in_chunks(
    api_client: KubeClient, path: str, limit: int, each: Callable[[JsonObj], None]
) -> str:
    """``each(item)`` for every object at ``path``, read ``limit`` at a time (0: in one
    answer); returns the list's resourceVersion.

    Chunks (``limit`` and ``continue``, as client-go's reflector lists) keep one chunk
    decoded at a time instead of the whole list: the slices of a large cluster are tens
    of megabytes decoded. Every chunk is of the first one's snapshot; a token that
    expired meanwhile is an :class:`ApiError` with status 410 (list again).
    """
    token = ""
    while True:
        query = chunk_query(limit, token)
        with translate_api_errors(f"LIST {path}"):
            body = request_json(
                api_client, "GET", path, query=query, timeout_s=LIST_CHUNK_TIMEOUT_S
            )
        token, version = take_chunk(body, each)
        if not token:
            return version


LIST_CHUNK_TIMEOUT_S = 60.0


def chunk_query(limit: int, token: str) -> list[tuple[str, str]]:
    query = [("limit", str(limit))] if limit > 0 else []
    if token:
        query.append(("continue", token))
    return query


def take_chunk(body: JsonObj, each: Callable[[JsonObj], None]) -> tuple[str, str]:
    """``each(item)`` for the items of one chunk of a list, with ``kind``/``apiVersion``
    filled in from the list; returns (the continue token, the list's resourceVersion)."""
    kind = str(body.get("kind", ""))
    item_kind = kind[: -len("List")] if kind.endswith("List") else kind
    for raw in body.pop("items", None) or []:
        if isinstance(raw, dict):
            raw.setdefault("kind", item_kind)
            raw.setdefault("apiVersion", body.get("apiVersion", ""))
            each(raw)
    meta = body.get("metadata") or {}
    return str(meta.get("continue") or ""), str(meta.get("resourceVersion", ""))


def watch_events(
    api_client: KubeClient,
    path: str,
    resource_version: str,
    emit: Callable[[str, JsonObj], None],
    *,
    timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
    read_timeout_s: float = 30.0,
    canceller: WatchCanceller | None = None,
) -> None:
    """Watch ``path`` from ``resource_version``, calling ``emit(type, object)`` per event.

    Returns when the server ends the stream, when nothing arrived for
    ``read_timeout_s`` (the caller resumes from the last resourceVersion it
    saw) or when ``canceller`` is cancelled (at once, even while blocked). Raises
    :class:`WatchExpiredError` on a 410 ``ERROR`` event and :class:`ApiError`
    on other failures.
    """
    query = watch_query(resource_version, timeout_s)
    what = f"WATCH {path}"
    canceller = canceller or WatchCanceller()
    if canceller.cancelled:
        return
    with translate_api_errors(what):
        response = _open_stream(api_client, path, query, read_timeout_s)
    canceller.attach(response)
    try:
        with translate_api_errors(what):
            for line in _lines(response):
                if canceller.cancelled:
                    return
                event = decode_event(what, line)
                if event is not None:
                    emit(*event)
    except ApiError:
        if canceller.cancelled:
            return  # the cut stream of a cancelled watch, not a failure
        raise
    finally:
        canceller.attach(None)
        response.release_conn()


def watch_query(resource_version: str, timeout_s: int) -> list[tuple[str, str]]:
    return [
        ("watch", "true"),
        ("resourceVersion", resource_version),
        ("timeoutSeconds", str(timeout_s)),
        ("allowWatchBookmarks", "true"),
    ]


def decode_event(what: str, line: str | bytes) -> tuple[str, JsonObj] | None:
    """One line of a watch stream: (type, object); None for a blank line. Raises
    :class:`WatchExpiredError` for a 410 ``ERROR`` event, :class:`ApiError` for
    another ``ERROR`` event or a line that is not an event."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except ValueError as err:
        raise ApiError(f"{what}: bad event {truncate(repr(line))}") from err
    if not isinstance(event, dict):
        raise ApiError(f"{what}: bad event {truncate(repr(line))}")
    etype = str(event.get("type", ""))
    obj = event.get("object") or {}
    if etype == "ERROR":
        code = obj.get("code")
        message = f"{what}: {obj.get('message', 'watch error')}"
        if code == 410:
            raise WatchExpiredError(message, status=410)
        raise ApiError(message, status=code if isinstance(code, int) else None)
    return etype, obj


def _open_stream(
    api_client: KubeClient, path: str, query: list[tuple[str, str]], read_timeout_s: float
) -> urllib3.BaseHTTPResponse:
    response = open_request(
        api_client,
        "GET",
        path,
        query=query,
        timeout=urllib3.Timeout(connect=10.0, read=read_timeout_s),
    )
    if not 200 <= response.status <= 299:
        data = response.read()
        response.release_conn()
        raise api_exception(response.status, response.reason, data)
    return response


def _lines(response: urllib3.BaseHTTPResponse) -> Iterable[str]:
    """The stream's lines; a read timeout or a cut connection just ends it."""
    pending = b""
    try:
        for chunk in response.stream(amt=None, decode_content=True):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                yield line.decode("utf-8", errors="replace")
    except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
        return
    if pending.strip():
        yield pending.decode("utf-8", errors="replace")


MERGE_PATCH = "application/merge-patch+json"


def send_json(
    api_client: KubeClient,
    method: str,
    path: str,
    body: JsonObj | None = None,
    *,
    what: str | None = None,
    content_type: str = "application/json",
) -> JsonObj:
    """One write or read, translated: ``ApiError`` (``ApiConflictError`` on 409...)."""
    with translate_api_errors(what or f"{method} {path}"):
        return request_json(api_client, method, path, body=body, content_type=content_type)
