"""Bounds on many short awaits of one event loop, kept by one timer.

What ``asyncio.timeout`` does for one await, for every API request of a process: a
task inside ``with deadlines.within(seconds):`` still there after ``seconds`` is
cancelled, and the cancellation leaves the block as ``TimeoutError``; a cancellation of
the task from elsewhere stays a ``CancelledError``, as with ``asyncio.timeout``.

Why not ``asyncio.timeout`` (or aiohttp's own total timeout) per request: each makes a
timer handle and cancels it when the request is answered, and a cancelled handle stays
in the loop's heap until it is due or the loop rebuilds the heap, ordered by Python
comparisons. Per claim PATCH through aiohttp (16 in flight, Python 3.11) that was
about 40 of the request's 410 Python calls and 10 % of its CPU. Here a request's bound
is an entry in a set; one timer, set for the earliest bound, cancels the tasks past
theirs and is set again for the earliest left. Requests that all have the same bound,
answered before it, wake that timer about once per bound, whatever their number.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any


class Deadlines:
    """The bounds in force on one event loop (make it, and use it, on that loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._live: set[Bound] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def within(self, seconds: float | None) -> Bound:
        """A ``with`` block that the running task must leave within ``seconds`` (None:
        no bound, for callers whose bound is optional)."""
        return Bound(self, seconds)

    def close(self) -> None:
        """Stop the timer; the bounds still open are no longer enforced."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        self._live.clear()

    def _enter(self, bound: Bound) -> None:
        self._live.add(bound)
        if bound.due < self._timer_at:  # rare: only a bound shorter than those in force
            self._arm(bound.due)

    def _leave(self, bound: Bound) -> None:
        # The timer stays: it finds nothing due when it fires, and is set for the
        # earliest bound left (one wake-up, not a cancelled handle per request).
        self._live.discard(bound)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(at, self._expire), at

    def _expire(self) -> None:
        # Every bound up to the time the timer was set for is due, even if the loop
        # runs it a moment early (it runs handles within its clock's resolution).
        limit = max(self._timer_at, self._loop.time())
        self._timer, self._timer_at = None, math.inf
        earliest = math.inf
        for bound in list(self._live):
            if bound.due <= limit:
                self._live.discard(bound)
                bound.expire()
            else:
                earliest = min(earliest, bound.due)
        if earliest < math.inf:
            self._arm(earliest)


class Bound:
    """One ``with`` block's bound; see :class:`Deadlines`. Not reusable."""

    __slots__ = ("_cancelling", "_deadlines", "_expired", "_seconds", "_task", "due")

    def __init__(self, deadlines: Deadlines, seconds: float | None) -> None:
        self._deadlines = deadlines
        self._seconds = seconds
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._expired = False
        self.due = math.inf

    def __enter__(self) -> Bound:
        if self._seconds is None:
            return self
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline bounds a task: use it inside one")
        self._task, self._cancelling = task, task.cancelling()
        self.due = self._deadlines._loop.time() + self._seconds
        self._deadlines._enter(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, _: object
    ) -> None:
        self._deadlines._leave(self)
        if not self._expired:
            return
        assert self._task is not None
        # As asyncio.timeout: the cancellation was ours alone unless someone else's is
        # still counted; ours becomes TimeoutError, theirs stays a CancelledError.
        if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError(f"not done within {self._seconds} s") from exc

    def expire(self) -> None:
        """Cancel the task inside the block (called by :class:`Deadlines` when due)."""
        if self._task is not None and not self._expired:
            self._expired = True
            self._task.cancel()
