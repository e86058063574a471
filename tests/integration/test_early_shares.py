"""An MPS share's ensure runs while its claim's PrepareStarted entry is written, and a
failed write releases what it made: the plugin over its real socket, the mps-agent
with the fake control binary (real processes), the checkpoint's writes gated."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from dra_driver.app.plugin import Plugin, start_plugin
from dra_driver.base.errors import CheckpointError
from dra_driver.core.cdi import CdiDevice, CdiSpec, ContainerEdits
from dra_driver.core.model import Inventory
from dra_driver.core.prepare import PlannedDevice, mps_namespaces
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet, RegisteredPlugin
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.port import MpsAgentPort
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo
from dra_driver.plugin import early_shares, enforcement
from dra_driver.plugin.deferred_releases import DeferredReleases
from dra_driver.plugin.early_shares import EarlyShares
from dra_driver.plugin.enforcement import Enforcer
from dra_driver.state.checkpoint import Checkpoint, ClaimState
from tests.support.eventually import eventually
from tests.support.mps import agent_config, agent_running, mps_parts, until_shares
from tests.support.node import DRIVER, NodeDirs, run_checked
from tests.support.planned import mig_instance, mps_in_mig, mps_share

WAIT_S = 20.0


class WatchedAgent:
    """The real agent client; ``ensured`` is set (from any thread's view) once a share
    of ``claim_uid`` has been ensured, ``asked`` once it is asked for, ``released``
    once a share was released."""

    def __init__(self, agent: MpsAgentPort, claim_uid: str) -> None:
        self.agent = agent
        self.claim_uid = claim_uid
        self.asked = threading.Event()
        self.ensured = threading.Event()
        self.released = threading.Event()

    async def ensure_share(self, gpu_uuid: str, share_id: str, **limits: Any) -> ShareInfo:
        mine = limits.get("claim_uid") == self.claim_uid
        if mine:
            self.asked.set()
        info = await self.agent.ensure_share(gpu_uuid, share_id, **limits)
        if mine:
            self.ensured.set()
        return info

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        done = await self.agent.release_share(gpu_uuid, share_id)
        self.released.set()
        return done

    async def list_shares(self) -> list[ShareInfo]:
        return await self.agent.list_shares()

    async def status(self) -> AgentStatus:
        return await self.agent.status()


@asynccontextmanager
async def serving(
    dirs: NodeDirs, claims: list[dict[str, Any]], *, legacy: bool = False
) -> AsyncIterator[tuple[Plugin, RegisteredPlugin]]:
    """The agent (MPS v3; ``legacy``: legacy MPS, the plugin told so) and the plugin."""
    config = agent_config(dirs)
    parts = mps_parts(dirs, InMemoryClaimSource(claims))
    if legacy:
        config = dataclasses.replace(config, protocol="legacy")
        settings = dataclasses.replace(parts.config.settings, legacy_mps=True)
        parts = dataclasses.replace(
            parts, config=dataclasses.replace(parts.config, settings=settings)
        )
    async with agent_running(config):
        runtime = await start_plugin(parts)
        kubelet = FakeKubelet(dirs.registry)
        try:
            yield runtime, await kubelet.wait_for_plugin(DRIVER)
        finally:
            await kubelet.close()
            await runtime.stop()


class HeldWrite:
    """The agent watched, and the checkpoint write that records a claim PrepareStarted
    (``removal``: the one that drops its entry) held, in the writer's thread, until the
    agent has ensured (released) a share: ``seen`` says whether it did within
    ``WAIT_S`` (``wait`` False: not waited for, nothing seen). With ``fail``, that
    write then fails as a full disk does."""

    def __init__(
        self, runtime: Plugin, claim_uid: str, *, removal: bool, fail: bool, wait: bool = True
    ) -> None:
        driver = runtime.driver
        assert driver is not None and driver.enforcer is not None
        assert driver.enforcer.mps is not None
        self.agent = WatchedAgent(driver.enforcer.mps, claim_uid)
        driver.enforcer.mps = self.agent
        if driver.enforcer.releases is not None:
            driver.enforcer.releases.agent = self.agent
        self.store = driver.journal.store
        self.seen: list[bool] = []
        event = self.agent.released if removal else self.agent.ensured
        save = self.store.save

        def held(checkpoint: Checkpoint) -> None:
            entry = checkpoint.claims.get(claim_uid)  # type: ignore[call-overload]
            if (
                entry is None and claim_uid in self.store.load().claims
                if removal
                else entry is not None and entry.state is ClaimState.PREPARE_STARTED
            ):
                if wait:
                    self.seen.append(event.wait(WAIT_S))
                if fail:
                    raise CheckpointError("cannot write checkpoint: no space left on device")
            save(checkpoint)

        self.store.save = held  # type: ignore[method-assign]

    def let_go(self) -> None:
        """Writes as the store makes them again (the disk has room)."""
        self.store.save = type(self.store).save.__get__(self.store)  # type: ignore[method-assign]


def test_the_share_is_ensured_while_its_prepare_started_entry_is_written(
    node_dirs: NodeDirs,
) -> None:
    claim = resource_claim("a", "early", devices=[share("gpu-0", memory="10Gi")])
    ref = claim_ref(claim)

    async def scenario() -> None:
        async with serving(node_dirs, [claim]) as (runtime, plugin):
            held = HeldWrite(runtime, ref.uid, removal=False, fail=False)
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            assert held.seen == [True], "the ensure waited for the entry's write"
            (made,) = await MpsAgentClient(agent_config(node_dirs).socket_path).list_shares()
            assert made.claim_uid == ref.uid
            # A repeated prepare finds it recorded: nothing is asked of the agent again.
            held.agent.asked.clear()
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            assert not held.agent.asked.is_set()

    run_checked(scenario())


def test_a_failed_prepare_started_write_releases_the_share_ensured_for_it(
    node_dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    claim = resource_claim("a", "unlucky", devices=[share("gpu-0", memory="10Gi")])
    ref = claim_ref(claim)
    caplog.set_level(logging.INFO, logger="dra_driver.plugin.early_shares")

    async def scenario() -> None:
        async with serving(node_dirs, [claim]) as (runtime, plugin):
            held = HeldWrite(runtime, ref.uid, removal=False, fail=True)
            assert "no space left" in (await plugin.prepare([ref]))[ref.uid].error
            assert held.seen == [True], "no ensure during the write"
            agent = MpsAgentClient(agent_config(node_dirs).socket_path)
            assert await agent.list_shares() == [], "the early share outlived its claim"
            held.let_go()  # the kubelet's retry, once the disk has room, prepares it afresh
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            assert [s.claim_uid for s in await agent.list_shares()] == [ref.uid]

    run_checked(scenario())
    assert any(
        "released MPS share" in r.getMessage() and "before its prepare failed" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def held_lull(runtime: Plugin) -> tuple[DeferredReleases, asyncio.Event]:
    """The plugin's deferred releases, their lull held until the event is set."""
    driver = runtime.driver
    assert driver is not None and driver.enforcer is not None
    releases = driver.enforcer.releases
    assert releases is not None, "an MPS v3 plugin defers its releases"
    gate = asyncio.Event()
    lull = releases.lull

    async def held() -> None:
        await gate.wait()
        await lull()

    releases.lull = held
    return releases, gate


def agent_client(dirs: NodeDirs) -> MpsAgentClient:
    return MpsAgentClient(agent_config(dirs).socket_path)


async def shares_of(dirs: NodeDirs) -> list[str]:
    return [s.claim_uid for s in await agent_client(dirs).list_shares()]


def test_an_unprepare_answers_once_the_entry_is_gone_and_the_share_goes_in_a_lull(
    node_dirs: NodeDirs,
) -> None:
    claim = resource_claim("a", "leaving", devices=[share("gpu-0", memory="10Gi")])
    ref = claim_ref(claim)

    async def scenario() -> None:
        async with serving(node_dirs, [claim]) as (runtime, plugin):
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            releases, gate = held_lull(runtime)
            assert (await plugin.unprepare([ref]))[ref.uid] == ""
            assert runtime.driver is not None
            assert ref.uid not in runtime.driver.journal.store.load().claims
            assert await shares_of(node_dirs) == [ref.uid], "released before the lull"
            assert releases.pending == 1
            gate.set()
            await until_shares(agent_client(node_dirs), [], timeout=WAIT_S)
            await eventually(lambda: releases.pending == 0, "the release's answer")
            assert releases.failures == 0

    run_checked(scenario())


def test_a_claim_prepared_again_while_its_release_waits_keeps_its_share(
    node_dirs: NodeDirs,
) -> None:
    """The pending release goes first (the ensure waits for it); none follows the share."""
    claim = resource_claim("a", "back", devices=[share("gpu-0", memory="10Gi")])
    ref = claim_ref(claim)

    async def scenario() -> None:
        async with serving(node_dirs, [claim]) as (runtime, plugin):
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            releases, gate = held_lull(runtime)
            watched = HeldWrite(runtime, ref.uid, removal=False, fail=False, wait=False).agent
            assert (await plugin.unprepare([ref]))[ref.uid] == ""
            assert releases.pending == 1
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            assert watched.released.is_set(), "the pending release was not sent before the ensure"
            assert releases.pending == 0
            gate.set()
            await asyncio.sleep(0.5)  # time for a release, were one still pending
            assert await shares_of(node_dirs) == [ref.uid], "a release followed the new share"
            assert (await plugin.unprepare([ref]))[ref.uid] == ""
            await until_shares(agent_client(node_dirs), [], timeout=WAIT_S)

    run_checked(scenario())


def test_a_failed_removal_keeps_the_entry_and_defers_nothing(node_dirs: NodeDirs) -> None:
    claim = resource_claim("a", "stuck", devices=[share("gpu-0", memory="10Gi")])
    ref = claim_ref(claim)

    async def scenario() -> None:
        async with serving(node_dirs, [claim]) as (runtime, plugin):
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            releases, gate = held_lull(runtime)
            gate.set()
            held = HeldWrite(runtime, ref.uid, removal=True, fail=True, wait=False)
            assert "no space left" in (await plugin.unprepare([ref]))[ref.uid]
            assert ref.uid in held.store.load().claims, "the entry went with the failed write"
            assert releases.pending == 0, "a release deferred for a claim still prepared"
            assert await shares_of(node_dirs) == [ref.uid]
            held.let_go()
            assert (await plugin.unprepare([ref]))[ref.uid] == ""  # the kubelet's retry
            assert ref.uid not in held.store.load().claims
            await until_shares(agent_client(node_dirs), [], timeout=WAIT_S)

    run_checked(scenario())


def test_a_legacy_share_is_released_while_the_entrys_removal_is_written(
    node_dirs: NodeDirs,
) -> None:
    """Legacy MPS: never deferred (the next share may be another namespace's)."""
    claim = resource_claim("a", "leaving", devices=[share("gpu-0", memory="10Gi")])
    ref = claim_ref(claim)

    async def scenario() -> None:
        async with serving(node_dirs, [claim], legacy=True) as (runtime, plugin):
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            held = HeldWrite(runtime, ref.uid, removal=True, fail=False)
            assert (await plugin.unprepare([ref]))[ref.uid] == ""
            assert held.seen == [True], "the release waited for the entry's removal"
            assert await shares_of(node_dirs) == []

    run_checked(scenario())


def test_a_share_inside_a_mig_instance_keeps_the_write_ahead_order() -> None:
    """Only plain shares start early: a MIG instance's changes wait for the entry."""

    asked: list[str] = []

    async def ensure(claim: Any, namespace: Any) -> Any:
        asked.append(namespace.key)
        raise AssertionError("not for this claim")

    async def release(namespace: Any) -> None:
        raise AssertionError("nothing to release")

    async def scenario() -> None:
        cases: list[list[PlannedDevice]] = [
            [mps_in_mig("gpu-0-mig", share_id="s1")],
            [mps_share("gpu-0", share_id="s1"), mig_instance("gpu-1-mig", gpu="GPU-1")],
            [mps_share("gpu-0", share_id=None)],  # no key: the side effects say why
            [],
        ]
        for devices in cases:
            early = EarlyShares(claim_ref(resource_claim("a", "x", devices=[])), ensure, release)
            early.start(devices)
            assert early.started == 0, devices
            await asyncio.sleep(0)
        early = EarlyShares(claim_ref(resource_claim("a", "y", devices=[])), ensure, release)
        early.start([mps_share("gpu-0", share_id="s2")])
        assert early.started == 1
        with pytest.raises(AssertionError, match="not for this claim"):
            await early.take(next(iter(early._tasks)))
        await early.abandon()  # nothing left: nothing released

    asyncio.run(scenario())
    assert asked == ["s2"]


def test_the_side_effects_take_the_namespaces_the_early_start_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain share's namespaces are computed once per prepare: by the early start,
    and the side effects take them for the same devices (any other sequence of
    devices gets its own)."""
    computed: list[int] = []

    def counted(devices: Any) -> Any:
        computed.append(len(devices))
        return mps_namespaces(devices)

    monkeypatch.setattr(early_shares, "mps_namespaces", counted)
    monkeypatch.setattr(enforcement, "mps_namespaces", counted)
    edits = ContainerEdits(env=("CUDA_MPS_PIPE_DIRECTORY=/p",))

    async def ensure(claim: Any, namespace: Any) -> ContainerEdits:
        return edits

    async def release(namespace: Any) -> None:
        raise AssertionError("nothing to release")

    async def scenario() -> None:
        devices = (mps_share("gpu-0", share_id="s1"), mps_share("gpu-0", share_id="s2"))
        ref = claim_ref(resource_claim("a", "x", devices=[]))
        early = EarlyShares(ref, ensure, release)
        early.start(devices)
        assert computed == [2]
        assert early.namespaces(devices) == mps_namespaces(devices)
        assert early.namespaces(list(devices)) is None  # not the sequence it was given
        enforcer = Enforcer(
            backend=FakeGpuBackend("h100-80gb:1", "node"),
            inventory=lambda: Inventory(gpus=()),
            mig_caps=None,
            mps=None,  # every share comes from the early start
        )
        spec = CdiSpec(
            kind="k8s.x/claim",
            devices=tuple(CdiDevice(d.device_name, ContainerEdits()) for d in devices),
        )
        applied, made = await enforcer.apply(ref, devices, spec, early)
        assert computed == [2]
        assert applied == devices
        assert [d.edits.env for d in made.devices] == [edits.env, edits.env]

    asyncio.run(scenario())


def test_a_gpu_claimed_whole_first_has_its_pending_releases_sent(node_dirs: NodeDirs) -> None:
    """The last share's release stops the GPU's daemon (and puts its compute mode back):
    a claim of the whole GPU waits for it, as it waited for the unprepare before."""
    shared = resource_claim("a", "shared", devices=[share("gpu-0", memory="10Gi")])
    whole = resource_claim("b", "whole")
    shared_ref, whole_ref = claim_ref(shared), claim_ref(whole)

    async def scenario() -> None:
        async with serving(node_dirs, [shared, whole]) as (runtime, plugin):
            assert (await plugin.prepare([shared_ref]))[shared_ref.uid].error == ""
            releases, _gate = held_lull(runtime)
            watched = HeldWrite(runtime, shared_ref.uid, removal=False, fail=False, wait=False)
            assert (await plugin.unprepare([shared_ref]))[shared_ref.uid] == ""
            assert releases.pending == 1 and not watched.agent.released.is_set()
            assert (await plugin.prepare([whole_ref]))[whole_ref.uid].error == ""
            assert watched.agent.released.is_set(), "the whole GPU went ahead of the release"
            assert releases.pending == 0
            assert await shares_of(node_dirs) == []

    run_checked(scenario())
