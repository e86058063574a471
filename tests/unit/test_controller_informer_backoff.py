"""An informer backs off as client-go's reflector does (issue 34, item 6): a watch that
keeps answering 410 (or any error) is relisted or retried after 0.8 s doubling to 30 s
with jitter, never in a tight loop; a watch that merely ends is resumed at once; the
count starts again after two quiet minutes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dra_driver.base.errors import ApiError
from dra_driver.controller.informer import CLAIMS, REFLECTOR_BACKOFF, Informer
from dra_driver.k8s.backoff import Backoff
from dra_driver.k8s.watch import WatchExpiredError
from tests.support.transport import UNUSED_HOST, transport_to

NO_JITTER = Backoff(
    initial_s=REFLECTOR_BACKOFF.initial_s,
    max_s=REFLECTOR_BACKOFF.max_s,
    factor=REFLECTOR_BACKOFF.factor,
    jitter=0.0,
)


def run_informer(failure: Exception | None, rounds: int) -> tuple[list[float], int, int]:
    """The informer against a server whose every watch ends with ``failure`` (None: ends
    normally) until ``rounds`` watches ran; the sleeps it took, its lists and watches."""
    sleeps: list[float] = []
    counts = {"list": 0, "watch": 0}

    async def scenario() -> None:
        done = asyncio.Event()

        async def record(delay: float) -> None:
            sleeps.append(delay)
            await asyncio.sleep(0)

        informer = Informer(transport_to(UNUSED_HOST), CLAIMS, backoff=NO_JITTER, sleep=record)

        async def listed() -> tuple[Any, str]:
            counts["list"] += 1
            return informer._new_cache(), "7"

        async def watched() -> None:
            counts["watch"] += 1
            if counts["watch"] >= rounds:
                done.set()
                await asyncio.Event().wait()  # the last watch: open until cancelled
            if failure is not None:
                raise failure

        informer._list = listed  # type: ignore[method-assign]
        informer._watch = watched  # type: ignore[method-assign]
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(done.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    return sleeps, counts["list"], counts["watch"]


def test_a_watch_that_keeps_expiring_is_relisted_ever_more_slowly() -> None:
    sleeps, lists, watches = run_informer(WatchExpiredError("watch: 410 Expired"), rounds=9)
    assert sleeps == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert lists == watches == 9  # every 410 relists, each after its backoff


def test_gone_as_an_http_status_is_a_relist_after_a_backoff_too() -> None:
    sleeps, lists, _ = run_informer(ApiError("GET watch: 410 Gone", status=410), rounds=4)
    assert sleeps == [0.8, 1.6, 3.2] and lists == 4


def test_other_errors_retry_the_watch_after_a_backoff_without_relisting() -> None:
    sleeps, lists, watches = run_informer(ApiError("GET watch: 500", status=500), rounds=4)
    assert sleeps == [0.8, 1.6, 3.2]
    assert lists == 1 and watches == 4


def test_a_watch_that_ends_is_resumed_at_once() -> None:
    sleeps, lists, watches = run_informer(None, rounds=5)
    assert sleeps == [] and lists == 1 and watches == 5


@pytest.mark.parametrize("draw", [0.0, 1.0])
def test_the_reflector_backoff_is_jittered_around_its_step(draw: float) -> None:
    delays = [REFLECTOR_BACKOFF.delay(n, rand=lambda: draw) for n in (1, 2, 7)]
    scale = 0.5 if draw == 0.0 else 1.5
    assert delays == [0.8 * scale, 1.6 * scale, 30.0 * scale]
