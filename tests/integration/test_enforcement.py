"""The plugin enforcing shares and MIG devices: the real engine, the mps-agent with the
fake nvidia-cuda-mps-control (real processes), the fake GPU backend's MIG."""

from __future__ import annotations

import json
import os
from typing import Any

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.model import MigPlacement
from dra_driver.core.prepare import MigInstance
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim, share
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.state.checkpoint import CheckpointClaim, CheckpointStore, ClaimState
from tests.support.mps import agent_config, agent_running, mps_parts, until_shares
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.planned import mig_instance, mig_plan


def spec_of(dirs: NodeDirs, uid: str) -> Any:
    with open(os.path.join(dirs.cdi, f"k8s.gpu.fractional.dev-claim_{uid}.json")) as handle:
        return json.load(handle)


async def daemon_pids(client: MpsAgentClient) -> list[int | None]:
    return [d.pid for d in (await client.status()).daemons]


def test_mps_shares_of_two_claims_on_one_gpu(node_dirs: NodeDirs) -> None:
    agent = agent_config(node_dirs)
    small = resource_claim(
        "a", "small", devices=[share("gpu-0", memory="10Gi", compute_percent=25)]
    )
    big = resource_claim("b", "big", devices=[share("gpu-0", memory="20Gi", compute_percent=50)])
    too_big = resource_claim("c", "too-big", devices=[share("gpu-0", memory="60Gi")])
    source = InMemoryClaimSource([small, big, too_big])
    refs = [claim_ref(c) for c in (small, big, too_big)]
    client = MpsAgentClient(agent.socket_path)

    async def scenario() -> None:
        async with agent_running(agent):
            runtime = await start_plugin(mps_parts(node_dirs, source))
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER)
                results = await plugin.prepare(refs)
                assert results[refs[0].uid].error == "" and results[refs[1].uid].error == ""
                assert "gpu-0 cannot hold this share" in results[refs[2].uid].error
                shares = {s.claim_uid: s for s in await client.list_shares()}
                assert set(shares) == {refs[0].uid, refs[1].uid}
                assert shares[refs[0].uid].memory_limit_bytes == 10 * 2**30
                assert shares[refs[0].uid].active_thread_percentage == 25
                assert shares[refs[1].uid].active_thread_percentage == 50
                (device,) = spec_of(node_dirs, refs[0].uid)["devices"]
                edits = device["containerEdits"]
                pipe = shares[refs[0].uid].pipe_dir
                # At its host path, as NVIDIA's guide mounts it (issue 26, finding 8).
                assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in edits["env"]
                mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
                assert mounts[pipe] == pipe
                # v3: the container keeps its own /dev/shm, no claim shares another's.
                assert "/dev/shm" not in mounts, mounts
            finally:
                await kubelet.close()
                await runtime.stop()

            # The plugin restarts (upgrade, crash): the daemon and the shares stay,
            # and a share no prepared claim owns is released.
            pids = await daemon_pids(client)
            await client.ensure_share(
                shares[refs[0].uid].gpu_uuid,
                "0e0e0e0e-0000-4000-8000-000000000000",
                claim_uid="deleted-claim",
                memory_limit_bytes=2**30,
                active_thread_percentage=10,
            )
            runtime = await start_plugin(mps_parts(node_dirs, source))
            try:
                assert {s.claim_uid for s in await client.list_shares()} == {
                    refs[0].uid,
                    refs[1].uid,
                }
                assert await daemon_pids(client) == pids
                kubelet = FakeKubelet(node_dirs.registry)
                plugin = await kubelet.wait_for_plugin(DRIVER)
                assert not any((await plugin.unprepare(refs)).values())
                await until_shares(client, [])
                await kubelet.close()
            finally:
                await runtime.stop()

    run_checked(scenario())


def test_a_claims_two_shares_of_one_gpu_are_one_namespace(node_dirs: NodeDirs) -> None:
    """count: 2 on one GPU (two results, two shareIDs): the container sees one pipe dir."""
    agent = agent_config(node_dirs)
    claim = resource_claim(
        "ns",
        "pair",
        devices=[
            share("gpu-0", memory="4Gi", compute_percent=10),
            share("gpu-0", memory="6Gi", compute_percent=20),
        ],
    )
    client = MpsAgentClient(agent.socket_path)

    async def scenario() -> None:
        async with agent_running(agent):
            runtime = await start_plugin(mps_parts(node_dirs, InMemoryClaimSource([claim])))
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER)
                ref = claim_ref(claim)
                result = (await plugin.prepare([ref]))[ref.uid]
                assert result.error == "" and len(result.devices) == 2
                assert len({d.share_id for d in result.devices}) == 2
                (one,) = await client.list_shares()
                assert (one.memory_limit_bytes, one.active_thread_percentage) == (10 * 2**30, 30)
                pipes = {
                    m["hostPath"]
                    for d in spec_of(node_dirs, ref.uid)["devices"]
                    for m in d["containerEdits"]["mounts"]
                    if m["containerPath"] != "/dev/shm"
                }
                assert pipes == {one.pipe_dir}
                assert (await plugin.unprepare([ref]))[ref.uid] == ""
                await until_shares(client, [])
            finally:
                await kubelet.close()
                await runtime.stop()

    run_checked(scenario())


def test_mig_device_created_at_prepare_and_destroyed_at_unprepare(node_dirs: NodeDirs) -> None:
    backend = FakeGpuBackend("h100-80gb:1:mig", NODE)
    claim = resource_claim("ns", "mig", devices=[Allocated("gpu-0-mig-1g10gb-19-3")])

    async def scenario() -> None:
        runtime = await start_plugin(
            PluginParts(node_dirs.config(), backend, InMemoryClaimSource([claim]))
        )
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            ref = claim_ref(claim)
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            (created,) = (await backend.inventory()).gpus[0].mig_devices
            assert (created.profile_id, created.placement) == (19, MigPlacement(3, 1))
            store = CheckpointStore(os.path.join(node_dirs.plugin, "checkpoint.json"), "boot-1")
            (device,) = store.load().claims[ref.uid].devices
            assert isinstance(device, MigInstance) and device.mig.created
            assert device.mig.mig_uuid == created.uuid
            (cdi_device,) = spec_of(node_dirs, ref.uid)["devices"]
            paths = [n["path"] for n in cdi_device["containerEdits"]["deviceNodes"]]
            assert paths[0] == "/dev/nvidia0"
            assert sum(p.startswith("/dev/nvidia-caps/") for p in paths) == 2
            # A repeat is answered from the checkpoint: no second instance.
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            assert len((await backend.inventory()).gpus[0].mig_devices) == 1
            assert (await plugin.unprepare([ref]))[ref.uid] == ""
            assert (await backend.inventory()).gpus[0].mig_devices == ()
        finally:
            await kubelet.close()
            await runtime.stop()

    run_checked(scenario())


def test_instance_of_a_prepare_that_died_is_destroyed_at_start(node_dirs: NodeDirs) -> None:
    """Crash after the MIG instance was created, before PrepareCompleted."""
    backend = FakeGpuBackend("h100-80gb:1:mig", NODE)

    async def scenario() -> None:
        gpu = (await backend.inventory()).gpus[0]
        await backend.create_mig_device(gpu.uuid, 19, MigPlacement(3, 1))
        uid = ClaimUID("7b1e0000-0000-4000-8000-00000000dead")
        half_done = CheckpointClaim(
            ref=ClaimRef("ns", "crashed", uid),
            state=ClaimState.PREPARE_STARTED,
            devices=(
                mig_instance(
                    "gpu-0-mig-1g10gb-19-3",
                    pool=NODE,
                    gpu=gpu.uuid,
                    mig=mig_plan(19, "1g.10gb", 3, 1),
                ),
            ),
        )
        store = CheckpointStore(os.path.join(node_dirs.plugin, "checkpoint.json"), "boot-1")
        store.save(store.load().with_claim(half_done))
        runtime = await start_plugin(
            PluginParts(node_dirs.config(), backend, InMemoryClaimSource())
        )
        await runtime.stop()
        assert runtime.reconcile_report is not None
        assert runtime.reconcile_report.rolled_back == (uid,)
        assert (await backend.inventory()).gpus[0].mig_devices == ()

    run_checked(scenario())
