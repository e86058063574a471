"""The leader's worker loop: take batches from the queue, start each claim in order,
up to a bound of claims at once.

Each claim of a batch is started in the order given (its decision is taken at its
start, before any later claim's) and holds a write slot until its own writes are done
(:meth:`ClaimSlot.written`) or it ends; its Event is queued, written later by the
Events' sender (:mod:`dra_driver.k8s.event_queue`). A claim's :class:`~.waves.Turn`
orders its allocation write after every larger claim's of its batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence

from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.waves import Turn, waves_of

log = logging.getLogger(__name__)

Rank = tuple[Hashable, ...]
"""A claim's size in its batch: claims of one rank form one wave."""


class ClaimSlot:
    """One claim's place while it is worked: its wave's turn and its write slot."""

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
        """Until every larger claim of the batch has had its allocation answered."""
        await self._turn.wait()

    def written(self) -> None:
        """Its own writes are done: the next claim may start (and its turn is passed)."""
        self._turn.leave()
        if not self._released:
            self._released = True
            self._release()


Order = Callable[[Sequence[str]], list[tuple[str, Rank]]]
"""A batch's claim UIDs -> (UID, rank) in the order to start them."""

WorkClaim = Callable[[str, ClaimSlot], Awaitable[None]]
"""Work one claim; anything it raises stops the worker with that error."""


async def work_batches(
    queue: WorkQueue,
    *,
    batch_window_s: float,
    concurrency: int,
    order: Order,
    work: WorkClaim,
) -> None:
    """Until cancelled or a claim fails: cancelling ends every claim in flight and
    releases the batch's claims not yet started (a new leader enqueues them again)."""
    slots = asyncio.Semaphore(max(1, concurrency))
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
        while True:
            batch = await queue.get_batch(batch_window_s)
            ordered = deque(order(batch))
            waves = waves_of([rank for _, rank in ordered])
            if len(ordered) > 1:
                log.debug("working a batch of %d claims, largest first", len(ordered))
            try:
                while ordered:
                    await slots.acquire()
                    uid, rank = ordered.popleft()
                    slot = ClaimSlot(Turn(waves[rank]), slots.release)
                    task = asyncio.create_task(one(uid, slot))
                    claims.add(task)
                    task.add_done_callback(finished)
            finally:
                for uid, _ in ordered:
                    queue.done(uid)

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
