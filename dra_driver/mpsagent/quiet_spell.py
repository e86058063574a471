"""When the agent's calls pause: the deferred namespace deletes wait for it (asyncio).

The plugin's calls come in waves (a node's pods start and stop together), and a
released share's ``namespace delete`` waits for a quiet spell, so its process does
not take the cores from the calls still waiting (:mod:`.agent`). Many deletes can
wait at once (a wave's worth, and every wave's while the calls keep coming): each
polling the clock would wake the event loop tens of times a second per delete,
in the middle of the very calls they wait out. Here they all wait on one future,
and one timer, armed only while someone waits and the calls have paused, resolves
it once the pause has lasted long enough.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class QuietSpell:
    """Calls running now and when the last one ended; :meth:`wait` returns once none
    has run for ``quiet_s``, or after ``max_wait_s`` at most."""

    def __init__(self, quiet_s: float, max_wait_s: float) -> None:
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self._running = 0
        self._last_end: float | None = None
        """When the last call ended (the loop's clock); None: none has run yet."""
        self._quiet: asyncio.Future[None] | None = None
        """Resolved at the next quiet spell; None while no one waits."""
        self._timer: asyncio.TimerHandle | None = None

    @property
    def running(self) -> int:
        return self._running

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around one call (an ensure or a release)."""
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            loop = asyncio.get_running_loop()
            self._last_end = loop.time()
            if not self._running and self._quiet is not None and self._timer is None:
                self._arm(loop)

    def is_quiet(self, now: float) -> bool:
        if self._running:
            return False
        return self._last_end is None or now >= self._last_end + self.quiet_s

    async def wait(self) -> None:
        """Until no call has run for ``quiet_s``, at most ``max_wait_s``."""
        loop = asyncio.get_running_loop()
        if self.is_quiet(loop.time()):
            return
        if self._quiet is None:
            self._quiet = loop.create_future()
        if self._timer is None and not self._running:
            self._arm(loop)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_wait_s):
                # Shielded: one waiter cancelled or timed out leaves the others' future.
                await asyncio.shield(self._quiet)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer, due when the pause since the last call's end reaches ``quiet_s``
        (a call running now arms it again when it ends)."""
        due = self._last_end + self.quiet_s if self._last_end is not None else loop.time()
        self._timer = loop.call_at(due, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        quiet = self._quiet
        if quiet is None or self._running:
            return
        if not self.is_quiet(loop.time()):  # a call came and went since it was armed
            self._arm(loop)
            return
        self._quiet = None
        if not quiet.done():
            quiet.set_result(None)
