"""DeferredReleases: an unprepared claim's MPS v3 shares released in a lull of the calls.

The agent is a recording stand-in and the lull an event the test sets; the
retry backoff runs on the event loop's virtual clock (tests/support/clock.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dra_driver.base.errors import MpsAgentError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.prepare import PlannedDevice
from dra_driver.core.settings import NodeSettings
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo
from dra_driver.plugin import deferred_releases
from dra_driver.plugin.deferred_releases import DeferredReleases
from dra_driver.plugin.enforcement import Enforcer
from tests.support.clock import run_in_virtual_time
from tests.support.planned import exclusive, mig_instance, mps_in_mig, mps_share

CLAIM = ClaimRef("team-a", "c", ClaimUID("u1"))


class RecordingAgent:
    """Records each release; ``refuse``: that many releases fail first; ``held``: the
    next release waits for it (only that one)."""

    def __init__(self) -> None:
        self.released: list[tuple[str, str]] = []
        self.refuse = 0
        self.held: asyncio.Event | None = None
        self.arrived = asyncio.Event()

    async def ensure_share(self, gpu_uuid: str, share_id: str, **limits: Any) -> ShareInfo:
        raise AssertionError("not asked here")

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        self.arrived.set()
        if self.held is not None:
            held, self.held = self.held, None
            await held.wait()
        if self.refuse:
            self.refuse -= 1
            raise MpsAgentError("daemon_failed", "namespace delete refused")
        self.released.append((gpu_uuid, share_id))
        return True

    async def list_shares(self) -> list[ShareInfo]:
        return []

    async def status(self) -> AgentStatus:
        raise AssertionError("not asked here")


class Lull:
    """The plugin's lull in its calls, as the test says: each wait returns once ``now``
    is set."""

    def __init__(self) -> None:
        self.now = asyncio.Event()
        self.waits = 0

    async def __call__(self) -> None:
        self.waits += 1
        await self.now.wait()


def deferring(*, refuse: int = 0) -> tuple[RecordingAgent, Lull, DeferredReleases]:
    """Releases to a recording agent (``refuse``: its first ones refused), in a lull
    the test sets."""
    agent, lull = RecordingAgent(), Lull()
    agent.refuse = refuse
    return agent, lull, DeferredReleases(agent, lull)


async def a_release_in_flight(
    *, refuse: int = 0
) -> tuple[RecordingAgent, DeferredReleases, asyncio.Event]:
    """GPU-0's s1 released in a lull, the request held at the agent until the event
    is set (``refuse``: then refused)."""
    agent, lull, releases = deferring(refuse=refuse)
    held = agent.held = asyncio.Event()
    lull.now.set()
    releases.defer(CLAIM, "GPU-0", "s1")
    await agent.arrived.wait()
    return agent, releases, held


async def settle_loop() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_a_release_waits_for_a_lull_then_all_go_in_order() -> None:
    async def scenario() -> None:
        agent, lull, releases = deferring()
        releases.defer(CLAIM, "GPU-0", "s1")
        releases.defer(CLAIM, "GPU-1", "s2")
        releases.defer(CLAIM, "GPU-0", "s1")  # the kubelet's retry: one release
        await settle_loop()
        assert agent.released == [] and releases.pending == 2
        assert releases.holds("GPU-0", "s1") and not releases.holds("GPU-0", "s2")
        lull.now.set()
        await settle_loop()
        assert agent.released == [("GPU-0", "s1"), ("GPU-1", "s2")]
        assert releases.pending == 0 and releases.failures == 0

    asyncio.run(scenario())


def test_a_share_ensured_again_has_its_pending_release_sent_first_and_only_then() -> None:
    async def scenario() -> None:
        agent, lull, releases = deferring()
        releases.defer(CLAIM, "GPU-0", "s1")
        releases.defer(CLAIM, "GPU-0", "s2")
        await releases.settle("GPU-0", "s1")
        assert agent.released == [("GPU-0", "s1")], "sent at once, without a lull"
        await releases.settle("GPU-0", "s3")  # nothing pending: nothing sent
        lull.now.set()
        await settle_loop()
        assert agent.released == [("GPU-0", "s1"), ("GPU-0", "s2")], "s1 was sent twice"

    asyncio.run(scenario())


def test_an_ensure_waits_for_the_release_in_flight() -> None:
    async def scenario() -> None:
        agent, releases, held = await a_release_in_flight()
        settle = asyncio.create_task(releases.settle("GPU-0", "s1"))
        await settle_loop()
        assert not settle.done(), "the ensure went ahead of the release in flight"
        held.set()
        await settle
        assert agent.released == [("GPU-0", "s1")]

    asyncio.run(scenario())


def test_a_failed_release_in_flight_is_sent_by_the_ensure_waiting_for_it() -> None:
    async def scenario() -> None:
        agent, releases, held = await a_release_in_flight(refuse=1)
        settle = asyncio.create_task(releases.settle("GPU-0", "s1"))
        await settle_loop()
        held.set()
        await settle
        assert agent.released == [("GPU-0", "s1")], "the ensure went ahead of a failed release"
        assert releases.pending == 0 and releases.failures == 1

    run_in_virtual_time(scenario())


def test_a_refused_release_is_logged_and_tried_again_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger=deferred_releases.__name__)

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        agent, lull, releases = deferring(refuse=2)
        lull.now.set()
        started = loop.time()
        releases.defer(CLAIM, "GPU-0", "s1")
        while not agent.released:
            await asyncio.sleep(0.05)
        assert releases.failures == 2
        return loop.time() - started

    took = run_in_virtual_time(scenario())
    # Backoff 0.5 s, then 1 s.
    assert took == pytest.approx(1.5, abs=0.06)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "releasing MPS share s1 of claim team-a/c" in messages[0]
    assert "retrying in 0.5s" in messages[0] and "retrying in 1s" in messages[1]
    assert "namespace delete refused" in messages[0]


def test_a_refused_release_sent_for_an_ensure_raises_and_stays_pending() -> None:
    async def scenario() -> None:
        agent, lull, releases = deferring(refuse=1)
        releases.defer(CLAIM, "GPU-0", "s1")
        with pytest.raises(MpsAgentError, match="refused"):
            await releases.settle("GPU-0", "s1")
        assert releases.holds("GPU-0", "s1"), "the share is still the agent's"
        lull.now.set()
        await settle_loop()
        assert agent.released == [("GPU-0", "s1")]

    asyncio.run(scenario())


def test_flush_sends_what_is_pending_once_without_a_lull(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger=deferred_releases.__name__)

    async def scenario() -> None:
        agent, _, releases = deferring(refuse=1)
        releases.defer(CLAIM, "GPU-0", "s1")
        releases.defer(CLAIM, "GPU-0", "s2")
        await settle_loop()
        await releases.flush()
        assert agent.released == [("GPU-0", "s2")]
        assert releases.pending == 0
        await releases.flush()  # nothing left: nothing sent
        assert agent.released == [("GPU-0", "s2")]

    asyncio.run(scenario())
    (message,) = [r.getMessage() for r in caplog.records]
    assert "s1 of claim team-a/c:u1 on GPU-0 was not released" in message
    assert "next start's reconcile" in message


def test_flush_ends_a_release_in_flight_and_sends_it_again() -> None:
    async def scenario() -> None:
        agent, releases, _ = await a_release_in_flight()
        await releases.flush()  # cancels the held try, then sends it again (not held)
        assert agent.released == [("GPU-0", "s1")]
        assert releases.pending == 0 and releases.failures == 0

    asyncio.run(scenario())


def enforcer(*, legacy: bool = False, lull: bool = True) -> Enforcer:
    async def never() -> None:  # no lull: the test flushes what it deferred
        await asyncio.Event().wait()

    return Enforcer(
        backend=None,  # type: ignore[arg-type]  # not reached
        inventory=lambda: None,  # type: ignore[arg-type,return-value]
        mig_caps=None,
        mps=RecordingAgent(),
        settings=NodeSettings(legacy_mps=legacy),
        lull=never if lull else None,
    )


def test_only_plain_shares_of_mps_v3_daemons_are_deferred() -> None:
    async def scenario() -> None:
        plain: list[PlannedDevice] = [
            mps_share("gpu-0", share_id="s1"),
            mps_share("gpu-0", share_id="s2"),
        ]
        deferring = enforcer()
        assert deferring.release_later(CLAIM, plain)
        await deferring.flush_releases()
        kept: list[tuple[Enforcer, list[PlannedDevice]]] = [
            (enforcer(legacy=True), plain),  # legacy: the next share may be another tenant's
            (enforcer(lull=False), plain),  # no lull given: released at once
            (enforcer(), [mps_in_mig(share_id="s1")]),  # MIG keeps its order
            (enforcer(), [*plain, mig_instance("gpu-1-mig", gpu="GPU-1")]),
            (enforcer(), []),
        ]
        for target, devices in kept:
            assert not target.may_defer_release(devices), devices
            assert not target.release_later(CLAIM, devices), devices
            assert target.releases is None or target.releases.pending == 0

    asyncio.run(scenario())


def test_a_claims_shares_of_one_gpu_are_one_release() -> None:
    async def scenario() -> None:
        target = enforcer()
        assert target.releases is not None
        devices = [
            mps_share("gpu-0", share_id="s1"),
            mps_share("gpu-0", share_id="s2"),
            mps_share("gpu-1", gpu="GPU-1", share_id="s3"),
            mps_share("gpu-2", gpu="GPU-2", share_id=None),  # no key: nothing to release
        ]
        assert target.release_later(CLAIM, devices)
        assert target.releases.pending == 2
        await target.flush_releases()
        agent = target.releases.agent
        assert isinstance(agent, RecordingAgent)
        assert agent.released == [("GPU-0", "s1"), ("GPU-1", "s3")]

    asyncio.run(scenario())


def test_a_gpu_used_whole_has_its_releases_sent_first() -> None:
    """The last share's release stops the GPU's daemon and puts its compute mode back:
    a whole GPU (or MIG, or time-slicing) on it waits for its pending releases; another
    MPS share of it does not."""

    async def scenario() -> None:
        target = enforcer()
        releases = target.releases
        assert releases is not None
        assert not target.must_settle_releases([exclusive("gpu-0", gpu="GPU-0")])
        releases.defer(CLAIM, "GPU-0", "s1")
        releases.defer(CLAIM, "GPU-0", "s2")
        releases.defer(CLAIM, "GPU-1", "s3")
        assert not target.must_settle_releases([mps_share("gpu-0", gpu="GPU-0", share_id="s4")])
        assert not target.must_settle_releases([exclusive("gpu-2", gpu="GPU-2")])
        whole = [exclusive("gpu-0", gpu="GPU-0")]
        assert target.must_settle_releases(whole)
        await target.settle_releases(whole)
        agent = releases.agent
        assert isinstance(agent, RecordingAgent)
        assert agent.released == [("GPU-0", "s1"), ("GPU-0", "s2")]
        assert not target.must_settle_releases(whole)
        assert releases.holds("GPU-1", "s3"), "another GPU's release was sent"
        await target.flush_releases()

    asyncio.run(scenario())
