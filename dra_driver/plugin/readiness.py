"""Whether the kubelet plugin can do its job: ``GET /readyz`` on ``--readiness-port``.

Ready means both:

* the kubelet registered the plugin (``NotifyRegistrationStatus`` said so), so it
  can be asked to prepare claims;
* this node's ResourceSlices are published: the last publish succeeded (without
  them the scheduler has nothing to allocate from this node). A plugin that
  publishes no slices (the demo, tests without an API) needs only the first.

Until both hold, and again while publishes fail (the API server unreachable, a
write refused), ``/readyz`` answers 503 with why, so ``helm install --wait`` and
rollouts wait for a plugin that works instead of one whose sockets merely
answer. A republish in progress (after a kubelet registration, a health change)
keeps the plugin ready: the last publish succeeded, and the slices it wrote
stand until a publish fails.

Liveness is not this: the chart's liveness probe dials the plugin's own sockets
(cheap, no API call), so an API outage makes the plugin unready, never
restarted.

The endpoint is a minimal HTTP/1.1 responder on the event loop, which is all
the kubelet's ``httpGet`` probe needs: a plugin whose loop is stuck does not
answer, and is unready too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

PATH = "/readyz"
REQUEST_TIMEOUT_S = 5.0
"""How long a connection may take to send its request head."""
MAX_REQUEST_BYTES = 8192


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    """Why (not) ready, in words: the probe's response body."""


def check_readiness(
    *,
    started: bool,
    registered: bool,
    registration_error: str | None,
    publishes: bool,
    published_generation: int | None,
    publish_failing: str | None,
) -> Readiness:
    """Readiness from what the plugin knows (pure; see the module docstring).

    ``published_generation``: the pool generation of the last successful
    publish (None: none yet); ``publish_failing``: why the publishes since then
    failed (None: the last one succeeded or none finished yet).
    """
    if not started:
        why_not = "starting: GPU discovery and start-up reconciliation"
    elif not registered:
        why_not = (
            f"the kubelet rejected the registration: {registration_error}"
            if registration_error
            else "not registered with the kubelet yet"
        )
    elif not publishes:
        return Readiness(True, "registered with the kubelet")
    elif publish_failing is not None:
        why_not = f"ResourceSlices cannot be published: {publish_failing}"
    elif published_generation is None:
        why_not = "registered with the kubelet; ResourceSlices not published yet"
    else:
        return Readiness(
            True,
            f"registered with the kubelet; ResourceSlices published (pool generation "
            f"{published_generation})",
        )
    return Readiness(False, why_not)


class ReadinessServer:
    """Serves ``check()`` at ``GET /readyz``: 200 when ready, else 503; the reason as text."""

    def __init__(self, check: Callable[[], Readiness]) -> None:
        self.check = check
        self._server: asyncio.Server | None = None

    async def start(self, port: int, address: str = "0.0.0.0") -> None:
        """Listen on ``address:port`` (0: any free port, see :attr:`port`)."""
        self._server = await asyncio.start_server(
            self._serve, address, port, limit=MAX_REQUEST_BYTES
        )
        log.info("readiness at http://%s:%d%s", address, self.port, PATH)

    @property
    def port(self) -> int:
        assert self._server is not None and self._server.sockets
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), timeout=REQUEST_TIMEOUT_S
                )
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            method, path = _request_line(head)
            if path is None:
                status, body = "400 Bad Request", "bad request\n"
            elif path != PATH:
                status, body = "404 Not Found", f"only {PATH} is served here\n"
            elif method not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", "GET or HEAD\n"
            else:
                state = self.check()
                status = "200 OK" if state.ready else "503 Service Unavailable"
                body = ("ok: " if state.ready else "not ready: ") + state.reason + "\n"
            payload = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            )
            if method != "HEAD":
                writer.write(payload)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _request_line(head: bytes) -> tuple[str, str | None]:
    """(method, path without the query) of an HTTP request head; path None: malformed."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return "", None
    return parts[0], parts[1].split("?", 1)[0]
