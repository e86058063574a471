"""The order of allocation writes: a claim's allocation is written once every larger
claim started before it has had its allocation answered (or decided it has none).

The worker starts claims largest first (:mod:`.worker`); their writes are in flight
side by side. Without an order among the writes, a smaller claim's allocation could
land before a larger one's, and a larger claim whose write fails (a conflict) would be
decided again over the smaller ones' places: the burst would not be placed largest
first in what the API server holds. Claims of one size never wait on one another,
nor on a larger claim started after them (it arrived later: it was decided after them,
over their places).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

Rank = tuple[Hashable, ...]
"""A claim's size (:func:`~.reconcile.size_rank`): the smaller rank is the larger claim,
and claims of one rank are of one size."""


class Turns:
    """The claims started and not yet answered, by rank."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[Rank, asyncio.Event]] = {}
        self._started = 0

    def __len__(self) -> int:
        return len(self._open)

    def start(self, rank: Rank) -> Turn:
        """A claim of ``rank`` is started: its turn comes once every larger claim open
        now has left."""
        ahead = [done for other, done in self._open.values() if other < rank]
        token = self._started
        self._started += 1
        done = asyncio.Event()
        self._open[token] = (rank, done)
        return Turn(self, token, ahead)

    def _leave(self, token: int) -> None:
        _, done = self._open.pop(token)
        done.set()


class Turn:
    """One claim's place among the claims in flight: it leaves once, when its allocation
    is answered or it knows it writes none."""

    def __init__(self, turns: Turns, token: int, ahead: list[asyncio.Event]) -> None:
        self._turns = turns
        self._token = token
        self._ahead = ahead
        self._left = False

    def passed(self) -> bool:
        """Every larger claim started before it is done: :meth:`wait` would not wait."""
        return all(done.is_set() for done in self._ahead)

    async def wait(self) -> None:
        """Until every larger claim started before it is done."""
        for done in self._ahead:
            await done.wait()

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self._turns._leave(self._token)
