"""MPS shares inside MIG instances, end to end on one node: the real engine, the
mps-agent with the fake ``nvidia-cuda-mps-control`` (real processes), the fake
GPU backend's MIG, the real checkpoint and CDI files.

Two claims share one MIG instance with different limits: the first prepare makes
the instance, the daemon for the instance holds one namespace per claim, the
containers get the instance's capability nodes and their namespace's pipe
directory, and the instance goes after the last unprepare, whichever claim made
it. A pre-existing instance is shared the same way and never destroyed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import pytest

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.model import MigPlacement
from dra_driver.core.prepare import MpsInMig, mig_of
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing, Tenancy
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.state.checkpoint import CheckpointClaim, CheckpointStore, ClaimState
from tests.support.mps import agent_running, gpu_dir
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.planned import mig_plan, mps_in_mig

GIB = 2**30
PARTITION = "gpu-0-mig-1g10gb-19-3"  # a free placement: made by the first prepare
SHARED = NodeSettings(
    per_gpu={"0": GpuSettings(mig_sharing=Sharing.MPS, tenancy=Tenancy.COOPERATIVE)}
)


def _agent(dirs: NodeDirs, compute_mode: FakeComputeMode) -> AgentConfig:
    return AgentConfig(
        socket_path=os.path.join(dirs.plugin, "mps-agent.sock"),
        state_dir=os.path.join(dirs.root, "mps"),
        control_binary=fake_control_path(),
        protocol="v3",
        compute_mode=compute_mode,
        daemon_env={**os.environ, "PYTHON": sys.executable},
    )


def _runtime(dirs: NodeDirs, backend: FakeGpuBackend, source: InMemoryClaimSource) -> PluginParts:
    config = dataclasses.replace(
        dirs.config(),
        settings=SHARED,
        mps_agent_socket=os.path.join(dirs.plugin, "mps-agent.sock"),
    )
    return PluginParts(config, backend, source)


def _spec(dirs: NodeDirs, uid: str) -> Any:
    with open(os.path.join(dirs.cdi, f"k8s.gpu.fractional.dev-claim_{uid}.json")) as handle:
        return json.load(handle)


def _assert_instance_and_namespace(dirs: NodeDirs, uid: str, pipe_dir: str) -> None:
    """The container gets the parent GPU, the instance's GI and CI capability nodes,
    and its own namespace's pipe directory."""
    (device,) = _spec(dirs, uid)["devices"]
    edits = device["containerEdits"]
    paths = [n["path"] for n in edits["deviceNodes"]]
    assert paths[0] == "/dev/nvidia0"
    assert sum(p.startswith("/dev/nvidia-caps/") for p in paths) == 2
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts[pipe_dir] == pipe_dir


def _daemon_visible_devices(agent: AgentConfig, uuid: str) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` the daemon for ``uuid`` started with (the fake records it)."""
    path = os.path.join(gpu_dir(agent.state_dir, uuid), "pipe", "fake-mps-state.json")
    with open(path) as handle:
        visible: str | None = json.load(handle)["visible_devices"]
    return visible


def _checkpoint(dirs: NodeDirs) -> CheckpointStore:
    return CheckpointStore(os.path.join(dirs.plugin, "checkpoint.json"), "boot-1")


@pytest.mark.parametrize("together", [False, True], ids=["one-after-the-other", "one-call"])
def test_two_claims_share_an_instance_made_on_demand(node_dirs: NodeDirs, together: bool) -> None:
    """Prepared in one call, both shares find the placement free when planned and both
    record ``created`` (the backend's create finds the instance the first made);
    one after the other, the second joins the first's instance."""
    backend = FakeGpuBackend("h100-80gb:1:mig", NODE)
    small = resource_claim(
        "a", "small", devices=[share(PARTITION, memory="2Gi", compute_percent=30)]
    )
    big = resource_claim("b", "big", devices=[share(PARTITION, memory="6Gi", compute_percent=60)])
    too_big = resource_claim("c", "too-big", devices=[share(PARTITION, memory="4Gi")])
    refs = [claim_ref(c) for c in (small, big, too_big)]
    compute_mode = FakeComputeMode()
    agent = _agent(node_dirs, compute_mode)
    client = MpsAgentClient(agent.socket_path)

    async def scenario() -> None:
        async with agent_running(agent):
            runtime = await start_plugin(
                _runtime(node_dirs, backend, InMemoryClaimSource([small, big, too_big]))
            )
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER)
                if together:
                    results = await plugin.prepare(refs[:2])
                else:
                    results = {**await plugin.prepare(refs[:1]), **await plugin.prepare(refs[1:2])}
                assert [results[r.uid].error for r in refs[:2]] == ["", ""]
                (instance,) = (await backend.inventory()).gpus[0].mig_devices
                assert (instance.profile_id, instance.placement) == (19, MigPlacement(3, 1))
                # The third does not fit beside them: 2Gi + 6Gi + 4Gi > the instance's memory.
                third = (await plugin.prepare(refs[2:]))[refs[2].uid].error
                assert f"{PARTITION} cannot hold this share" in third

                shares = {s.claim_uid: s for s in await client.list_shares()}
                assert {
                    uid: (s.gpu_uuid, s.memory_limit_bytes, s.active_thread_percentage)
                    for uid, s in shares.items()
                } == {
                    refs[0].uid: (instance.uuid, 2 * GIB, 30),
                    refs[1].uid: (instance.uuid, 6 * GIB, 60),
                }
                # One daemon, for the instance, started with only it visible; no
                # compute mode was touched (that is the parent GPU's).
                (daemon,) = (await client.status()).daemons
                assert daemon.gpu_uuid == instance.uuid
                assert _daemon_visible_devices(agent, instance.uuid) == instance.uuid
                assert compute_mode.modes == {}
                for ref in refs[:2]:
                    _assert_instance_and_namespace(node_dirs, ref.uid, shares[ref.uid].pipe_dir)
                store = _checkpoint(node_dirs)
                created = {
                    uid: mig.created
                    for uid, claim in store.load().claims.items()
                    if (mig := mig_of(claim.devices[0])) is not None
                }
                assert created == {refs[0].uid: True, refs[1].uid: together}

                # The claim that made the instance leaves first: the instance stays for
                # the other, which now owns it; the last one to leave destroys it.
                assert (await plugin.unprepare(refs[:1]))[refs[0].uid] == ""
                assert (await backend.inventory()).gpus[0].mig_devices == (instance,)
                assert [s.claim_uid for s in await client.list_shares()] == [refs[1].uid]
                (left,) = store.load().claims.values()
                assert isinstance(left.devices[0], MpsInMig) and left.devices[0].mig.created
                assert (await plugin.unprepare(refs[1:2]))[refs[1].uid] == ""
                assert (await backend.inventory()).gpus[0].mig_devices == ()
                assert await client.list_shares() == []
                assert (await client.status()).daemons == ()
            finally:
                await kubelet.close()
                await runtime.stop()

    run_checked(scenario())


def test_a_pre_existing_instance_is_shared_and_kept(node_dirs: NodeDirs, tmp_path: Any) -> None:
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(
        "gpus:\n- model: h100-80gb\n  mig: true\n  migInstances: [{profile: 3g.40gb, start: 0}]\n"
    )
    backend = FakeGpuBackend(str(gpus), NODE)
    device = "gpu-0-mig-3g40gb-9-0"
    claims = [
        resource_claim("a", "one", devices=[share(device, memory="10Gi", compute_percent=25)]),
        resource_claim("b", "two", devices=[share(device, memory="20Gi", compute_percent=50)]),
    ]
    refs = [claim_ref(c) for c in claims]
    agent = _agent(node_dirs, FakeComputeMode())
    client = MpsAgentClient(agent.socket_path)

    async def scenario() -> None:
        (instance,) = (await backend.inventory()).gpus[0].mig_devices
        async with agent_running(agent):
            runtime = await start_plugin(_runtime(node_dirs, backend, InMemoryClaimSource(claims)))
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER)
                results = await plugin.prepare(refs)
                assert [results[r.uid].error for r in refs] == ["", ""]
                assert {s.gpu_uuid for s in await client.list_shares()} == {instance.uuid}
                assert not any((await plugin.unprepare(refs)).values())
                assert (await backend.inventory()).gpus[0].mig_devices == (instance,)
                assert await client.list_shares() == []
            finally:
                await kubelet.close()
                await runtime.stop()

    run_checked(scenario())


def test_a_share_rolled_back_at_start_hands_the_instance_to_the_kept_one(
    node_dirs: NodeDirs,
) -> None:
    """Crash during the prepare of a share that made the instance while another
    claim's share of it had already completed: the instance stays, owned by the
    kept claim, and the half-done share's namespace is released."""
    backend = FakeGpuBackend("h100-80gb:1:mig", NODE)

    async def scenario() -> None:
        gpu = (await backend.inventory()).gpus[0]
        made = await backend.create_mig_device(gpu.uuid, 19, MigPlacement(3, 1))
        mig = mig_plan(
            19, "1g.10gb", 3, 1, uuid=made.uuid, gi_id=made.gi_id, ci_id=made.ci_id, created=True
        )

        def entry(uid: str, state: ClaimState, created: bool) -> CheckpointClaim:
            device = mps_in_mig(
                PARTITION,
                pool=NODE,
                gpu=gpu.uuid,
                share_id=f"share-{uid[-4:]}",
                mig=dataclasses.replace(mig, created=created),
            )
            return CheckpointClaim(ClaimRef("ns", uid[-4:], ClaimUID(uid)), state, (device,))

        half = entry("7b1e0000-0000-4000-8000-00000000dead", ClaimState.PREPARE_STARTED, True)
        kept = entry("7b1e0000-0000-4000-8000-00000000cafe", ClaimState.PREPARE_COMPLETED, False)
        store = _checkpoint(node_dirs)
        store.save(store.load().with_claim(half).with_claim(kept))

        runtime = await start_plugin(_runtime(node_dirs, backend, InMemoryClaimSource([])))
        try:
            assert (await backend.inventory()).gpus[0].mig_devices == (made,)
            (left,) = store.load().claims.values()
            assert left.ref.uid == kept.ref.uid
            assert isinstance(left.devices[0], MpsInMig) and left.devices[0].mig.created
        finally:
            await runtime.stop()

    run_checked(scenario())
