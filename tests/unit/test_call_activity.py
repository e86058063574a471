"""CallActivity: the kubelet's calls in flight, and waiting for a lull in them.

Ordered by events: each call lasts until the test releases it."""

from __future__ import annotations

import asyncio
import time

from dra_driver.plugin.activity import CallActivity


def test_lull_returns_at_once_when_no_call_is_in_flight() -> None:
    lull = CallActivity(max_wait_s=5).lull()
    try:
        lull.send(None)  # runs to its end without waiting for anything
    except StopIteration:
        return
    finally:
        lull.close()
    raise AssertionError("lull() waited although no call was in flight")


def test_lull_waits_for_the_last_of_overlapping_calls() -> None:
    async def scenario() -> list[str]:
        activity = CallActivity(max_wait_s=60)
        seen: list[str] = []
        releases = {"short": asyncio.Event(), "long": asyncio.Event()}
        both_in = asyncio.Event()

        async def call(name: str) -> None:
            with activity.call():
                if activity.calls == 2:
                    both_in.set()
                await releases[name].wait()
            seen.append(name)

        async def waiter() -> None:
            await both_in.wait()
            await activity.lull()
            seen.append("lull")

        calls = [asyncio.create_task(call("short")), asyncio.create_task(call("long"))]
        lull = asyncio.create_task(waiter())
        await both_in.wait()
        releases["short"].set()
        await calls[0]
        await asyncio.sleep(0)  # the waiter runs: one call is still in flight
        assert not lull.done()
        releases["long"].set()
        await asyncio.gather(*calls, lull)
        return seen

    assert asyncio.run(scenario()) == ["short", "long", "lull"]


def test_lull_gives_up_after_max_wait() -> None:
    async def scenario() -> tuple[float, int]:
        activity = CallActivity(max_wait_s=0.1)
        with activity.call():
            started = time.monotonic()
            # Bounded from below only: a loaded machine may be late, never early.
            await asyncio.wait_for(activity.lull(), 30)
            return time.monotonic() - started, activity.calls

    waited, calls = asyncio.run(scenario())
    assert waited >= 0.09
    assert calls == 1  # it returned while the call was still in flight


def test_a_call_that_raises_still_ends() -> None:
    activity = CallActivity()
    try:
        with activity.call():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert activity.calls == 0
