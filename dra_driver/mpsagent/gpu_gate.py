"""What may run at once on one GPU's MPS daemon, and on one share (asyncio, one loop).

A v3 daemon keeps each share in a namespace of its own, created, limited and
deleted by commands that name only that namespace (docs:mpsv3-interface
"Namespace"), so the shares of different claims can be prepared side by side:
they hold a GPU's gate *shared*. What changes the daemon itself holds it
*exclusive*, alone: its start with the recorded shares restored, an adoption, a
restart after it died, its stop. So a restart restores every share whose ensure
has finished (none is mid-command against the old daemon), and no ensure sends a
command to a daemon that is being started or stopped. A legacy daemon re-sends
every share's limits on each change, so its share operations hold the gate
exclusive too.

A waiting exclusive holder goes before the shared holders that come after it: a
stream of prepares cannot starve a daemon's restart.

One share's own operations (its ensure, its release) run one after another,
under :class:`ShareLocks`, taken before the gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class GpuGate:
    """A readers-writer gate preferring writers; release never waits (safe in a
    ``finally`` of a cancelled task)."""

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._exclusive_waiting = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def shared_holders(self) -> int:
        return self._shared

    @property
    def exclusive_held(self) -> bool:
        return self._exclusive

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _changed(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        while self._exclusive or self._exclusive_waiting:
            await self._changed()
        self._shared += 1
        try:
            yield
        finally:
            self._shared -= 1
            if self._shared == 0:
                self._wake()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        self._exclusive_waiting += 1
        try:
            while self._exclusive or self._shared:
                await self._changed()
        except BaseException:
            self._exclusive_waiting -= 1
            self._wake()  # shared holders waited behind this one
            raise
        self._exclusive_waiting -= 1
        self._exclusive = True
        try:
            yield
        finally:
            self._exclusive = False
            self._wake()


class ShareLocks:
    """One lock per key (a GPU and a share), kept only while someone holds or waits
    for it: a node prepares and releases many shares over its life."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, list[int]]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        entry = self._locks.get(key)
        if entry is None:
            entry = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = entry
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]
