"""The GPU gate and the per-share locks of the mps-agent (:mod:`dra_driver.mpsagent.gpu_gate`)."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.mpsagent.gpu_gate import GpuGate, ShareLocks


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_shared_holders_run_together_and_exclusive_waits_for_them() -> None:
    async def scenario() -> None:
        gate = GpuGate()
        release = asyncio.Event()
        order: list[str] = []

        async def shared(name: str) -> None:
            async with gate.shared():
                order.append(f"{name} in")
                await release.wait()
                order.append(f"{name} out")

        async def exclusive() -> None:
            async with gate.exclusive():
                assert gate.shared_holders == 0
                order.append("exclusive")

        a, b = asyncio.create_task(shared("a")), asyncio.create_task(shared("b"))
        await _settle()
        assert gate.shared_holders == 2
        x = asyncio.create_task(exclusive())
        await _settle()
        assert order == ["a in", "b in"]
        release.set()
        await asyncio.gather(a, b, x)
        assert order[-1] == "exclusive"

    asyncio.run(scenario())


def test_a_waiting_exclusive_holder_goes_before_later_shared_ones() -> None:
    async def scenario() -> None:
        gate = GpuGate()
        order: list[str] = []
        first = asyncio.Event()

        async def shared(name: str, until: asyncio.Event | None = None) -> None:
            async with gate.shared():
                order.append(name)
                if until is not None:
                    await until.wait()

        async def exclusive() -> None:
            async with gate.exclusive():
                order.append("exclusive")
                await _settle()
                assert gate.shared_holders == 0

        tasks = [asyncio.create_task(shared("early", first))]
        await _settle()
        tasks.append(asyncio.create_task(exclusive()))
        await _settle()
        tasks.append(asyncio.create_task(shared("late")))
        await _settle()
        assert order == ["early"]  # the late one waits behind the exclusive one
        first.set()
        await asyncio.gather(*tasks)
        assert order == ["early", "exclusive", "late"]

    asyncio.run(scenario())


def test_a_cancelled_exclusive_waiter_lets_the_shared_ones_in() -> None:
    async def scenario() -> None:
        gate = GpuGate()
        hold = asyncio.Event()

        async def shared(until: asyncio.Event | None = None) -> None:
            async with gate.shared():
                if until is not None:
                    await until.wait()

        holder = asyncio.create_task(shared(hold))
        await _settle()
        waiting = asyncio.create_task(gate.exclusive().__aenter__())
        await _settle()
        late = asyncio.create_task(shared())
        await _settle()
        assert not late.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await asyncio.wait_for(late, 1)  # no longer held up
        hold.set()
        await holder
        async with gate.exclusive():  # nothing left holding or waiting
            assert gate.exclusive_held

    asyncio.run(scenario())


def test_exclusive_holders_run_one_at_a_time() -> None:
    async def scenario() -> None:
        gate = GpuGate()
        inside = 0
        most = 0

        async def exclusive() -> None:
            nonlocal inside, most
            async with gate.exclusive():
                inside += 1
                most = max(most, inside)
                await _settle()
                inside -= 1

        await asyncio.gather(*(exclusive() for _ in range(4)))
        assert most == 1

    asyncio.run(scenario())


def test_share_locks_serialise_one_key_and_forget_it_after() -> None:
    async def scenario() -> None:
        locks = ShareLocks()
        inside: dict[str, int] = {"a": 0, "b": 0}
        most: dict[str, int] = {"a": 0, "b": 0}

        async def hold(key: str) -> None:
            async with locks.hold(("gpu", key)):
                inside[key] += 1
                most[key] = max(most[key], inside[key])
                await _settle()
                inside[key] -= 1

        await asyncio.gather(hold("a"), hold("a"), hold("b"), hold("b"))
        assert most == {"a": 1, "b": 1}
        assert len(locks) == 0

        task = asyncio.create_task(hold("a"))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert len(locks) == 0

    asyncio.run(scenario())
