"""The leader's worker loop: start the largest claim ready next, up to a bound of claims
at once.

Claims taken from the queue are kept in a heap by placement order (largest first,
:func:`~.reconcile.placement_key`). Each time a write slot is free, the worker takes in
what the queue holds and starts the first claim of the heap: while claims arrive faster
than they are decided, a larger claim that arrives later is still placed before the
smaller ones waiting, so a burst is packed as best fit packs it sorted, however many
reads of the queue it spans. The batching window applies only when nothing is in
flight and nothing waits: the first claim of a burst waits the window, so that the
claims arriving with it are sorted together, but no longer than until as many claims
are queued as the worker works at once (enough to keep every write slot busy: those
that come after are sorted behind them in the heap); a claim that comes while others
are worked waits for no window (the wait behind them sorts it).

Each claim is started in order (its decision is taken at its start, before any later
claim's) and holds a write slot until its own writes are done
(:meth:`ClaimSlot.written`) or it ends; its Event is queued, written later by the
Events' sender (:mod:`dra_driver.k8s.event_queue`). A claim's :class:`~.turns.Turn`
orders its allocation write after every larger claim's started before it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.turns import Rank, Turn, Turns

log = logging.getLogger(__name__)

__all__ = ["ClaimSlot", "Order", "Rank", "WorkClaim", "work_claims"]


class ClaimSlot:
    """One claim's place while it is worked: its turn and its write slot."""

    def __init__(self, turn: Turn, release: Callable[[], None]) -> None:
        self._turn = turn
        self._release = release
        self._released = False

    def pass_turn(self) -> None:
        """It writes no allocation: the smaller claims after it may go on."""
        self._turn.leave()

    def turn_passed(self) -> bool:
        """Its allocation may be written now (:meth:`wait_turn` would not wait)."""
        return self._turn.passed()

    async def wait_turn(self) -> None:
        """Until every larger claim started before it has had its allocation answered."""
        await self._turn.wait()

    def written(self) -> None:
        """Its own writes are done: the next claim may start (and its turn is passed)."""
        self._turn.leave()
        if not self._released:
            self._released = True
            self._release()


Order = Callable[[str], tuple[tuple[Any, ...], Rank]]
"""A claim UID -> its place in the heap (smallest first) and its rank (its size)."""

WorkClaim = Callable[[str, ClaimSlot], Awaitable[None]]
"""Work one claim; anything it raises stops the worker with that error."""


class _Ready:
    """Claims taken from the queue and not started, in a heap by placement."""

    def __init__(self, order: Order) -> None:
        self._order = order
        self._heap: list[tuple[tuple[Any, ...], int, str, Rank]] = []
        self._arrival = itertools.count()  # equal places keep queue order

    def __bool__(self) -> bool:
        return bool(self._heap)

    def take(self, uids: Iterable[str]) -> None:
        taken = 0
        for uid in uids:
            place, rank = self._order(uid)
            heapq.heappush(self._heap, (place, next(self._arrival), uid, rank))
            taken += 1
        if taken > 1:
            log.debug("took %d claims (%d waiting), largest first", taken, len(self._heap))

    def first(self) -> tuple[str, Rank]:
        _, _, uid, rank = heapq.heappop(self._heap)
        return uid, rank

    def release(self, queue: WorkQueue) -> None:
        for _, _, uid, _ in self._heap:
            queue.done(uid)
        self._heap.clear()


async def work_claims(
    queue: WorkQueue,
    *,
    batch_window_s: float,
    concurrency: int,
    order: Order,
    work: WorkClaim,
) -> None:
    """Until cancelled or a claim fails: cancelling ends every claim in flight and
    releases the claims taken and not yet started (a new leader enqueues them again)."""
    slots = asyncio.Semaphore(max(1, concurrency))
    turns = Turns()
    ready = _Ready(order)
    claims: set[asyncio.Task[None]] = set()
    failures: list[BaseException] = []
    failed = asyncio.Event()

    def finished(task: asyncio.Task[None]) -> None:
        claims.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            failures.append(err)
            failed.set()

    async def one(uid: str, slot: ClaimSlot) -> None:
        try:
            await work(uid, slot)
        finally:
            slot.written()  # whatever happened: its turn passed, its slot given back
            queue.done(uid)

    async def dispatch() -> None:
        try:
            while True:
                if not ready:
                    ready.take(
                        await queue.get_batch(
                            batch_window_s, busy=lambda: bool(claims), enough=concurrency
                        )
                    )
                await slots.acquire()
                ready.take(queue.take_all())  # queued while it waited: they may go first
                uid, rank = ready.first()
                slot = ClaimSlot(turns.start(rank), slots.release)
                task = asyncio.create_task(one(uid, slot))
                claims.add(task)
                task.add_done_callback(finished)
        finally:
            ready.release(queue)

    dispatcher = asyncio.create_task(dispatch())
    stopped = asyncio.create_task(failed.wait())
    try:
        await asyncio.wait({dispatcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if failures:
            raise failures[0]
        dispatcher.result()  # it only ends by failing
    finally:
        pending = [dispatcher, stopped, *claims]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
