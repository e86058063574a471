"""The worker's order: the largest claim ready goes next, even one that came later;
the window holds only an idle worker's first claim; writes wait for larger claims."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.turns import Turns
from dra_driver.controller.worker import ClaimSlot, work_claims

SIZES = {"small-1": 4, "small-2": 4, "small-3": 4, "large": 40, "mid": 20}


def _by_size(uid: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    rank = (1, -SIZES[uid])
    return (*rank, uid), rank


class Recorder:
    """A work function that records each start and holds each claim until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.at: dict[str, float] = {}
        self.release: dict[str, asyncio.Event] = {}
        self.first = asyncio.Event()

    async def __call__(self, uid: str, slot: ClaimSlot) -> None:
        self.started.append(uid)
        self.at[uid] = asyncio.get_running_loop().time()
        self.first.set()
        await self.release.setdefault(uid, asyncio.Event()).wait()

    def let_go(self, uid: str) -> None:
        self.release.setdefault(uid, asyncio.Event()).set()


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.005)


def test_a_larger_claim_that_came_later_goes_before_the_smaller_ones_waiting() -> None:
    async def scenario() -> list[str]:
        queue, work = WorkQueue(), Recorder()
        worker = asyncio.create_task(
            work_claims(queue, batch_window_s=0.05, concurrency=1, order=_by_size, work=work)
        )
        for uid in ("small-1", "small-2", "small-3"):
            queue.add(uid)
        await _until(lambda: work.started == ["small-1"])
        queue.add("large")  # after the first batch was taken: it still goes next
        queue.add("mid")
        for uid in ("small-1", "large", "mid", "small-2", "small-3"):
            await _until(lambda uid=uid: uid in work.started)
            work.let_go(uid)
        await _until(queue.idle)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        return work.started

    assert asyncio.run(scenario()) == ["small-1", "large", "mid", "small-2", "small-3"]


def test_the_window_holds_only_an_idle_workers_first_claim() -> None:
    window = 0.5

    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        queue, work = WorkQueue(), Recorder()
        worker = asyncio.create_task(
            work_claims(queue, batch_window_s=window, concurrency=4, order=_by_size, work=work)
        )
        queued = loop.time()
        queue.add("small-1")
        await work.first.wait()
        first = work.at["small-1"] - queued
        later = loop.time()
        queue.add("small-2")  # small-1 is in flight: no window for this one
        await _until(lambda: "small-2" in work.started)
        second = work.at["small-2"] - later
        for uid in ("small-1", "small-2"):
            work.let_go(uid)
        await _until(queue.idle)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        return first, second

    first, second = asyncio.run(scenario())
    assert window - 0.01 <= first < window + 0.25, first
    assert second < window / 2, second


def test_cancelling_releases_the_claims_not_started() -> None:
    async def scenario() -> bool:
        queue, work = WorkQueue(), Recorder()
        worker = asyncio.create_task(
            work_claims(queue, batch_window_s=0.01, concurrency=1, order=_by_size, work=work)
        )
        for uid in ("small-1", "small-2", "large"):
            queue.add(uid)
        await work.first.wait()
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        return queue.idle()

    assert asyncio.run(scenario())


def test_a_smaller_claims_turn_waits_for_the_larger_ones_started_before_it() -> None:
    async def scenario() -> None:
        turns = Turns()
        large = turns.start((1, -40))
        other_large = turns.start((1, -40))
        small = turns.start((1, -4))
        later_large = turns.start((1, -40))
        assert large.passed() and other_large.passed()  # one size: no wait on each other
        assert later_large.passed()  # started after the small one: decided over it
        assert not small.passed()
        waiting = asyncio.create_task(small.wait())
        large.leave()
        large.leave()  # once only
        await asyncio.sleep(0)
        assert not waiting.done() and not small.passed()
        other_large.leave()
        await asyncio.wait_for(waiting, 1)
        assert small.passed()
        small.leave()
        later_large.leave()
        assert len(turns) == 0

    asyncio.run(scenario())


def test_busy_takes_what_is_queued_at_once() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        queue = WorkQueue()
        queue.add("a")
        start = loop.time()
        assert await queue.get_batch(0.5, busy=lambda: True) == ["a"]
        assert queue.take_all() == []
        queue.add("b")
        queue.add("c")
        assert queue.take_all() == ["b", "c"]
        return loop.time() - start

    assert asyncio.run(scenario()) < 0.1
