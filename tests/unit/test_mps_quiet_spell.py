"""The quiet spell the deferred namespace deletes wait for (``mpsagent.quiet_spell``)."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.mpsagent.quiet_spell import QuietSpell


async def a_call(spell: QuietSpell, seconds: float) -> None:
    with spell.call():
        await asyncio.sleep(seconds)


def test_with_no_call_yet_the_wait_returns_at_once() -> None:
    async def scenario() -> None:
        spell = QuietSpell(quiet_s=10, max_wait_s=20)
        async with asyncio.timeout(1):
            await spell.wait()

    asyncio.run(scenario())


def test_the_wait_ends_a_quiet_spell_after_the_last_call() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        spell = QuietSpell(quiet_s=0.1, max_wait_s=5)
        ended: list[float] = []

        async def calls() -> None:
            for _ in range(4):  # calls with short gaps: no quiet spell between them
                await a_call(spell, 0.03)
                ended.append(loop.time())
                await asyncio.sleep(0.02)

        busy = asyncio.create_task(calls())
        await asyncio.sleep(0.01)
        await spell.wait()
        returned = loop.time()
        await busy
        assert len(ended) == 4
        assert returned >= ended[-1] + 0.1
        assert returned < ended[-1] + 0.1 + 1.0

    asyncio.run(scenario())


def test_waiters_share_one_timer_armed_once_the_calls_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Twenty waiters during a long call: no timer runs while it does, one after."""
    checks: list[int] = []
    check = QuietSpell._check

    def counted(self: QuietSpell, loop: asyncio.AbstractEventLoop) -> None:
        checks.append(1)
        check(self, loop)

    monkeypatch.setattr(QuietSpell, "_check", counted)

    async def scenario() -> None:
        spell = QuietSpell(quiet_s=0.05, max_wait_s=5)
        call = asyncio.create_task(a_call(spell, 0.3))
        await asyncio.sleep(0)
        waiters = [asyncio.create_task(spell.wait()) for _ in range(20)]
        await asyncio.sleep(0.2)
        assert checks == [] and not any(w.done() for w in waiters)
        await call
        await asyncio.wait_for(asyncio.gather(*waiters), 2)
        assert len(checks) == 1

    asyncio.run(scenario())


def test_calls_that_never_pause_end_the_wait_after_its_longest() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        spell = QuietSpell(quiet_s=0.1, max_wait_s=0.3)
        stop = asyncio.Event()

        async def calls() -> None:
            while not stop.is_set():
                await a_call(spell, 0.01)
                await asyncio.sleep(0.01)

        busy = asyncio.create_task(calls())
        await asyncio.sleep(0.02)
        started = loop.time()
        await spell.wait()
        waited = loop.time() - started
        stop.set()
        await busy
        assert 0.3 <= waited < 1.5

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_others_waiting() -> None:
    async def scenario() -> None:
        spell = QuietSpell(quiet_s=0.05, max_wait_s=5)
        call = asyncio.create_task(a_call(spell, 0.1))
        await asyncio.sleep(0)
        first = asyncio.create_task(spell.wait())
        second = asyncio.create_task(spell.wait())
        await asyncio.sleep(0.01)
        first.cancel()
        await call
        await asyncio.wait_for(second, 2)
        assert first.cancelled()

    asyncio.run(scenario())
