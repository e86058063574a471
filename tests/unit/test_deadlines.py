"""Bounds kept by one timer (:mod:`dra_driver.k8s.deadlines`): what ``asyncio.timeout``
does for one await, for many; a real event loop and real sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dra_driver.k8s.deadlines import Deadlines

SLACK_S = 0.25
"""How late past its bound a block may end on a loaded machine."""


def _run(scenario: Callable[[Deadlines], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        deadlines = Deadlines(asyncio.get_running_loop())
        try:
            return await scenario(deadlines)
        finally:
            deadlines.close()

    return asyncio.run(main())


def test_a_block_past_its_bound_ends_in_timeout_error_and_the_task_goes_on() -> None:
    async def scenario(deadlines: Deadlines) -> tuple[float, int]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError, match=r"not done within 0\.2 s"), deadlines.within(0.2):
            await asyncio.sleep(10)
        took = loop.time() - started
        await asyncio.sleep(0.01)  # no cancellation left over for the next await
        task = asyncio.current_task()
        assert task is not None
        return took, task.cancelling()

    took, cancelling = _run(scenario)
    assert 0.2 <= took < 0.2 + SLACK_S
    assert cancelling == 0


def test_blocks_done_in_time_set_one_timer_not_one_each() -> None:
    async def scenario(deadlines: Deadlines) -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting_call_at(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            nonlocal armed
            if getattr(callback, "__self__", None) is deadlines:
                armed += 1
            return call_at(when, callback, *args)

        loop.call_at = counting_call_at  # type: ignore[method-assign,assignment]
        try:

            async def one() -> str:
                with deadlines.within(10):
                    await asyncio.sleep(0)
                    return "answered"

            answers = await asyncio.gather(*(one() for _ in range(200)))
            for _ in range(200):
                assert await one() == "answered"
        finally:
            del loop.call_at
        assert answers == ["answered"] * 200
        return armed

    assert _run(scenario) == 1


def test_a_shorter_bound_after_a_longer_one_still_ends_on_time() -> None:
    async def scenario(deadlines: Deadlines) -> list[str]:
        loop = asyncio.get_running_loop()
        events: list[str] = []

        async def bounded(name: str, bound: float, sleep: float) -> None:
            started = loop.time()
            try:
                with deadlines.within(bound):
                    await asyncio.sleep(sleep)
                events.append(f"{name} done")
            except TimeoutError:
                assert bound <= loop.time() - started < bound + SLACK_S
                events.append(f"{name} timed out")

        await asyncio.gather(bounded("long", 5, 0.4), bounded("short", 0.1, 10))
        return events

    assert _run(scenario) == ["short timed out", "long done"]


def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    async def scenario(deadlines: Deadlines) -> None:
        async def bounded() -> None:
            with deadlines.within(10):
                await asyncio.sleep(10)

        task = asyncio.create_task(bounded())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    _run(scenario)


def test_a_cancellation_from_elsewhere_as_the_bound_expires_stays_a_cancellation() -> None:
    async def scenario(deadlines: Deadlines) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        with pytest.raises(asyncio.CancelledError), deadlines.within(0.1) as bound:
            # Someone else cancels the task at the bound's time: both cancellations
            # land before the task runs again, and the caller's must win.
            loop.call_at(bound.due, task.cancel)
            await asyncio.sleep(10)
        assert task.uncancel() == 0  # the caller's, still counted; the bound's taken back

    _run(scenario)


def test_nested_bounds_the_inner_one_ends_first() -> None:
    async def scenario(deadlines: Deadlines) -> str:
        with deadlines.within(5):
            try:
                with deadlines.within(0.1):
                    await asyncio.sleep(10)
            except TimeoutError:
                pass
            await asyncio.sleep(0.01)
            return "the outer block went on"

    assert _run(scenario) == "the outer block went on"


def test_no_bound_and_a_closed_deadlines_bound_nothing() -> None:
    async def scenario(deadlines: Deadlines) -> list[str]:
        done = []
        with deadlines.within(None):
            await asyncio.sleep(0.05)
            done.append("unbounded")
        with deadlines.within(0.05):
            deadlines.close()  # stops the timer: what was open is no longer enforced
            await asyncio.sleep(0.15)
            done.append("after close")
        return done

    assert _run(scenario) == ["unbounded", "after close"]


def test_outside_a_task_is_refused() -> None:
    loop = asyncio.new_event_loop()
    try:
        deadlines = Deadlines(loop)
        with pytest.raises(RuntimeError), deadlines.within(1):
            pass
    finally:
        loop.close()
