"""The loop transport (:mod:`dra_driver.k8s.transport`, on aiohttp): against the fake
API server over HTTPS (its TLS, its token, its refusals), against a forward proxy, and
against small servers that answer the way a real server may (chunked, ``Connection:
close``, no length, a kept connection closed while idle, nothing at all)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from dra_driver.base.errors import ApiConflictError, ApiNotFoundError, ApiUnavailableError
from dra_driver.k8s.client import USER_AGENT, KubeClient
from dra_driver.k8s.official import Configuration
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport, target_of
from dra_driver.k8s.watch import MERGE_PATCH, WatchExpiredError
from dra_driver.k8s.watch_loop import list_in_chunks as list_on_loop
from dra_driver.k8s.watch_loop import watch_events as watch_on_loop
from tests.support.fakekube import FakeKubeApi
from tests.support.tls import SelfSigned

CLAIM = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _client(url: str, ca_file: str | None = None, token: str | None = None) -> KubeClient:
    configuration = Configuration(host=url)
    if ca_file is not None:
        configuration.ssl_ca_cert = ca_file
    if token is not None:
        configuration.api_key = {"authorization": f"Bearer {token}"}
    return KubeClient(configuration)


def _http(client: KubeClient, **kwargs: object) -> ApiTransport:
    http = ApiTransport.for_client(client, **kwargs)  # type: ignore[arg-type]
    assert http is not None
    return http


def test_patches_over_https_with_the_clients_token_and_tls(
    https_kube: FakeKubeApi, pair: SelfSigned
) -> None:
    http = _http(_client(https_kube.url, pair.cert, token="the-token"))

    async def scenario() -> list[str]:
        versions = []
        for value in ("a", "b", "c"):  # one kept connection, three requests
            answer = await http.send_json(
                "PATCH",
                CLAIM,
                {"metadata": {"annotations": {"x": value}}},
                content_type=MERGE_PATCH,
            )
            versions.append(answer["metadata"]["annotations"]["x"])
        await http.close()
        return versions

    assert asyncio.run(scenario()) == ["a", "b", "c"]
    patches = [r for r in https_kube.request_log if r.method == "PATCH"]
    assert len(patches) == 3
    assert all(r.authorization == "Bearer the-token" for r in patches)
    assert all(r.user_agent == USER_AGENT for r in patches)
    claim = https_kube.get("ResourceClaim", "c1", "default")
    assert claim["metadata"]["annotations"] == {"x": "c"}


def test_refusals_are_the_clients_errors(https_kube: FakeKubeApi, pair: SelfSigned) -> None:
    http = _http(_client(https_kube.url, pair.cert))

    async def scenario() -> None:
        stale = {"metadata": {"resourceVersion": "987654321", "annotations": {"x": "y"}}}
        with pytest.raises(ApiConflictError, match="409"):
            await http.send_json("PATCH", CLAIM, stale, content_type=MERGE_PATCH)
        with pytest.raises(ApiNotFoundError):
            await http.send_json("GET", CLAIM.replace("/c1", "/gone"))
        await http.close()

    asyncio.run(scenario())


def test_a_server_certificate_nobody_vouches_for_is_refused(https_kube: FakeKubeApi) -> None:
    http = _http(_client(https_kube.url))  # the system's CAs only

    async def scenario() -> None:
        with pytest.raises(ApiUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
            await http.send_json("GET", CLAIM)

    asyncio.run(scenario())


def test_configurations_it_does_not_speak_get_no_transport() -> None:
    socks = Configuration(host="https://127.0.0.1:6443")
    socks.proxy = "socks5://proxy:1080"
    assert target_of(socks) is None
    for setting, value in (
        ("assert_hostname", False),
        ("socket_options", []),
        ("retries", 5),
    ):
        configuration = Configuration(host="https://127.0.0.1:6443")
        setattr(configuration, setting, value)
        assert ApiTransport.for_client(KubeClient(configuration)) is None, setting
    assert ApiTransport.for_client(object()) is None


def test_the_configurations_proxy_unless_no_proxy_names_the_host() -> None:
    seen: list[bytes] = []
    proxy = _replying(b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"p":1}', seen)

    async def scenario() -> None:
        async with _server(proxy) as proxy_url:
            configuration = Configuration(host="http://api.example:8080/prefix")
            configuration.proxy = proxy_url
            configuration.proxy_headers = {"Proxy-Authorization": "Basic eDp5"}
            http = _http(KubeClient(configuration))
            assert await http.send_json("GET", "/api/v1/nodes", query=[("limit", "5")]) == {"p": 1}
            await http.close()

    asyncio.run(scenario())
    head = seen[0].decode()
    # The absolute form, to the proxy, as a forward proxy is asked.
    assert head.startswith("GET http://api.example:8080/prefix/api/v1/nodes?limit=5 HTTP/1.1")
    assert "Proxy-Authorization: Basic eDp5" in head

    bypassed = Configuration(host="https://api.example:6443")
    bypassed.proxy, bypassed.no_proxy = "http://proxy:3128", "other.example,.example"
    target = target_of(bypassed)
    assert target is not None
    assert target.proxy is None


# --- answers the fake does not give ------------------------------------------------------


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


def _replying(
    reply: bytes, seen: list[bytes] | None = None, *, keep_alive: bool = False
) -> Handler:
    """A server that answers a request with ``reply`` (every request of the connection
    with ``keep_alive``, else the first), keeping each request's head in ``seen``."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await _read_request(reader)
                if seen is not None:
                    seen.append(head)
                writer.write(reply)
                await writer.drain()
                if not keep_alive:
                    break
        writer.close()

    return handler


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server that reads a request and never answers (until the client gives up)."""
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        await _read_request(reader)
        await reader.read()
    writer.close()


def test_chunked_and_close_and_unframed_answers() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'4\r\n{"a"\r\n3;x=y\r\n:1}\r\n0\r\n\r\n',
        b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\n{"b":2}',
        b'HTTP/1.1 200 OK\r\n\r\n{"c":3}',  # no length: ends with the connection
    ]
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while answers:
                await _read_request(reader)
                answer = answers.pop(0)
                writer.write(answer)
                await writer.drain()
                if b"Transfer-Encoding" not in answer:
                    break  # close after this one
        writer.close()

    async def scenario() -> list[dict[str, int]]:
        async with _server(handler) as url:
            http = _http(_client(url))
            got = [await http.send_json("GET", "/x") for _ in range(3)]
            await http.close()
            return got

    assert asyncio.run(scenario()) == [{"a": 1}, {"b": 2}, {"c": 3}]
    assert connections == 2  # the chunked answer kept its connection; the close did not


def test_a_kept_connection_closed_while_idle_is_replaced() -> None:
    served = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await _read_request(reader)
            served += 1
            # Kept alive by its headers, then closed: as a server's idle timeout does.
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()
        writer.close()

    async def scenario() -> None:
        async with _server(handler) as url:
            http = _http(_client(url))
            assert await http.send_json("POST", "/x", {"n": 1}) == {}
            await asyncio.sleep(0.1)  # the server has closed the kept connection
            assert await http.send_json("POST", "/x", {"n": 2}) == {}
            await http.close()

    asyncio.run(scenario())
    assert served == 2


def test_no_answer_is_a_timeout_and_garbage_is_unavailable() -> None:
    garbage = _replying(b"SSH-2.0-OpenSSH\r\n\r\n")

    async def scenario() -> None:
        async with _server(_silent) as url:
            http = _http(_client(url))
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(ApiUnavailableError, match="TimeoutError"):
                await http.send_json("GET", "/x", timeout_s=0.3)
            assert loop.time() - started < 2
            await http.close()
        async with _server(garbage) as url:
            http = _http(_client(url))
            with pytest.raises(ApiUnavailableError, match="Bad status line"):
                await http.send_json("GET", "/x")
            await http.close()

    asyncio.run(scenario())


def test_requests_and_watches_ask_for_json_uncompressed() -> None:
    heads: list[bytes] = []
    handler = _replying(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", heads, keep_alive=True)

    async def scenario() -> None:
        async with _server(handler) as url:
            http = _http(_client(url))
            await http.send_json("PATCH", "/x", {"n": 1}, content_type=MERGE_PATCH)
            async for _ in http.lines("/w", [("watch", "true")], read_timeout_s=5):
                pass
            await http.close()

    asyncio.run(scenario())
    assert len(heads) == 2
    for head in heads:
        fields: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip().lower()
        assert fields[b"accept"] == b"application/json"
        assert fields[b"accept-encoding"] == b"identity"  # never gzip: parsed at once
    assert b"content-type: application/merge-patch+json" in heads[0].lower()


def test_a_callers_cancellation_is_not_a_timeout() -> None:
    async def scenario() -> None:
        async with _server(_silent) as url:
            http = _http(_client(url))
            request = asyncio.create_task(http.send_json("GET", "/x", timeout_s=0.3))
            await asyncio.sleep(0.1)
            request.cancel()
            with pytest.raises(asyncio.CancelledError):
                await request
            # The next request is bounded as before: its own bound, its own timeout.
            with pytest.raises(ApiUnavailableError, match="TimeoutError"):
                await http.send_json("GET", "/x", timeout_s=0.3)
            await http.close()

    asyncio.run(scenario())


def test_credentials_are_refreshed_off_the_loop(https_kube: FakeKubeApi, pair: SelfSigned) -> None:
    client = _client(https_kube.url, pair.cert, token="the-token")
    refreshed_in: list[threading.Thread] = []

    # The kubeconfig loader's hook may run an exec plugin (a process): never on the loop.
    def hook(_: object) -> None:
        refreshed_in.append(threading.current_thread())

    setattr(client.configuration, "refresh_api_key_hook", hook)  # noqa: B010 (typed None)
    http = _http(client)

    async def scenario() -> None:
        for _ in range(3):  # the first asks the configuration; the others reuse it
            await http.send_json("GET", CLAIM)
        await http.close()

    asyncio.run(scenario())
    assert len(refreshed_in) == 1
    assert refreshed_in[0] is not threading.main_thread()
    gets = [r for r in https_kube.request_log if r.method == "GET"]
    assert [r.authorization for r in gets] == ["Bearer the-token"] * 3


# --- watch streams on the loop (dra_driver/k8s/watch_loop.py) ----------------------------


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_watch_reads_events_split_anywhere_and_ends_when_quiet_or_cut() -> None:
    big = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "b" * 300_000}}})
    stream = (
        b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}\n'
        + big.encode()
        + b'\n\n{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}'
    )
    pieces = [stream[i : i + 7000] for i in range(0, len(stream), 7000)]
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            requests.append(await _read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(_chunk(piece))
                await writer.drain()
            if len(requests) == 1:
                writer.write(b"0\r\n\r\n")  # ended by the server
            elif len(requests) == 2:
                await reader.read()  # quiet until the reader gives up and hangs up
            else:
                writer.transport.abort()  # cut
                return
            await writer.drain()
        writer.close()

    async def scenario() -> list[tuple[float, list[tuple[str, str]]]]:
        runs = []
        async with _server(handler) as url:
            http = _http(_client(url))
            loop = asyncio.get_running_loop()
            for _ in range(3):
                seen: list[tuple[str, str]] = []

                def emit(etype: str, obj: JsonObj, seen: list[tuple[str, str]] = seen) -> None:
                    seen.append((etype, obj["metadata"].get("name", "")[:3]))

                started = loop.time()
                await watch_on_loop(http, "/api/v1/pods", "4", emit, read_timeout_s=0.5)
                runs.append((loop.time() - started, seen))
            await http.close()
        return runs

    (_, ended), (quiet_s, quiet), (_, cut) = asyncio.run(scenario())
    # Ended by the server: every event, the last one without its newline too. Quiet
    # (after the read timeout) or cut: the complete lines read before.
    assert ended == [("ADDED", "a"), ("ADDED", "bbb"), ("BOOKMARK", "")]
    assert quiet == cut == [("ADDED", "a"), ("ADDED", "bbb")]
    assert 0.4 < quiet_s < 3
    assert (
        b"watch=true&resourceVersion=4&timeoutSeconds=300&allowWatchBookmarks=true" in (requests[0])
    )


def _claim(name: str) -> JsonObj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": []}},
    }


def test_a_watch_refused_or_expired_raises(https_kube: FakeKubeApi, pair: SelfSigned) -> None:
    http = _http(_client(https_kube.url, pair.cert))

    async def scenario() -> None:
        with pytest.raises(ApiNotFoundError):
            await watch_on_loop(http, "/apis/nope.example/v1/things", "0", lambda t, o: None)
        https_kube.create(_claim("c2"))
        https_kube.compact()
        with pytest.raises(WatchExpiredError):
            await watch_on_loop(
                http, "/apis/resource.k8s.io/v1/resourceclaims", "1", lambda t, o: None
            )
        await http.close()

    asyncio.run(scenario())


def test_a_list_in_chunks_on_the_loop(https_kube: FakeKubeApi, pair: SelfSigned) -> None:
    for i in range(5):
        https_kube.create(_claim(f"x{i}"))
    http = _http(_client(https_kube.url, pair.cert))
    names: list[str] = []

    async def scenario() -> str:
        version = await list_on_loop(
            http,
            "/apis/resource.k8s.io/v1/resourceclaims",
            2,
            lambda o: names.append(f"{o['kind']}/{o['metadata']['name']}"),
        )
        await http.close()
        return version

    version = asyncio.run(scenario())
    assert version
    assert {f"ResourceClaim/x{i}" for i in range(5)} <= set(names)
    lists = [r for r in https_kube.request_log if r.method == "GET"]
    assert len(lists) >= 3  # in chunks of two
