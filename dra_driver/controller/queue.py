"""A coalescing work queue keyed by claim UID (like client-go's workqueue).

A key is in the queue at most once; a key added while a worker holds it is
queued again when the worker calls :meth:`WorkQueue.done`, so no two workers
ever hold the same key and no change is lost. :meth:`WorkQueue.add_after`
re-adds a key later (backoff, periodic retry of claims that do not fit yet).

:meth:`WorkQueue.get_batch` is the batching window: it waits until the oldest
queued key has been queued for the window, then hands out every queued key at
once (all held until their :meth:`~WorkQueue.done`), so the caller can order a
burst before working it. The window is counted from when the oldest key was
queued, not from the call: a key queued while the worker was busy does not wait
a second window, and keys queued during the window do not extend it. A caller that
is ``busy`` (claims of its own in flight) takes what is queued at once: those keys
wait behind its work anyway. A caller may also take the window's keys as soon as
``enough`` are queued (the worker: as many as it works at once, enough to keep it
busy; those that come after are sorted behind them). :meth:`WorkQueue.take_all`
takes what is queued without waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class WorkQueue:
    def __init__(self) -> None:
        self._order: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._nonempty = asyncio.Event()
        """Set when a key is queued; a getter that finds nothing clears it and waits."""
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._since: dict[str, float] = {}
        """Queued key -> loop time it was queued."""
        self._enough = 0
        """A getter waits for this many keys (0: none waits)."""
        self._filled = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: str) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._order.append(key)
        self._since[key] = asyncio.get_running_loop().time()
        self._nonempty.set()
        if 0 < self._enough <= len(self._order):
            self._filled.set()

    def add_after(self, key: str, delay_s: float) -> None:
        """Add ``key`` after ``delay_s``; a later call for the same key replaces the timer."""
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay_s, fire)

    async def _wait_for_keys(self) -> None:
        while not self._order:
            self._nonempty.clear()
            await self._nonempty.wait()

    async def get(self) -> str:
        await self._wait_for_keys()
        key = self._order.popleft()  # no await since the check: still there
        self._hold(key)
        return key

    async def get_batch(
        self,
        window_s: float,
        *,
        busy: Callable[[], bool] = lambda: False,
        enough: int = 0,
    ) -> list[str]:
        """Every key queued once the oldest has waited ``window_s``, in queue order; at
        once if ``busy()`` when a key is there, and as soon as ``enough`` keys (if more
        than 0) are queued. Each is held until :meth:`done`. ``window_s`` 0: the oldest
        key alone (:meth:`get`)."""
        if window_s <= 0:
            return [await self.get()]
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_for_keys()
            closes = self._since[self._order[0]] + window_s
            if closes > loop.time() and not busy() and not 0 < enough <= len(self._order):
                await self._wait_until(closes, enough)
            batch = self.take_all()  # empty if another worker took them meanwhile
            if batch:
                return batch

    async def _wait_until(self, closes: float, enough: int) -> None:
        """Until the loop time ``closes``, or until ``enough`` keys are queued."""
        loop = asyncio.get_running_loop()
        if enough <= 0:
            await asyncio.sleep(closes - loop.time())
            return
        self._enough = enough
        self._filled.clear()
        try:
            await asyncio.wait_for(self._filled.wait(), closes - loop.time())
        except TimeoutError:
            pass
        finally:
            self._enough = 0

    def take_all(self) -> list[str]:
        """Every key queued now, in queue order, without waiting; each is held until
        :meth:`done`."""
        batch = list(self._order)
        self._order.clear()
        for key in batch:
            self._hold(key)
        return batch

    def _hold(self, key: str) -> None:
        self._queued.discard(key)
        self._since.pop(key, None)
        self._processing.add(key)

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (timers not counted)."""
        return not self._queued and not self._processing

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
