"""The kubelet's calls in flight, so that work off the kubelet's path waits for a lull.

A ``status.devices`` write or an Event is written after the claim's answer, but
it runs in the same process: an HTTP request, JSON, a thread holding the GIL.
Sent while nine more claims of the same wave are still being prepared, it takes
their CPU and delays their answers (the kubelet starts a wave of pods at once).
:class:`CallActivity` counts the prepare and unprepare calls in progress;
:meth:`CallActivity.lull` returns once there are none, or after ``max_wait_s`` so
that a node that never rests still gets its status written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

DEFAULT_MAX_WAIT_S = 2.0
"""How long background work may wait for a lull. ``status.devices`` stays
current within twice this, however busy the node is: the engine tells the
claim reporter of a wave's claims after a lull, and the write waits for one."""


class CallActivity:
    def __init__(self, *, max_wait_s: float = DEFAULT_MAX_WAIT_S) -> None:
        self.max_wait_s = max_wait_s
        self._calls = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def calls(self) -> int:
        """Calls in flight now."""
        return self._calls

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around one kubelet call, from its arrival to its answer."""
        self._calls += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._calls -= 1
            if self._calls == 0:
                self._idle.set()

    async def lull(self) -> None:
        """Return when no call is in flight, or after ``max_wait_s`` at the latest."""
        if self._calls == 0:
            return
        # asyncio.timeout, not wait_for: 3.11's wait_for makes a task per wait.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_wait_s):
                await self._idle.wait()
