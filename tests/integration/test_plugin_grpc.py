"""The kubelet plugin over real unix sockets, driven by the kubelet-like client."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket as pysocket
import uuid
from typing import Any

import grpc
import pytest

from dra_driver._gen.dra.v1 import api_pb2 as v1_pb2
from dra_driver._gen.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._gen.pluginregistration.v1 import api_pb2 as reg_pb2
from dra_driver._gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.app.plugin import start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.kubelet import FakeKubelet, RegistrationFailed
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim, share
from dra_driver.kubeletplugin.health import DeviceHealthState, Health
from dra_driver.state.checkpoint import CheckpointStore, ClaimState
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked, serving

KIND = "k8s.gpu.fractional.dev/claim"


def checkpoint_of(dirs: NodeDirs) -> CheckpointStore:
    return CheckpointStore(os.path.join(dirs.plugin, "checkpoint.json"), "boot-1")


def test_registration_handshake(node_dirs: NodeDirs) -> None:
    async def scenario() -> None:
        runtime = await start_plugin(node_dirs.parts(InMemoryClaimSource()))
        try:
            reg_socket = os.path.join(node_dirs.registry, f"{DRIVER}-reg.sock")
            dra_socket = os.path.join(node_dirs.plugin, "dra.sock")
            assert os.path.exists(reg_socket) and os.path.exists(dra_socket)
            async with grpc.aio.insecure_channel(f"unix://{reg_socket}") as channel:
                info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest())
            assert info.type == "DRAPlugin"
            assert info.name == DRIVER
            assert info.endpoint == dra_socket and os.path.isabs(info.endpoint)
            assert list(info.supported_versions) == [
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            ]
            kubelet = FakeKubelet(node_dirs.registry)
            plugin = await kubelet.wait_for_plugin(DRIVER)
            assert plugin.service == "v1.DRAPlugin"
            assert runtime.server is not None
            await asyncio.wait_for(runtime.server.registration.changed.wait(), 5)
            assert runtime.server.registration.registered
            await kubelet.close()
        finally:
            await runtime.stop()
        assert not os.path.exists(os.path.join(node_dirs.registry, f"{DRIVER}-reg.sock"))
        assert not os.path.exists(os.path.join(node_dirs.plugin, "dra.sock"))

    run_checked(scenario())


def test_rejected_registration_is_surfaced(
    node_dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        runtime = await start_plugin(node_dirs.parts(InMemoryClaimSource()))
        try:
            # A kubelet that knows no DRAPlugin version we offer rejects us.
            kubelet = FakeKubelet(node_dirs.registry, known_services=["v9.DRAPlugin"])
            with pytest.raises(RegistrationFailed, match="no supported DRAPlugin service"):
                await kubelet.wait_for_plugin(DRIVER)
            assert runtime.server is not None
            state = runtime.server.registration
            assert not state.registered
            assert state.error is not None and "v9.DRAPlugin" in state.error
            await kubelet.close()
        finally:
            await runtime.stop()

    with caplog.at_level(logging.ERROR):
        run_checked(scenario())
    assert any("rejected the registration" in r.getMessage() for r in caplog.records)


def test_dra_socket_is_up_before_registration_socket(node_dirs: NodeDirs) -> None:
    async def scenario() -> None:
        reg_socket = os.path.join(node_dirs.registry, f"{DRIVER}-reg.sock")
        dra_socket = os.path.join(node_dirs.plugin, "dra.sock")
        seen: list[bool] = []

        async def watch() -> None:
            while not os.path.exists(reg_socket):
                await asyncio.sleep(0)
            seen.append(os.path.exists(dra_socket))

        watcher = asyncio.create_task(watch())
        runtime = await start_plugin(node_dirs.parts(InMemoryClaimSource()))
        await asyncio.wait_for(watcher, 5)
        await runtime.stop()
        assert seen == [True]

    run_checked(scenario())


def test_stale_sockets_removed_and_rolling_update_names(node_dirs: NodeDirs) -> None:
    uid = "0f5c1b3e-8c1d-4d7e-9d7c-1b2a3c4d5e6f"
    stale = os.path.join(node_dirs.plugin, f"dra-{uid}.sock")
    sock = pysocket.socket(pysocket.AF_UNIX)
    sock.bind(stale)
    sock.close()

    async def scenario() -> None:
        runtime = await start_plugin(node_dirs.parts(InMemoryClaimSource(), rolling_update_uid=uid))
        try:
            assert runtime.sockets.registration == os.path.join(
                node_dirs.registry, f"{DRIVER}-{uid}-reg.sock"
            )
            kubelet = FakeKubelet(node_dirs.registry)
            plugin = await kubelet.wait_for_plugin(DRIVER)
            assert plugin.endpoint == stale
            assert await plugin.unprepare([ClaimRef("ns", "x", ClaimUID("u"))]) == {"u": ""}
            await kubelet.close()
        finally:
            await runtime.stop()
        assert os.listdir(node_dirs.registry) == []

    run_checked(scenario())


def _claims(node: str = NODE) -> dict[str, dict[str, Any]]:
    return {
        "exclusive": resource_claim("team-a", "train", node=node, devices=[Allocated("gpu-0")]),
        "two-requests": resource_claim(
            "team-a",
            "pair",
            node=node,
            devices=[Allocated("gpu-1", request="a"), Allocated("gpu-2", request="b/small")],
        ),
        "share": resource_claim(
            "team-b",
            "share",
            node=node,
            devices=[share("gpu-3", share_id="9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f")],
        ),
    }


@pytest.mark.parametrize(
    "services", [["v1.DRAPlugin"], ["v1beta1.DRAPlugin"]], ids=["v1", "v1beta1"]
)
def test_prepare_and_unprepare_several_claims_in_one_call(
    node_dirs: NodeDirs, services: list[str]
) -> None:
    claims = _claims()
    source = InMemoryClaimSource(claims.values())

    async def scenario() -> None:
        async with serving(node_dirs, source, known_services=services) as (_, plugin):
            assert plugin.service == services[0]
            refs = [claim_ref(c) for c in claims.values()]
            results = await plugin.prepare(refs)
            assert {uid: r.error for uid, r in results.items()} == {r.uid: "" for r in refs}

            exclusive = results[claim_ref(claims["exclusive"]).uid].devices
            assert [(d.pool_name, d.device_name, d.request_names) for d in exclusive] == [
                (NODE, "gpu-0", ("gpu",))
            ]
            uid = claim_ref(claims["exclusive"]).uid
            assert exclusive[0].cdi_device_ids == (f"{KIND}={uid}-gpu-0",)
            assert exclusive[0].share_id is None

            pair = results[claim_ref(claims["two-requests"]).uid].devices
            assert [(d.device_name, d.request_names) for d in pair] == [
                ("gpu-1", ("a",)),
                ("gpu-2", ("b",)),  # sub-request "b/small" → main request "b"
            ]
            share = results[claim_ref(claims["share"]).uid].devices
            # v1beta1 has no share_id field: the kubelet just does not learn it.
            shared = "9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f"
            assert share[0].share_id == (shared if services == ["v1.DRAPlugin"] else None)

            # One transient spec per claim, loadable, naming the devices we returned.
            assert len(node_dirs.cdi_files()) == 3
            with open(
                os.path.join(node_dirs.cdi, f"k8s.gpu.fractional.dev-claim_{uid}.json"),
                encoding="utf-8",
            ) as handle:
                spec = json.load(handle)
            assert spec["kind"] == KIND
            assert spec["cdiVersion"] in ("0.3.0", "0.5.0")
            assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-0"]
            nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
            # The fake backend gives harmless stand-ins (/dev/null's 1:3), not 195:N.
            assert nodes == [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3}]
            assert spec["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidiactl"

            checkpoint = checkpoint_of(node_dirs).load()
            assert set(checkpoint.claims) == {r.uid for r in refs}
            assert {c.state for c in checkpoint.claims.values()} == {ClaimState.PREPARE_COMPLETED}

            assert await plugin.unprepare(refs) == {r.uid: "" for r in refs}
            assert node_dirs.cdi_files() == []
            assert checkpoint_of(node_dirs).load().claims == {}

    run_checked(scenario())


def test_bad_claims_fail_alone(node_dirs: NodeDirs) -> None:
    good = resource_claim("ns", "good", devices=[Allocated("gpu-0")])
    unallocated = resource_claim("ns", "pending", allocated=False)
    elsewhere = resource_claim("ns", "elsewhere", node="node-b", devices=[Allocated("gpu-1")])
    replaced = resource_claim("ns", "replaced", devices=[Allocated("gpu-2")])
    deleted = resource_claim("ns", "deleted", devices=[Allocated("gpu-3")])
    unknown_device = resource_claim("ns", "ghost", devices=[Allocated("gpu-9")])
    source = InMemoryClaimSource([good, unallocated, elsewhere, replaced, unknown_device])
    old_replaced_ref = ClaimRef("ns", "replaced", ClaimUID(str(uuid.uuid4())))

    async def scenario() -> None:
        async with serving(node_dirs, source) as (_, plugin):
            refs = [
                claim_ref(good),
                claim_ref(unallocated),
                claim_ref(elsewhere),
                old_replaced_ref,
                claim_ref(deleted),
                claim_ref(unknown_device),
            ]
            results = await plugin.prepare(refs)
            assert results[claim_ref(good).uid].error == ""
            assert results[claim_ref(good).uid].devices[0].device_name == "gpu-0"
            expectations = {
                claim_ref(unallocated): "not allocated",
                claim_ref(elsewhere): "allocated to node node-b",
                old_replaced_ref: "deleted and re-created",
                claim_ref(deleted): "does not exist",
                claim_ref(unknown_device): "device gpu-9 is not on this node",
            }
            for ref, cause in expectations.items():
                error = results[ref.uid].error
                assert str(ref) in error, error
                assert cause in error, error
                assert results[ref.uid].devices == ()
            good_spec = f"k8s.gpu.fractional.dev-claim_{claim_ref(good).uid}.json"
            assert node_dirs.cdi_files() == [good_spec]
            assert set(checkpoint_of(node_dirs).load().claims) == {claim_ref(good).uid}

    run_checked(scenario())


def test_prepare_is_idempotent_and_unprepare_of_unknown_succeeds(node_dirs: NodeDirs) -> None:
    claim = resource_claim("ns", "c", devices=[Allocated("gpu-0")])
    source = InMemoryClaimSource([claim])

    async def scenario() -> None:
        async with serving(node_dirs, source) as (_, plugin):
            first = await plugin.prepare([claim_ref(claim)])
            spec_path = os.path.join(node_dirs.cdi, node_dirs.cdi_files()[0])
            mtime = os.stat(spec_path).st_mtime_ns
            # The claim may even be gone from the API: the recorded result stands.
            source.delete("ns", "c")
            second = await plugin.prepare([claim_ref(claim)])
            assert first == second and first[claim_ref(claim).uid].error == ""
            assert os.stat(spec_path).st_mtime_ns == mtime, "repeat must not rewrite the spec"
            unknown = ClaimRef("ns", "never", ClaimUID("3c1d"))
            assert await plugin.unprepare([claim_ref(claim), unknown]) == {
                claim_ref(claim).uid: "",
                "3c1d": "",
            }
            assert await plugin.unprepare([claim_ref(claim)]) == {claim_ref(claim).uid: ""}
            assert node_dirs.cdi_files() == []

    run_checked(scenario())


def test_exclusive_device_is_never_given_twice(node_dirs: NodeDirs) -> None:
    first = resource_claim("ns", "first", devices=[Allocated("gpu-0")])
    second = resource_claim("ns", "second", devices=[Allocated("gpu-0")])
    source = InMemoryClaimSource([first, second])

    async def scenario() -> None:
        async with serving(node_dirs, source) as (_, plugin):
            assert (await plugin.prepare([claim_ref(first)]))[claim_ref(first).uid].error == ""
            error = (await plugin.prepare([claim_ref(second)]))[claim_ref(second).uid].error
            assert "already prepared for claim" in error and str(claim_ref(second)) in error
            await plugin.unprepare([claim_ref(first)])
            assert (await plugin.prepare([claim_ref(second)]))[claim_ref(second).uid].error == ""

    run_checked(scenario())


def test_fifty_concurrent_prepare_calls(node_dirs: NodeDirs) -> None:
    claims = [resource_claim("load", f"c{i}", devices=[share(f"gpu-{i % 8}")]) for i in range(50)]
    source = InMemoryClaimSource(claims)

    async def scenario() -> None:
        async with serving(node_dirs, source, gpus="h100-80gb:8") as (_, plugin):
            results = await asyncio.gather(*(plugin.prepare([claim_ref(c)]) for c in claims))
            assert all(
                r[claim_ref(c).uid].error == "" for r, c in zip(results, claims, strict=True)
            )
            checkpoint = checkpoint_of(node_dirs).load()
            assert sorted(checkpoint.claims) == sorted(claim_ref(c).uid for c in claims)
            assert len(node_dirs.cdi_files()) == 50
            # Each claim's devices are its own, not another claim's.
            for result, claim in zip(results, claims, strict=True):
                uid = claim_ref(claim).uid
                assert result[uid].devices[0].cdi_device_ids[0].startswith(f"{KIND}={uid}-")
            unprepared = await asyncio.gather(*(plugin.unprepare([claim_ref(c)]) for c in claims))
            assert all(not any(u.values()) for u in unprepared)
            assert checkpoint_of(node_dirs).load().claims == {}
            assert node_dirs.cdi_files() == []

    run_checked(scenario())


def test_health_streams_v1alpha1_and_v1(node_dirs: NodeDirs) -> None:
    async def scenario() -> None:
        async with serving(node_dirs, InMemoryClaimSource(), gpus="l4:2") as (runtime, plugin):
            assert runtime.server is not None
            initial = runtime.server.health.snapshot()[1]
            for version in ("v1alpha1", "v1"):
                await runtime.server.health.update(initial)
                stream = plugin.watch_health(version)
                first = await anext(stream)
                assert [
                    (d.device.pool_name, d.device.device_name, d.health) for d in first.devices
                ] == [(NODE, "gpu-0", 1), (NODE, "gpu-1", 1)]
                await runtime.server.health.update(
                    [DeviceHealthState(NODE, "gpu-0", Health.UNHEALTHY, 5, "x" * 2000)]
                )
                second = await anext(stream)
                assert [(d.device.device_name, d.health) for d in second.devices] == [("gpu-0", 2)]
                assert len(second.devices[0].message) == 1024
                await stream.aclose()

    run_checked(scenario())


def test_request_without_claim_uid_is_a_whole_call_error(node_dirs: NodeDirs) -> None:
    async def scenario() -> None:
        async with serving(node_dirs, InMemoryClaimSource()) as (_, plugin):
            stub = v1_grpc.DRAPluginStub(plugin.channel)
            request = v1_pb2.NodePrepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace="ns", name="no-uid")]
            )
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.NodePrepareResources(request)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "namespace, name and uid" in (info.value.details() or "")

    run_checked(scenario())
