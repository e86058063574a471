"""CallActivity: the kubelet's calls in flight, and waiting for a lull in them.

Ordered by events, timed on the event loop's virtual clock (tests/support/clock.py):
nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.plugin.activity import CallActivity
from tests.support.clock import run_in_virtual_time


def test_lull_returns_at_once_when_no_call_is_in_flight() -> None:
    lull = CallActivity(max_wait_s=5).lull()
    with pytest.raises(StopIteration):  # done at its first step: it never waits
        lull.send(None)


def test_lull_waits_for_the_last_of_overlapping_calls() -> None:
    async def scenario() -> list[str]:
        activity = CallActivity(max_wait_s=5)
        seen: list[str] = []
        ends = {"short": asyncio.Event(), "long": asyncio.Event()}

        async def call(name: str) -> None:
            with activity.call():
                await ends[name].wait()
            seen.append(name)

        async def waiter() -> None:
            await activity.lull()
            seen.append("lull")

        calls = [asyncio.create_task(call(name)) for name in ends]
        await asyncio.sleep(0)
        assert activity.calls == 2
        lull = asyncio.create_task(waiter())
        await asyncio.sleep(0)
        ends["short"].set()
        await calls[0]
        await asyncio.sleep(0)
        assert seen == ["short"] and not lull.done()  # one call is still in flight
        ends["long"].set()
        await asyncio.gather(*calls, lull)
        return seen

    assert run_in_virtual_time(scenario()) == ["short", "long", "lull"]


def test_lull_gives_up_after_max_wait() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        activity = CallActivity(max_wait_s=0.1)
        with activity.call():
            started = loop.time()
            await activity.lull()
            return loop.time() - started

    assert run_in_virtual_time(scenario()) == pytest.approx(0.1)


def test_a_call_that_raises_still_ends() -> None:
    activity = CallActivity()
    try:
        with activity.call():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert activity.calls == 0
