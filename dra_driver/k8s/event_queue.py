"""Events off the caller's path: a bounded queue, one sender, behind the writes that matter.

An Event is advice; the writes a caller waits on (the controller's claim writes, which
pods wait for) are not. So, as client-go's event broadcaster does:

* :meth:`EventQueue.post` never blocks and never waits: the Event is rate-limited
  (:meth:`~dra_driver.k8s.events.EventRecorder.should_send`: the same object, reason
  and message at most once per interval) and queued;
* the queue is bounded (:data:`DEFAULT_DEPTH`): an Event that finds it full is
  dropped, counted (``on_drop``, a metric) and logged (at most once per
  :data:`DROP_LOG_EVERY_S`, with the count since the last line);
* one sender (:meth:`EventQueue.run`, a task) writes them one after the other, each
  through the recorder (its aggregation of repeats, its 403 handling), in a thread of
  its own;
* it gives way to a :class:`WriteLane`: while writes of the lane are waiting or in
  flight the next Event waits, so that in a burst those writes land first and the
  Events after. It waits at most ``max_delay_s`` per Event, and not at all once the
  queue is three quarters full, so a lane that is never idle (a steady stream of
  claims) delays the Events without starving them into drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from dra_driver.k8s.events import NORMAL, InvolvedObject

log = logging.getLogger(__name__)

DEFAULT_DEPTH = 10_000
"""Events queued at most. client-go's broadcaster holds 1000, but its sender never waits
for other writes; this one waits for a burst's claim writes, so it must hold a burst's
Events: a 5,000-claim burst at 500 nodes (``hack/bench/controller.py``) queued them all,
about half a kilobyte each. An API server as slow as the fake one there takes about
four Events a second while a burst's claim writes are in flight: with 1000, three quarters
of that burst's Events were dropped."""
DEFAULT_MAX_DELAY_S = 5.0
"""The longest an Event gives way to the lane's writes."""
DROP_LOG_EVERY_S = 10.0


class Recorder(Protocol):
    """What the queue needs of :class:`~dra_driver.k8s.events.EventRecorder`."""

    @property
    def enabled(self) -> bool: ...

    def should_send(self, involved: InvolvedObject, reason: str, message: str) -> bool: ...

    async def send(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str = NORMAL
    ) -> None: ...


class WriteLane:
    """The writes Events give way to: a count of those waiting or in flight."""

    def __init__(self) -> None:
        self.busy = 0
        self._on_idle: list[Callable[[], None]] = []

    def listen(self, on_idle: Callable[[], None]) -> None:
        """``on_idle()`` each time the last write of the lane ends (on the loop)."""
        self._on_idle.append(on_idle)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One write, from before it waits for a thread until its answer."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            if self.busy == 0:
                for wake in self._on_idle:
                    wake()


@dataclass(frozen=True)
class _Queued:
    involved: InvolvedObject
    reason: str
    message: str
    event_type: str
    at: float
    """When it was queued (the queue's clock)."""


class EventQueue:
    """See the module docstring. ``recorder`` writes (its executor: the sender's thread)."""

    def __init__(
        self,
        recorder: Recorder,
        *,
        depth: int = DEFAULT_DEPTH,
        lane: WriteLane | None = None,
        max_delay_s: float = DEFAULT_MAX_DELAY_S,
        on_drop: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._recorder = recorder
        self._depth = max(1, depth)
        self._urgent_at = max(1, self._depth * 3 // 4)
        self._lane = lane
        self._max_delay_s = max_delay_s
        self._on_drop = on_drop
        self._clock = clock
        self._queue: deque[_Queued] = deque()
        self._sending = False
        self._flushing = False
        self._wake = asyncio.Event()
        """Set when the sender may have something to do: an Event queued, the lane idle,
        the queue past three quarters."""
        self._drained = asyncio.Event()
        self._drained.set()
        self.sent = 0
        """Events the sender has handed to the recorder (written, or failed and logged)."""
        self.dropped = 0
        self._dropped_unlogged = 0
        self._drop_logged_at: float | None = None
        if lane is not None:
            lane.listen(self._wake.set)

    def __len__(self) -> int:
        return len(self._queue)

    def post(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str = NORMAL
    ) -> bool:
        """Queue the Event unless rate-limited, refused (403 before) or the queue is full
        (then dropped: counted and logged). Never blocks; call on the event loop."""
        if not self._recorder.enabled:
            return False
        if not self._recorder.should_send(involved, reason, message):
            return False
        if len(self._queue) >= self._depth:
            self._drop(involved, reason)
            return False
        self._queue.append(_Queued(involved, reason, message, event_type, self._clock()))
        self._drained.clear()
        if len(self._queue) == 1 or len(self._queue) >= self._urgent_at:
            self._wake.set()
        return True

    async def run(self) -> None:
        """The sender: until cancelled, one Event at a time (see the module docstring)."""
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            await self._give_way(self._queue[0])
            item = self._queue.popleft()
            self._sending = True
            try:
                await self._recorder.send(item.involved, item.reason, item.message, item.event_type)
                self.sent += 1
            finally:
                self._sending = False
                if not self._queue:
                    self._drained.set()

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Send what is queued without giving way (shutting down), up to ``timeout_s``
        (the sender must be running); True when nothing is left."""
        self._flushing = True
        self._wake.set()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._drained.wait()
        finally:
            self._flushing = False
        left = len(self._queue) + (1 if self._sending else 0)
        if left:
            log.warning("%d Event(s) not sent within %.1fs of stopping", left, timeout_s)
        return not left

    async def _give_way(self, head: _Queued) -> None:
        """Until the lane is idle, the head has waited ``max_delay_s``, the queue is three
        quarters full or a flush began."""
        while (
            self._lane is not None
            and self._lane.busy
            and not self._flushing
            and len(self._queue) < self._urgent_at
        ):
            left = head.at + self._max_delay_s - self._clock()
            if left <= 0:
                return
            self._wake.clear()
            try:
                # Not wait_for: in 3.11 it loses a cancel that comes as the wait ends.
                async with asyncio.timeout(left):
                    await self._wake.wait()
            except TimeoutError:
                return

    def _drop(self, involved: InvolvedObject, reason: str) -> None:
        self.dropped += 1
        self._dropped_unlogged += 1
        self._on_drop()
        now = self._clock()
        if self._drop_logged_at is not None and now - self._drop_logged_at < DROP_LOG_EVERY_S:
            return
        log.warning(
            "dropped %d Event(s) (the latest %s on %s): %d queued, the most this queue holds; "
            "the API server is not taking Events as fast as they come",
            self._dropped_unlogged,
            reason,
            involved,
            len(self._queue),
        )
        self._dropped_unlogged = 0
        self._drop_logged_at = now
