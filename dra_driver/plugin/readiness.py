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

The endpoint is served by the standard library's WSGI server in daemon threads
(:mod:`dra_driver.observability.http_server`, the server the metrics use). Each
request asks the event loop for the verdict (the check runs on the loop, where the
state it reads is written) and waits at most :data:`LOOP_ANSWER_S`: a plugin whose
loop is stuck (or too busy to answer in that time) is unready, with that reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dra_driver.observability.http_server import HttpEndpoint, serve_http

log = logging.getLogger(__name__)

PATH = "/readyz"
LOOP_ANSWER_S = 2.0
"""How long a probe waits for the event loop to give the verdict; the chart's probe
waits 5 s (``kubeletPlugin.readinessProbe.timeoutSeconds``), so a stuck loop is
answered as such, not as a probe timeout."""


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
    """Serves ``check()`` at ``GET /readyz``: 200 when ready, else 503; the reason as
    text. ``check`` runs on the event loop that called :meth:`start`."""

    def __init__(self, check: Callable[[], Readiness]) -> None:
        self.check = check
        self._loop: asyncio.AbstractEventLoop | None = None
        self._endpoint: HttpEndpoint | None = None

    async def start(self, port: int, address: str = "0.0.0.0") -> None:
        """Listen on ``address:port`` (0: any free port, see :attr:`port`)."""
        self._loop = asyncio.get_running_loop()
        self._endpoint = serve_http(self._respond, port, address, "readiness")
        log.info("readiness at http://%s:%d%s", address, self.port, PATH)

    @property
    def port(self) -> int:
        assert self._endpoint is not None
        return self._endpoint.port

    async def close(self) -> None:
        if self._endpoint is not None:
            endpoint, self._endpoint = self._endpoint, None
            await asyncio.to_thread(endpoint.stop)

    def _respond(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """The WSGI application (in a request's thread)."""
        method, path = environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")
        headers = [("Content-Type", "text/plain; charset=utf-8")]
        if path != PATH:
            status, body = "404 Not Found", f"only {PATH} is served here\n"
        elif method not in ("GET", "HEAD"):
            status, body = "405 Method Not Allowed", "GET or HEAD\n"
            headers.append(("Allow", "GET, HEAD"))
        else:
            state = self._verdict()
            status = "200 OK" if state.ready else "503 Service Unavailable"
            body = ("ok: " if state.ready else "not ready: ") + state.reason + "\n"
        payload = body.encode()
        start_response(status, [*headers, ("Content-Length", str(len(payload)))])
        return [b""] if method == "HEAD" else [payload]

    def _verdict(self) -> Readiness:
        """``check()`` run on the loop, waited for at most :data:`LOOP_ANSWER_S`."""
        loop = self._loop
        assert loop is not None
        answer: concurrent.futures.Future[Readiness] = concurrent.futures.Future()

        def on_loop() -> None:
            if not answer.set_running_or_notify_cancel():
                return  # the probe gave up waiting
            try:
                answer.set_result(self.check())
            except Exception as err:  # the probe says so; the loop goes on
                answer.set_exception(err)

        try:
            loop.call_soon_threadsafe(on_loop)
        except RuntimeError:
            return Readiness(False, "shutting down: the event loop is closed")
        try:
            return answer.result(timeout=LOOP_ANSWER_S)
        except TimeoutError:
            answer.cancel()
            log.warning("readiness: the event loop did not answer in %.1fs", LOOP_ANSWER_S)
            return Readiness(
                False, f"the event loop did not answer in {LOOP_ANSWER_S:g}s (stuck or overloaded)"
            )
        except Exception as err:
            log.error("readiness check failed: %s", err, exc_info=err)
            return Readiness(False, f"the readiness check failed: {err}")
