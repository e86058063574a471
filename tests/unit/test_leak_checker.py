"""The one leak checker (tests/support/leaks.py), as run_checked and the autouse fixture use it."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.leaks import pending_tasks
from tests.support.node import run_checked


@pytest.mark.allow_leaks("it leaves a task pending on purpose, to see it found")
def test_run_checked_fails_on_a_task_left_pending() -> None:
    async def leaves_a_task() -> None:
        asyncio.get_running_loop().create_task(asyncio.Event().wait(), name="left-behind")

    with pytest.raises(AssertionError, match="left-behind"):
        run_checked(leaves_a_task())


def test_run_checked_passes_a_task_that_ends_in_the_last_pass() -> None:
    async def nothing() -> None:
        return None

    async def ends_at_once() -> int:
        asyncio.get_running_loop().create_task(nothing())
        return 7

    assert run_checked(ends_at_once()) == 7


def test_pending_tasks_waits_its_grace_for_a_task_to_end() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        ending = asyncio.Event()
        task = asyncio.create_task(ending.wait(), name="ends-soon")
        at_once = await pending_tasks(grace_s=0)
        asyncio.get_running_loop().call_soon(ending.set)
        with_grace = await pending_tasks(grace_s=5)
        await task
        return at_once, with_grace

    at_once, with_grace = asyncio.run(scenario())
    assert [t.split(":")[0] for t in at_once] == ["ends-soon"]
    assert with_grace == []
