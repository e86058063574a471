"""JSON requests to the API server on the event loop: HTTP/1.1 over asyncio streams.

The controller's claim writes go here instead of through the official client's
urllib3 transport in a thread. Per merge PATCH of a claim over HTTPS against the fake
API server in another process (``hack/bench/controller.py``'s machine, 2,000 in a
row): 467 us of user CPU and 347 us of system CPU through urllib3 in a thread, 113 and
163 us here; and no thread hand-off, so no wake of the loop, per claim.

What it takes from the official client's :class:`~dra_driver.k8s.client.KubeClient`:
the host (and its path prefix), the credentials' headers (asked per request, so a
rotated token is sent as the client would send it; in a thread when the client would
refresh them, which may run a kubeconfig's exec plugin) and the TLS settings
(``verify_ssl``, ``ssl_ca_cert`` / ``ca_cert_data``, ``cert_file`` / ``key_file``,
``tls_server_name``). Configurations it does not speak (a proxy, socket options,
``assert_hostname``, custom retries) get None from :meth:`LoopHttp.for_client`, and
the caller keeps the client's own transport.

Answers: a status line, headers, then a body of ``Content-Length`` bytes, chunked
(``Transfer-Encoding: chunked``, as the Go server sends a body larger than its
buffer) or up to the end of the connection. Connections are kept open between
requests (at most ``max_idle`` idle); one that the server closed while idle is
noticed on the next request, before any byte of an answer, and that request is sent
once more on a new connection (every write here carries a resourceVersion
precondition, so a second copy of one that did land is refused with a 409).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S, JsonObj, api_exception, json_object
from dra_driver.k8s.wire import encode_body

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
"""An answer's status line and headers (the API server's are a few hundred bytes)."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes


@dataclass(frozen=True)
class _Endpoint:
    host: str
    port: int
    tls: ssl.SSLContext | None
    server_hostname: str | None
    authority: str
    """The ``Host`` header."""
    path_prefix: str


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class LoopHttp:
    """Keep-alive HTTP/1.1 connections to one API server, used from the event loop."""

    def __init__(
        self,
        endpoint: _Endpoint,
        headers: Callable[[], dict[str, str]],
        *,
        max_idle: int = 16,
        fresh_headers: Callable[[], dict[str, str] | None] | None = None,
    ) -> None:
        """``headers()``: every request's headers (may block: asked in a thread unless
        ``fresh_headers()`` has them at once)."""
        self._endpoint = endpoint
        self._headers = headers
        self._fresh_headers = fresh_headers
        self._idle: deque[_Connection] = deque()
        self._max_idle = max(1, max_idle)

    @classmethod
    def for_client(cls, api_client: Any, *, max_idle: int = 16) -> LoopHttp | None:
        """The loop transport for the official client's configuration; None where it
        does not speak that configuration (the caller keeps the client's transport)."""
        configuration = getattr(api_client, "configuration", None)
        auth_headers = getattr(api_client, "auth_headers", None)
        if configuration is None or auth_headers is None:
            return None
        endpoint = _endpoint_of(configuration)
        if endpoint is None:
            return None
        base = dict(getattr(api_client, "default_headers", {}) or {})
        fresh_auth = getattr(api_client, "fresh_auth_headers", None)

        def headers() -> dict[str, str]:
            return {**base, **auth_headers()}

        def fresh_headers() -> dict[str, str] | None:
            auth = fresh_auth() if fresh_auth is not None else None
            return None if auth is None else {**base, **auth}

        return cls(endpoint, headers, max_idle=max_idle, fresh_headers=fresh_headers)

    async def send_json(
        self,
        method: str,
        path: str,
        body: JsonObj | None = None,
        *,
        what: str | None = None,
        content_type: str = "application/json",
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> JsonObj:
        """One request, its answer parsed as a JSON object; raises ``ApiError`` as
        :func:`~dra_driver.k8s.watch.send_json` does (``ApiConflictError`` on 409...)."""
        what = what or f"{method} {path}"
        payload = None if body is None else encode_body(body)
        with translate_api_errors(what):
            async with asyncio.timeout(timeout_s):
                answer = await self.request(method, path, payload, content_type)
            if not 200 <= answer.status <= 299:
                raise api_exception(answer.status, answer.reason, answer.body)
        return json_object(what, answer.body)

    async def request(
        self, method: str, path: str, body: bytes | None, content_type: str
    ) -> Answer:
        """One request on a kept connection (or a new one); transport errors raise
        ``OSError`` (``ConnectionError``, ``TimeoutError``, ``ssl.SSLError``)."""
        head = self._head(method, path, body, content_type, await self._headers_now())
        while True:  # ends: a new connection never raises _ClosedWhileIdle
            reused = bool(self._idle)
            conn = self._idle.pop() if reused else await self._open()
            try:
                answer, keep = await self._exchange(conn, head, body, reused=reused)
            except _ClosedWhileIdle:
                conn.close()
                continue  # the server closed it meanwhile: send it again on another
            except BaseException:
                conn.close()
                raise
            self._give_back(conn, keep)
            return answer

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    # --- the wire ------------------------------------------------------------------

    async def _headers_now(self) -> dict[str, str]:
        """The headers, in a thread when getting them may block the loop: refreshing
        the credentials may run a kubeconfig's exec plugin (a process) or read a file."""
        if self._fresh_headers is not None:
            fresh = self._fresh_headers()
            if fresh is not None:
                return fresh
            return await asyncio.to_thread(self._headers)
        return self._headers()

    def _head(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str,
        headers: dict[str, str],
    ) -> bytes:
        end = self._endpoint
        lines = [f"{method} {end.path_prefix}{path} HTTP/1.1", f"Host: {end.authority}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append("Accept: application/json")
        if body is not None:
            lines += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def _open(self) -> _Connection:
        end = self._endpoint
        reader, writer = await asyncio.open_connection(
            end.host,
            end.port,
            ssl=end.tls,
            server_hostname=end.server_hostname if end.tls is not None else None,
            limit=MAX_HEAD_BYTES,
        )
        return _Connection(reader, writer)

    def _give_back(self, conn: _Connection, keep: bool) -> None:
        if keep and len(self._idle) < self._max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    async def _exchange(
        self, conn: _Connection, head: bytes, body: bytes | None, *, reused: bool
    ) -> tuple[Answer, bool]:
        """Send one request and read its answer: (the answer, keep the connection)."""
        try:
            conn.writer.write(head + body if body is not None else head)
            await conn.writer.drain()
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as err:
            if reused and not err.partial:
                raise _ClosedWhileIdle from err
            raise ConnectionResetError("the API server closed the connection") from err
        except (ConnectionResetError, BrokenPipeError) as err:
            if reused:
                raise _ClosedWhileIdle from err
            raise
        except asyncio.LimitOverrunError as err:
            raise ConnectionError("the answer's headers are too long") from err
        status, reason, headers, version = _parse_head(raw)
        try:
            data = b"" if status in _NO_BODY else await _read_body(conn.reader, headers)
        except asyncio.IncompleteReadError as err:
            raise ConnectionResetError("the answer ended early") from err
        close = "close" in headers.get("connection", "").lower() or version == "HTTP/1.0"
        framed = status in _NO_BODY or "content-length" in headers or _chunked(headers)
        keep = not close and framed
        return Answer(status, reason, data), keep


_NO_BODY = frozenset({204, 304})
"""Answers that never carry a body (RFC 9110)."""


class _ClosedWhileIdle(Exception):
    """A kept connection was closed by the server before this request's answer began."""


def _parse_head(raw: bytes) -> tuple[int, str, dict[str, str], str]:
    text = raw.decode("latin-1")
    status_line, _, rest = text.partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in rest.split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ConnectionError(f"malformed header line in the answer: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers, parts[0]


def _chunked(headers: dict[str, str]) -> bool:
    return "chunked" in headers.get("transfer-encoding", "").lower()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if _chunked(headers):
        chunks: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError as err:
                raise ConnectionError(f"malformed chunk size {size_line[:40]!r}") from err
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError as err:
            raise ConnectionError(
                f"malformed Content-Length {headers['content-length']!r}"
            ) from err
        return await reader.readexactly(length)
    return await reader.read()  # no length: the answer ends with the connection


def _endpoint_of(configuration: Any) -> _Endpoint | None:
    """Where and how to connect, from the official client's ``Configuration``; None
    for settings this transport leaves to the client's own."""
    if (
        getattr(configuration, "proxy", None)
        or getattr(configuration, "socket_options", None) is not None
        or getattr(configuration, "assert_hostname", None) is not None
        or getattr(configuration, "retries", None) is not None
    ):
        return None
    url = urlsplit(str(configuration.host))
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    tls = _tls_context(configuration) if url.scheme == "https" else None
    port = url.port or (443 if url.scheme == "https" else 80)
    server_hostname = getattr(configuration, "tls_server_name", None) or url.hostname
    return _Endpoint(
        host=url.hostname,
        port=port,
        tls=tls,
        server_hostname=server_hostname,
        authority=url.netloc,
        path_prefix=url.path.rstrip("/"),
    )


def _tls_context(configuration: Any) -> ssl.SSLContext:
    """The TLS the client's pool would use: the CA (file or data), the client's
    certificate, and verification unless ``verify_ssl`` is off."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # hostname checked, cert required
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not getattr(configuration, "verify_ssl", True):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    ca_file = getattr(configuration, "ssl_ca_cert", None)
    ca_data = getattr(configuration, "ca_cert_data", None)
    if ca_file or ca_data:  # as urllib3: the CA given, else the system's
        context.load_verify_locations(cafile=ca_file or None, cadata=ca_data or None)
    else:
        context.load_default_certs()
    cert_file = getattr(configuration, "cert_file", None)
    if cert_file:
        context.load_cert_chain(cert_file, getattr(configuration, "key_file", None) or None)
    return context
