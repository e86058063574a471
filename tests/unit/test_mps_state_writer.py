"""One state-file write for the changes made at once (:mod:`dra_driver.mpsagent.state_writer`)."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.mpsagent.state_writer import CoalescedWrite


def test_saves_asked_at_once_share_one_write_holding_every_change() -> None:
    async def scenario() -> None:
        shares: list[str] = []
        written: list[list[str]] = []
        writer = CoalescedWrite(lambda: written.append(list(shares)))

        async def change(name: str) -> None:
            shares.append(name)
            await writer.save()
            assert name in written[-1]  # returned only once its change is on file

        await asyncio.gather(*(change(f"s{i}") for i in range(5)))
        assert written == [["s0", "s1", "s2", "s3", "s4"]]
        await change("late")
        assert written[-1] == ["s0", "s1", "s2", "s3", "s4", "late"]
        assert writer.writes == 2

    asyncio.run(scenario())


def test_a_failed_write_is_raised_to_every_waiting_caller() -> None:
    async def scenario() -> None:
        def full() -> None:
            raise OSError(28, "No space left on device")

        writer = CoalescedWrite(full)
        results = await asyncio.gather(writer.save(), writer.save(), return_exceptions=True)
        assert [type(r) for r in results] == [OSError, OSError]
        assert writer.writes == 0

    asyncio.run(scenario())


def test_a_cancelled_caller_does_not_cancel_the_others_write() -> None:
    async def scenario() -> None:
        written: list[int] = []
        writer = CoalescedWrite(lambda: written.append(1))
        first = asyncio.create_task(writer.save())
        second = asyncio.create_task(writer.save())
        await asyncio.sleep(0)
        first.cancel()
        await second
        with pytest.raises(asyncio.CancelledError):
            await first
        assert written == [1]

    asyncio.run(scenario())


def test_a_caller_alone_has_the_file_written_before_the_loop_turns() -> None:
    """No other change under way: the write is not put off to the loop's next turn
    (a callback scheduled now has not run when the save returns)."""

    async def scenario() -> None:
        order: list[str] = []
        writer = CoalescedWrite(lambda: order.append("written"))
        asyncio.get_running_loop().call_soon(order.append, "next turn")
        await writer.save(alone=True)
        assert order == ["written"]
        await asyncio.sleep(0)
        assert order == ["written", "next turn"]
        assert writer.writes == 1

    asyncio.run(scenario())


def test_a_caller_alone_raises_the_failed_write_itself() -> None:
    async def scenario() -> None:
        def full() -> None:
            raise OSError(28, "No space left on device")

        writer = CoalescedWrite(full)
        with pytest.raises(OSError, match="No space left"):
            await writer.save(alone=True)
        assert writer.writes == 0

    asyncio.run(scenario())


def test_a_caller_alone_joins_a_write_already_scheduled() -> None:
    """A write scheduled by an earlier caller runs after this change too: the two
    share it, as when neither was alone."""

    async def scenario() -> None:
        shares: list[str] = []
        written: list[list[str]] = []
        writer = CoalescedWrite(lambda: written.append(list(shares)))
        shares.append("a")
        first = asyncio.create_task(writer.save())
        await asyncio.sleep(0)  # the first caller's write is scheduled, not run
        shares.append("b")
        await writer.save(alone=True)
        await first
        assert written == [["a", "b"]]
        assert writer.writes == 1

    asyncio.run(scenario())
