"""API requests on the event loop, through aiohttp: raw JSON bytes in and out.

Why aiohttp itself and not ``kubernetes.aio`` (the official asyncio client, also on
aiohttp): the driver sends and reads the objects' JSON itself (:mod:`dra_driver.k8s.wire`,
:mod:`dra_driver.k8s.rest`), never the generated models, so what it needs from a client
is a connection pool that speaks HTTP/1.1 and TLS, and the official ``Configuration``
that the loaders already fill (host, CA, client certificate, token and its refresh,
proxy). Peak RSS measured on the development machine (Python 3.11.7, aiohttp 3.14.5,
kubernetes 37.0.2, ``ru_maxrss`` after the imports): a bare interpreter 10.6 MB;
``import aiohttp`` 33.7 MB; ``kubernetes.aio.client.rest`` 56.1 MB; the driver's
``dra_driver.k8s.official`` in a driver process 24.7 MB, and 36.2 MB with aiohttp beside
it (+11.5 MB; the controller's RSS at 50 nodes 59-60 -> 69-70 MB, docs/benchmarks.md
round 5, stated in the README). aiohttp is what kopf uses for every API call of its
daemons, and it ships with the ``kubernetes`` package's dependencies. Its price besides
memory is CPU: per merge PATCH of a claim over HTTPS (2,000 in a row, loaded machine),
1.16-1.23 ms of user CPU on Python 3.11 against 0.52-0.68 ms for the hand-written
HTTP/1.1 client it replaced (3.12: 1.12-1.28 against 0.68-0.88), about +2 ms per claim
for the controller (three requests a claim).

What a request costs here besides aiohttp's own (docs/benchmarks.md, round 5c): the
bound is one entry in :class:`~dra_driver.k8s.deadlines.Deadlines` (one timer per loop),
not ``asyncio.timeout`` per request; every header is named (``Accept-Encoding:
identity`` rather than the session's ``skip_auto_headers``, which aiohttp turns into a
table per request); the error translation runs only for a failed request; the URL is
built quoted (``encoded=True``); no cookie jar, tracing, redirects or decompression.
Per claim PATCH, 16 in flight: 415 -> 378 Python calls and 10 % less CPU on 3.11
(371 -> 334 calls, 11 % less CPU on 3.12); the hand-written client made 231. What is
left is aiohttp's (its request and response objects, the headers copied into its
multidicts twice, the pool, the body written from a task of its own on 3.11), about 140
calls a request.

What it takes from the official client's :class:`~dra_driver.k8s.client.KubeClient`:
the host (and its path prefix), the credentials' headers (asked per request, so a
rotated token is sent as the client would send it; in a thread when the client would
refresh them, which may run a kubeconfig's exec plugin), the TLS settings
(``verify_ssl``, ``ssl_ca_cert`` / ``ca_cert_data``, ``cert_file`` / ``key_file``,
``tls_server_name``) and the proxy (``proxy``, ``no_proxy``, ``proxy_headers``).
Configurations it does not speak (a SOCKS proxy, socket options, ``assert_hostname``,
custom retries; none of them set by the driver's own loaders) get None from
:meth:`ApiTransport.for_client`, and :func:`api_transport`, which every driver process
builds its transport with, refuses them at start by name: there is no other transport.

Connections are kept open between requests (aiohttp's pool; an idle one is closed
after :data:`KEEPALIVE_S`). A request whose connection the server closed before any
byte of an answer (a kept one it closed while idle) is sent once more: aiohttp does
that itself only for idempotent methods, and every write of the driver carries a
resourceVersion precondition or a fixed name, so a second copy of one that did land
is refused with a 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import ssl
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp
from yarl import URL

from dra_driver.base.errors import ConfigError
from dra_driver.k8s.deadlines import Deadlines
from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S, JsonObj, api_exception, json_object
from dra_driver.k8s.wire import encode_body

log = logging.getLogger(__name__)

KEEPALIVE_S = 30.0
"""How long an idle connection is kept (the API server's own idle timeout is 90 s)."""

DEFAULT_MAX_CONNECTIONS = 100
"""Connections open at once (aiohttp's default); a request past them waits for one."""

_ACCEPT = {"Accept": "application/json", "Accept-Encoding": "identity"}
"""Every request's. No gzip (as the client's transport): a LIST is parsed at once, and a
compressed answer costs the API server and us CPU per byte. Named here rather than
left out through the session's ``skip_auto_headers``, which makes aiohttp build and
merge a table of the skipped names on every request.
"""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes


@dataclass(frozen=True)
class Target:
    """Where and how to connect, from the official client's ``Configuration``."""

    base_url: str
    """Scheme, authority and the host's own path prefix, before every API path."""
    tls: ssl.SSLContext | None
    server_hostname: str | None
    """The name the server's certificate must carry (``tls_server_name``), if not the host's."""
    proxy: str | None = None
    proxy_headers: dict[str, str] | None = None


class ApiTransport:
    """Requests to one API server on the running event loop, through one aiohttp session.

    The session is made on the first request, on the loop that sends it (aiohttp binds
    a session to its loop); a request from another loop gets a session of its own.
    """

    def __init__(
        self,
        target: Target,
        headers: Callable[[], dict[str, str]],
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        fresh_headers: Callable[[], dict[str, str] | None] | None = None,
    ) -> None:
        """``headers()``: every request's headers (may block: asked in a thread unless
        ``fresh_headers()`` has them at once)."""
        self._target = target
        self._headers = headers
        self._fresh_headers = fresh_headers
        self._max_connections = max(1, max_connections)
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._deadlines: Deadlines | None = None
        """The bounds of the requests on the session's loop (made with the session)."""

    @classmethod
    def for_client(
        cls, api_client: Any, *, max_connections: int = DEFAULT_MAX_CONNECTIONS
    ) -> ApiTransport | None:
        """The loop transport for the official client's configuration; None where it
        does not speak that configuration (:func:`api_transport` refuses it by name)."""
        configuration = getattr(api_client, "configuration", None)
        auth_headers = getattr(api_client, "auth_headers", None)
        if configuration is None or auth_headers is None:
            return None
        target = target_of(configuration)
        if target is None:
            return None
        base = dict(getattr(api_client, "default_headers", {}) or {})
        fresh_auth = getattr(api_client, "fresh_auth_headers", None)

        def headers() -> dict[str, str]:
            return {**base, **auth_headers()}

        def fresh_headers() -> dict[str, str] | None:
            auth = fresh_auth() if fresh_auth is not None else None
            return None if auth is None else {**base, **auth}

        return cls(target, headers, max_connections=max_connections, fresh_headers=fresh_headers)

    async def send_json(
        self,
        method: str,
        path: str,
        body: JsonObj | None = None,
        *,
        query: Iterable[tuple[str, str]] = (),
        what: str | None = None,
        content_type: str = "application/json",
        timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> JsonObj:
        """One request, its answer parsed as a JSON object; raises ``ApiError``
        (``ApiConflictError`` on 409...: :func:`~dra_driver.k8s.errors.translate_api_errors`)."""
        payload = None if body is None else encode_body(body)
        try:
            answer = await self.request(
                method, path, payload, content_type, query=query, timeout_s=timeout_s
            )
            if not 200 <= answer.status <= 299:
                raise api_exception(answer.status, answer.reason, answer.body)
        except Exception:
            # Translated here rather than inside a ``with``: entering a context manager
            # on every request of the controller costs more than the request's own
            # header merge, and only a failed request needs it.
            with translate_api_errors(what or f"{method} {path}"):
                raise
            raise  # not reached: the context manager raised (translated or as it was)
        return json_object(what or f"{method} {path}", answer.body)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str = "application/json",
        *,
        query: Iterable[tuple[str, str]] = (),
        timeout_s: float | None = None,
    ) -> Answer:
        """One request and its whole answer, whatever its status; transport errors raise
        ``OSError`` (``ConnectionError``, ``TimeoutError``), aiohttp's own included.

        ``timeout_s`` bounds the whole of it (the credentials, connecting, the answer
        read to its end, a second try); None: no bound of its own.
        """
        session = self._session_now()
        assert self._deadlines is not None  # made with the session
        # One timer for every request on the loop (dra_driver.k8s.deadlines), not one
        # per request: asyncio.timeout here cost about 10 % of a claim write's CPU.
        with self._deadlines.within(timeout_s):
            return await self._send(method, path, body, content_type, query=query, session=session)

    async def _send(
        self,
        method: str,
        path: str,
        body: bytes | None,
        content_type: str,
        *,
        query: Iterable[tuple[str, str]],
        session: aiohttp.ClientSession,
    ) -> Answer:
        headers = {**(await self._headers_now()), **_ACCEPT}
        target = self._target
        if target.proxy_headers and target.tls is None:
            # Plain HTTP through a forward proxy: its headers go with the request, as
            # urllib3's ProxyManager sends them (aiohttp sends them only on a CONNECT).
            headers.update(target.proxy_headers)
        if body is not None:
            headers["Content-Type"] = content_type
        url = self._url(path, query)
        resent = False
        while True:  # ends: the second try raises what the first was forgiven
            try:
                async with session.request(
                    method,
                    url,
                    data=body,
                    headers=headers,
                    allow_redirects=False,  # the API server does not redirect API calls
                    proxy=target.proxy,
                    proxy_headers=target.proxy_headers,
                    server_hostname=target.server_hostname,
                ) as response:
                    data = await response.read()
                    return Answer(response.status, response.reason or "", data)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
                if resent or isinstance(err, aiohttp.ClientConnectorError):
                    raise _transport_error(err) from err
                log.debug("%s %s: %s before an answer; sent once more", method, path, err)
                resent = True  # closed before an answer (kept while idle): once more
            except aiohttp.ClientError as err:
                raise _transport_error(err) from err

    async def lines(
        self,
        path: str,
        query: Iterable[tuple[str, str]],
        *,
        read_timeout_s: float,
        connect_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> AsyncGenerator[bytes, None]:
        """A GET whose answer is read line by line as it arrives (a watch's events).

        A non-2xx answer raises ``ApiException``. The stream ends, without an error,
        when the server ends it, when nothing arrived for ``read_timeout_s`` or when
        the connection is cut (the caller resumes from what it saw); a cancelled
        reader closes the connection.
        """
        headers = {**(await self._headers_now()), **_ACCEPT}
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        target = self._target
        try:
            async with self._session_now().get(
                self._url(path, query),
                headers=headers,
                allow_redirects=False,
                proxy=target.proxy,
                proxy_headers=target.proxy_headers,
                server_hostname=target.server_hostname,
                timeout=timeout,
            ) as response:
                if not 200 <= response.status <= 299:
                    data = await response.read()
                    raise api_exception(response.status, response.reason, data)
                lines = LineSplitter()
                try:
                    async for chunk in response.content.iter_any():
                        for line in lines.feed(chunk):
                            yield line
                except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError):
                    return  # cut: the caller resumes
                except TimeoutError:
                    return  # quiet for read_timeout_s: the caller resumes
                rest = lines.rest()
                if rest:
                    yield rest
        except aiohttp.ClientError as err:
            raise _transport_error(err) from err

    async def close(self) -> None:
        """Close the kept connections (of the session on the running loop)."""
        session, self._session = self._session, None
        if session is not None and self._session_loop is asyncio.get_running_loop():
            if self._deadlines is not None:
                self._deadlines.close()
            await session.close()

    # --- helpers --------------------------------------------------------------------

    def _url(self, path: str, query: Iterable[tuple[str, str]]) -> URL:
        params = list(query)
        target = self._target.base_url + path + (f"?{urlencode(params)}" if params else "")
        return URL(target, encoded=True)  # quoted already: yarl need not parse it again

    def _session_now(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._session_loop is not loop:
            connector = aiohttp.TCPConnector(
                ssl=self._target.tls if self._target.tls is not None else True,
                limit=self._max_connections,
                keepalive_timeout=KEEPALIVE_S,
            )
            session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),  # each request has its own
                # The API server sets no cookies: no jar to match every request against.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,  # nothing compressed is asked for (_ACCEPT)
            )
            self._session, self._session_loop = session, loop
            self._deadlines = Deadlines(loop)  # a request on another loop keeps its own
        return session

    async def _headers_now(self) -> dict[str, str]:
        """The headers, in a thread when getting them may block the loop: refreshing
        the credentials may run a kubeconfig's exec plugin (a process) or read a file."""
        if self._fresh_headers is not None:
            fresh = self._fresh_headers()
            if fresh is not None:
                return fresh
            return await asyncio.to_thread(self._headers)
        return self._headers()


class LineSplitter:
    """Lines out of a byte stream that arrives in pieces of any size (an event of a
    large object spans many pieces; kept as a list, joined once, not copied per piece)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._parts.append(chunk[start:end])
            lines.append(b"".join(self._parts))
            self._parts.clear()
            start = end + 1
        if start < len(chunk):
            self._parts.append(chunk[start:])
        return lines

    def rest(self) -> bytes:
        """What came after the last newline (a stream that ended without one)."""
        rest = b"".join(self._parts)
        self._parts.clear()
        return rest


def _transport_error(err: aiohttp.ClientError) -> OSError:
    """aiohttp's error as the ``OSError`` that :func:`translate_api_errors` reports as
    unavailable (some of aiohttp's, such as a server that hung up, are not ``OSError``)."""
    if isinstance(err, OSError):
        return err
    return ConnectionError(f"{type(err).__name__}: {err}")


def target_of(configuration: Any) -> Target | None:
    """Where and how to connect, from the official client's ``Configuration``; None
    for a setting this transport does not speak (:func:`unsupported_setting` names it)."""
    if unsupported_setting(configuration) is not None:
        return None
    url = urlsplit(str(configuration.host))
    assert url.hostname is not None  # unsupported_setting refuses a URL without one
    proxy = _proxy_for(configuration, url.netloc, url.hostname)
    https = url.scheme == "https"
    return Target(
        base_url=f"{url.scheme}://{url.netloc}{url.path.rstrip('/')}",
        tls=_tls_context(configuration) if https else None,
        server_hostname=(getattr(configuration, "tls_server_name", None) or None)
        if https
        else None,
        proxy=proxy,
        proxy_headers=dict(getattr(configuration, "proxy_headers", None) or {}) or None,
    )


def _proxy_for(configuration: Any, netloc: str, hostname: str) -> str | None:
    """The configuration's proxy unless ``no_proxy`` lets the host bypass it."""
    proxy = getattr(configuration, "proxy", None) or None
    no_proxy = getattr(configuration, "no_proxy", None) or ""
    if proxy is None or bypasses_proxy(netloc, hostname, no_proxy):
        return None
    return str(proxy)


def bypasses_proxy(netloc: str, hostname: str, no_proxy: str) -> bool:
    """Whether a ``no_proxy`` list (comma-separated) names the host: ``*``; the host or
    a domain above it (``example.com``, ``.example.com``), with or without its port;
    for an IP address, an address or a network (``10.0.0.0/8``)."""
    host, authority = hostname.lower(), netloc.lower()
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for raw in no_proxy.lower().split(","):
        entry = raw.strip()
        if entry == "*":
            return True
        if not entry:
            continue
        if address is not None:
            with contextlib.suppress(ValueError):
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
        domain = entry.lstrip(".")
        if any(name == domain or name.endswith("." + domain) for name in (host, authority)):
            return True
    return False


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


def unsupported_setting(configuration: Any) -> str | None:
    """What in the official client's ``Configuration`` this transport does not speak,
    named with what to do instead (for a message that refuses to start); None: it
    speaks all of it. None of these is set by the driver's own loaders from a
    kubeconfig or a ServiceAccount, but a proxy may come from the environment."""
    for setting, instead in (
        ("socket_options", "leave it unset"),
        ("assert_hostname", "name the server's certificate with tls_server_name instead"),
        ("retries", "leave it unset (the driver retries its own requests)"),
        ("proxy_ssl_context", "leave it unset"),
    ):
        if getattr(configuration, setting, None) is not None:
            return f"Configuration.{setting} is set: {instead}"
    host = str(getattr(configuration, "host", "") or "")
    url = urlsplit(host)
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"the API server's URL {host!r} is not http(s)://HOST[:PORT][/PATH]"
    proxy = _proxy_for(configuration, url.netloc, url.hostname)
    if proxy is not None and urlsplit(proxy).scheme not in ("http", "https"):
        return (
            f"the proxy {proxy!r} is not an HTTP(S) proxy (SOCKS is not spoken): set the "
            "kubeconfig's proxy-url, or HTTPS_PROXY/HTTP_PROXY, to an http:// or https:// "
            "proxy, or name the API server in NO_PROXY"
        )
    return None


def api_transport(
    api_client: Any, *, max_connections: int = DEFAULT_MAX_CONNECTIONS
) -> ApiTransport:
    """The loop transport for the official client's configuration: every API request
    of a driver process goes through it. Raises :class:`ConfigError` naming the setting
    it does not speak (there is no other transport to fall back to)."""
    configuration = getattr(api_client, "configuration", None)
    why = unsupported_setting(configuration) if configuration is not None else None
    transport = (
        None if why else ApiTransport.for_client(api_client, max_connections=max_connections)
    )
    if transport is None:
        raise ConfigError(
            "cannot reach the API server with this Kubernetes configuration: "
            f"{why or 'it has no host or credentials'}"
        )
    return transport
