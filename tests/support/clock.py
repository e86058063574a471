"""A clock the test sets: ``Clock()`` is called like ``time.monotonic`` and returns
``now``, which the test moves by hand (``clock.now += 61``), so rate limits, retries
and intervals are tested by events, not by sleeping. :func:`run_in_virtual_time` does
the same for code that waits on the event loop's own clock (``asyncio.sleep``,
``asyncio.timeout``)."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

from tests.support.leaks import pending_tasks

T = TypeVar("T")

STUCK_AFTER_S = 10.0
"""Real seconds a :class:`VirtualTimeLoop` with nothing scheduled waits for I/O."""


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock of its own that jumps: when nothing is ready and no
    I/O has arrived, it moves :attr:`now` to the next timer instead of waiting for it.
    So ``asyncio.sleep``, ``asyncio.timeout`` and ``call_later`` take no wall time,
    and a test reads how long (virtual seconds) a wait took from ``loop.time()``.
    For coroutines that wait on timers and events only: a thread or a process gets
    no virtual time to finish in before a timer fires."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(selector=_JumpingSelector(self))

    def time(self) -> float:
        return self.now


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # No timer at all: only I/O (a thread's wake-up) can come, so wait for it
            # for real, but not forever: a scenario waiting on nothing fails, not hangs.
            ready = super().select(STUCK_AFTER_S)
            if not ready:
                raise RuntimeError(
                    f"the virtual-time loop has no timer and no I/O for {STUCK_AFTER_S:g} s: "
                    "the scenario waits on something that never happens"
                )
            return ready
        ready = super().select(0)
        if not ready and timeout > 0:
            self._loop.now += timeout
        return ready


def run_in_virtual_time(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a :class:`VirtualTimeLoop`, failing the test if ``main``
    leaves a task pending (:func:`tests.support.leaks.pending_tasks`)."""

    async def checked() -> T:
        result = await main
        leaked = await pending_tasks()
        assert not leaked, f"leaked asyncio tasks: {leaked}"
        return result

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(checked())
