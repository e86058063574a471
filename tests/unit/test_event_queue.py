"""The Events' queue (dra_driver/k8s/event_queue.py): never blocks, one sender, bounded,
behind the writes of its lane, rate-limited as the recorder is."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from dra_driver.k8s.event_queue import EventQueue, WriteLane
from dra_driver.k8s.events import NORMAL, InvolvedObject

CLAIM = InvolvedObject("resource.k8s.io/v1", "ResourceClaim", "c1", "default", "uid-1")


class Recorder:
    """Records what is sent; each send takes ``delay_s``; rate-limits equal Events."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.sent: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.enabled = True
        self._seen: set[tuple[str, str, str]] = set()

    def should_send(self, involved: InvolvedObject, reason: str, message: str) -> bool:
        key = (involved.key, reason, message)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    async def send(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str = NORMAL
    ) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            self.sent.append(message)
        finally:
            self.in_flight -= 1


async def until(done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not done():
            await asyncio.sleep(0.005)


def run_with_sender(queue: EventQueue, body: Callable[[], object]) -> None:
    async def scenario() -> None:
        sender = asyncio.create_task(queue.run())
        try:
            await body()  # type: ignore[misc]
        finally:
            sender.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sender

    asyncio.run(scenario())


def test_post_returns_at_once_and_one_sender_writes_in_order() -> None:
    recorder = Recorder(delay_s=0.01)
    queue = EventQueue(recorder)

    async def body() -> None:
        for n in range(5):
            assert queue.post(CLAIM, "Allocated", f"m{n}")
        assert recorder.sent == [] and len(queue) == 5  # nothing written by post itself
        assert await queue.flush()

    run_with_sender(queue, body)
    assert recorder.sent == [f"m{n}" for n in range(5)]
    assert recorder.most_in_flight == 1
    assert queue.sent == 5


def test_repeats_are_rate_limited_by_the_recorder() -> None:
    recorder = Recorder()
    queue = EventQueue(recorder)

    async def body() -> None:
        assert queue.post(CLAIM, "CannotAllocate", "x")
        assert not queue.post(CLAIM, "CannotAllocate", "x")
        assert await queue.flush()

    run_with_sender(queue, body)
    assert recorder.sent == ["x"]


def test_a_refused_recorder_queues_nothing() -> None:
    recorder = Recorder()
    recorder.enabled = False
    queue = EventQueue(recorder)
    assert not queue.post(CLAIM, "Allocated", "m")
    assert len(queue) == 0


def test_a_full_queue_drops_counts_and_logs(caplog: pytest.LogCaptureFixture) -> None:
    drops: list[None] = []
    queue = EventQueue(Recorder(), depth=3, on_drop=lambda: drops.append(None))
    with caplog.at_level(logging.WARNING, logger="dra_driver.k8s.event_queue"):
        posted = [queue.post(CLAIM, "Allocated", f"m{n}") for n in range(6)]
    assert posted == [True, True, True, False, False, False]
    assert queue.dropped == 3 and len(drops) == 3
    (line,) = [r.getMessage() for r in caplog.records]  # rate-limited: one line
    assert "dropped 1 Event(s)" in line and "3 queued" in line


def test_events_wait_while_the_lane_writes() -> None:
    recorder = Recorder()
    lane = WriteLane()
    queue = EventQueue(recorder, lane=lane, max_delay_s=60)

    async def body() -> None:
        with lane.held():
            queue.post(CLAIM, "Allocated", "m")
            await asyncio.sleep(0.1)
            assert recorder.sent == []  # a claim write is in flight: the Event waits
        await until(lambda: recorder.sent == ["m"])  # the lane went idle: sent

    run_with_sender(queue, body)


def test_a_lane_never_idle_delays_an_event_by_max_delay_at_most() -> None:
    recorder = Recorder()
    lane = WriteLane()
    queue = EventQueue(recorder, lane=lane, max_delay_s=0.2)

    async def body() -> None:
        with lane.held():
            queue.post(CLAIM, "Allocated", "m")
            await asyncio.sleep(0.05)
            assert recorder.sent == []
            await until(lambda: recorder.sent == ["m"], timeout_s=2)

    run_with_sender(queue, body)


def test_a_queue_three_quarters_full_stops_giving_way() -> None:
    recorder = Recorder()
    lane = WriteLane()
    queue = EventQueue(recorder, lane=lane, depth=4, max_delay_s=60)

    async def body() -> None:
        with lane.held():
            for n in range(2):
                queue.post(CLAIM, "Allocated", f"m{n}")
            await asyncio.sleep(0.05)
            assert recorder.sent == []
            queue.post(CLAIM, "Allocated", "m2")  # 3 of 4: the Events go despite the lane
            await until(lambda: len(recorder.sent) >= 1)

    run_with_sender(queue, body)


def test_flush_sends_without_giving_way_and_says_what_is_left() -> None:
    lane = WriteLane()
    queue = EventQueue(Recorder(), lane=lane, max_delay_s=60)
    slow = EventQueue(Recorder(delay_s=1.0))

    async def body() -> None:
        with lane.held():
            queue.post(CLAIM, "Allocated", "m")
            assert await queue.flush(2)
        slow.post(CLAIM, "Allocated", "m")
        sender = asyncio.create_task(slow.run())
        assert not await slow.flush(0.05)
        sender.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sender

    run_with_sender(queue, body)
