"""CallActivity: the kubelet's calls in flight, and waiting for a lull in them."""

from __future__ import annotations

import asyncio
import time

from dra_driver.plugin.activity import CallActivity


def test_lull_returns_at_once_when_no_call_is_in_flight() -> None:
    async def scenario() -> float:
        started = time.monotonic()
        await CallActivity(max_wait_s=5).lull()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 0.1


def test_lull_waits_for_the_last_of_overlapping_calls() -> None:
    async def scenario() -> list[str]:
        activity = CallActivity(max_wait_s=5)
        seen: list[str] = []

        async def call(name: str, seconds: float) -> None:
            with activity.call():
                await asyncio.sleep(seconds)
            seen.append(name)

        async def waiter() -> None:
            await asyncio.sleep(0.01)
            assert activity.calls == 2
            await activity.lull()
            seen.append("lull")

        await asyncio.gather(call("short", 0.05), call("long", 0.15), waiter())
        return seen

    assert asyncio.run(scenario()) == ["short", "long", "lull"]


def test_lull_gives_up_after_max_wait() -> None:
    async def scenario() -> float:
        activity = CallActivity(max_wait_s=0.1)
        with activity.call():
            started = time.monotonic()
            await activity.lull()
            return time.monotonic() - started

    waited = asyncio.run(scenario())
    assert 0.09 <= waited < 1


def test_a_call_that_raises_still_ends() -> None:
    activity = CallActivity()
    try:
        with activity.call():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert activity.calls == 0
