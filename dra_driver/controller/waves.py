"""A batch's claims in waves by size: each size's allocations are written once every
larger claim of the batch has had its allocation answered."""

from __future__ import annotations

import asyncio
from typing import Any


class Wave:
    """The claims of one size in a batch. Their allocations are written side by side,
    once every larger claim of the batch has had its allocation answered (or decided it
    has none): a burst is allocated largest first, as it was decided, in what the API
    server sees as well, while claims of a size never wait on one another."""

    def __init__(self, before: Wave | None, members: int) -> None:
        self.before = before
        self.left = members
        self.done = asyncio.Event()

    def leave(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.done.set()


def waves_of(ranks: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], Wave]:
    """One wave per size in a batch (``ranks`` sorted, largest first), each after the
    one before."""
    waves: dict[tuple[Any, ...], Wave] = {}
    before: Wave | None = None
    for rank in ranks:
        wave = waves.get(rank)
        if wave is None:
            wave = waves[rank] = Wave(before, 0)
            before = wave
        wave.left += 1
    return waves


class Turn:
    """One claim's membership of its wave: it leaves once, when its allocation is
    answered or it knows it writes none."""

    def __init__(self, wave: Wave) -> None:
        self.wave = wave
        self._left = False

    def passed(self) -> bool:
        """Every larger claim of the batch is done: :meth:`wait` would not wait."""
        return self.wave.before is None or self.wave.before.done.is_set()

    async def wait(self) -> None:
        """Until every larger claim of the batch is done."""
        if self.wave.before is not None:
            await self.wave.before.done.wait()

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self.wave.leave()
