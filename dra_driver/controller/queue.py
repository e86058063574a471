"""A coalescing work queue keyed by claim UID (like client-go's workqueue).

A key is in the queue at most once; a key added while a worker holds it is
queued again when the worker calls :meth:`WorkQueue.done`, so no two workers
ever hold the same key and no change is lost. :meth:`WorkQueue.add_after`
re-adds a key later (backoff, periodic retry of claims that do not fit yet).
"""

from __future__ import annotations

import asyncio
from collections import deque


class WorkQueue:
    def __init__(self) -> None:
        self._order: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._ready = asyncio.Condition()
        self._timers: dict[str, asyncio.TimerHandle] = {}

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
        asyncio.get_running_loop().create_task(self._notify())

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

    async def _notify(self) -> None:
        async with self._ready:
            self._ready.notify()

    async def get(self) -> str:
        async with self._ready:
            await self._ready.wait_for(lambda: bool(self._order))
            key = self._order.popleft()
            self._queued.discard(key)
            self._processing.add(key)
            return key

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
