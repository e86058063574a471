"""The controller against the fake API over HTTP: real list+watch, real writes.

Slices come from the real builder (fake H100s, ``allocator: controller``, 1.34
capabilities so shares are policy attributes); the DeviceClass
``share.gpu.fractional.dev`` carries the sentinel selector.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
from fractions import Fraction

import pytest

from dra_driver.allocator import node_fits_pod
from dra_driver.base.quantity import parse_quantity
from dra_driver.controller.informer import CLAIMS, Informer
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.reconcile import FINALIZER, REJECTED_ANNOTATION
from dra_driver.k8s.transport import api_transport
from dra_driver.k8s.watch import MERGE_PATCH
from tests.support import controller_env
from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    DRIVER,
    GI,
    JsonObj,
    allocation_of,
    controller_client,
    events_for,
    make_pod,
    running,
    seed_node,
    settled,
    share_class,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)
"""The controller runs as its ServiceAccount under the chart's RBAC."""

# --- seeding: nodes with zone labels, the class and claims with config -----------------


def seed_cluster(api: FakeKubeApi, nodes: dict[str, str]) -> None:
    """``nodes``: name -> fake GPU spec (e.g. ``h100-80gb:2``); label ``zone: <node>``."""
    for node, spec in nodes.items():
        seed_node(api, node, spec, labels={"zone": node})
    class_config = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.fractional.dev/v1alpha1",
                "kind": "GpuConfig",
                "from": "class",
            },
        }
    }
    api.create(share_class(config=[class_config]))


def make_claim(
    api: FakeKubeApi, name: str, memory: str = "10Gi", config: list[JsonObj] | None = None
) -> JsonObj:
    """A claim in ``default``; every claim here carries ``spec.devices.config``."""
    return controller_env.make_claim(api, name, memory, config=config or [])


def claim_of(api: FakeKubeApi, name: str) -> JsonObj:
    return api.get("ResourceClaim", name, "default")


def node_of(allocation: JsonObj) -> str:
    return str(allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0])


# --- tests -----------------------------------------------------------------------------


def test_allocates_only_with_a_pod_and_writes_like_the_scheduler(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:2"})
    claim_config = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "gpu.fractional.dev/v1alpha1", "kind": "GpuConfig"},
        }
    }
    make_claim(fake_kube, "c1", config=[claim_config])

    async def scenario() -> None:
        async with running(fake_kube, allocation_events=True) as controller:
            await settled(controller)
            assert allocation_of(fake_kube, "c1") is None
            assert FINALIZER not in (claim_of(fake_kube, "c1")["metadata"].get("finalizers") or [])
            fake_kube.clear_requests()
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: allocation_of(fake_kube, "c1") is not None)
            await eventually(lambda: events_for(fake_kube, "c1", "Allocated"))

    asyncio.run(scenario())
    claim = claim_of(fake_kube, "c1")
    assert FINALIZER in claim["metadata"]["finalizers"]
    writes = [r for r in fake_kube.request_log if r.method != "GET" and "resourceclaims" in r.path]
    assert [(r.method, r.content_type) for r in writes] == [("PATCH", MERGE_PATCH)] * 2
    assert writes[0].path.endswith("/resourceclaims/c1"), "finalizer first"
    assert writes[1].path.endswith("/resourceclaims/c1/status"), "then the allocation"
    # Only what changes, guarded by the resourceVersion read: never the spec.
    for write in writes:
        body = json.loads(write.body)
        assert "spec" not in body and body["metadata"]["resourceVersion"]
        assert write.body == json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    # A claim any pod may name by resourceClaimName: the scheduler reserves it, pod by
    # pod, as it binds them.
    assert "reservedFor" not in claim["status"]
    alloc = claim["status"]["allocation"]
    datetime.datetime.fromisoformat(alloc["allocationTimestamp"].replace("Z", "+00:00"))
    assert node_of(alloc) == "node-a"
    (result,) = alloc["devices"]["results"]
    assert result["shareID"] and result["consumedCapacity"]["memory"] == "10Gi"
    sources = [(c["source"], c["opaque"]["parameters"]["kind"]) for c in alloc["devices"]["config"]]
    assert sources == [
        ("FromClass", "GpuConfig"),
        ("FromClaim", "GpuConfig"),
        ("FromClaim", "GpuShareGrant"),
    ]
    grant = alloc["devices"]["config"][2]["opaque"]["parameters"]
    assert grant["shareID"] == result["shareID"] and grant["device"] == result["device"]
    (event,) = events_for(fake_kube, "c1", "Allocated")
    assert "node-a" in event["message"] and "10Gi" in event["message"]


def test_pod_constraints_pick_another_node(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:2", "node-b": "h100-80gb:2"})
    node_a = fake_kube.get("Node", "node-a")
    node_a["spec"] = {"taints": [{"key": "gpu", "value": "busy", "effect": "NoSchedule"}]}
    make_claim(fake_kube, "free")
    make_claim(fake_kube, "steered")
    make_claim(fake_kube, "tainted")

    async def scenario() -> None:
        async with running(fake_kube):
            make_pod(fake_kube, "p-free", "free")
            await eventually(lambda: allocation_of(fake_kube, "free") is not None)
            make_pod(fake_kube, "p-steered", "steered", nodeSelector={"zone": "node-b"})
            await eventually(lambda: allocation_of(fake_kube, "steered") is not None)
            fake_kube.update(node_a)  # now node-a has a taint the next pod does not tolerate
            await asyncio.sleep(0.3)
            make_pod(fake_kube, "p-tainted", "tainted")
            await eventually(lambda: allocation_of(fake_kube, "tainted") is not None)

    asyncio.run(scenario())
    free = allocation_of(fake_kube, "free")
    steered = allocation_of(fake_kube, "steered")
    tainted = allocation_of(fake_kube, "tainted")
    assert free and steered and tainted
    assert node_of(free) == "node-a"  # best fit on equal nodes: the first
    assert node_of(steered) == "node-b"
    assert node_of(tainted) == "node-b"


def test_cleared_allocation_is_redone_elsewhere(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1", "node-b": "h100-80gb:1"})
    make_claim(fake_kube, "c1")

    async def scenario() -> None:
        async with running(fake_kube):
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: allocation_of(fake_kube, "c1") is not None)
            alloc = allocation_of(fake_kube, "c1")
            assert alloc is not None and node_of(alloc) == "node-a"
            claim = claim_of(fake_kube, "c1")  # the scheduler's PostFilter clears it
            claim["status"] = {}
            fake_kube.update_status(claim)
            await eventually(
                lambda: (a := allocation_of(fake_kube, "c1")) is not None and node_of(a) == "node-b"
            )

    asyncio.run(scenario())
    annotations = claim_of(fake_kube, "c1")["metadata"]["annotations"]
    assert annotations[REJECTED_ANNOTATION] == "node-a"
    assert events_for(fake_kube, "c1", "NodeRejected")


def test_unreserved_claim_without_pod_is_deallocated(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "c1")

    async def scenario() -> None:
        async with running(fake_kube):
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: allocation_of(fake_kube, "c1") is not None)
            fake_kube.delete("Pod", "p1", "default")
            await eventually(lambda: allocation_of(fake_kube, "c1") is None)
            await eventually(
                lambda: FINALIZER not in (claim_of(fake_kube, "c1")["metadata"]["finalizers"])
            )

    asyncio.run(scenario())
    assert events_for(fake_kube, "c1", "Deallocated")


def test_conflicts_are_retried(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "c1")
    fake_kube.fail_next("PATCH", "/resourceclaims/c1/status", 409)
    fake_kube.fail_next("PATCH", "/resourceclaims/c1", 409)

    async def scenario() -> None:
        async with running(fake_kube):
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: allocation_of(fake_kube, "c1") is not None)

    asyncio.run(scenario())
    status_writes = [p for m, p in fake_kube.requests if m == "PATCH" and p.endswith("c1/status")]
    assert len(status_writes) == 2
    assert FINALIZER in claim_of(fake_kube, "c1")["metadata"]["finalizers"]


def _used_memory(api: FakeKubeApi) -> dict[tuple[str, str], Fraction]:
    used: dict[tuple[str, str], Fraction] = {}
    for claim in api.objects("ResourceClaim"):
        for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []:
            key = (r["pool"], r["device"])
            used[key] = used.get(key, Fraction(0)) + parse_quantity(r["consumedCapacity"]["memory"])
    return used


def _allocated(api: FakeKubeApi) -> int:
    return sum(1 for c in api.objects("ResourceClaim") if (c.get("status") or {}).get("allocation"))


def test_assume_cache_prevents_double_booking(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:2"})
    capacity = Fraction(81559 * 1024**2)  # the fake H100's memory
    fits = 2 * int(capacity // (10 * GI))

    async def scenario() -> None:
        async with running(fake_kube, claim_watch_lag_s=1.0) as controller:
            for i in range(50):
                make_claim(fake_kube, f"c{i}")
                make_pod(fake_kube, f"p{i}", f"c{i}")
            await eventually(lambda: _allocated(fake_kube) >= fits, timeout=60)
            await settled(controller)

    asyncio.run(scenario())
    assert _allocated(fake_kube) == fits
    used = _used_memory(fake_kube)
    assert len(used) == 2
    assert all(v <= capacity for v in used.values()), used
    unfit = [c for c in fake_kube.objects("ResourceClaim") if not c.get("status")]
    assert unfit and all(
        events_for(fake_kube, c["metadata"]["name"], "CannotAllocate") for c in unfit
    )


def test_only_the_leader_writes(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "c1")
    make_claim(fake_kube, "c2")

    async def scenario() -> None:
        async with running(fake_kube, identity="one") as one:
            await eventually(lambda: one.elector.is_leader)
            async with running(fake_kube, identity="two") as two:
                await asyncio.sleep(0.5)
                make_pod(fake_kube, "p1", "c1")
                await eventually(lambda: allocation_of(fake_kube, "c1") is not None)
                await asyncio.sleep(0.5)
                assert not two.elector.is_leader
                assert one.writes >= 2 and two.writes == 0
                lease = fake_kube.get(
                    "Lease", "fractional-gpu-dra-controller", controller_env.LEASE_NAMESPACE
                )
                assert lease["spec"]["holderIdentity"] == "one"
                await asyncio.sleep(0)
            # "two" stopped without ever leading; now "one" stops and releases, a new one leads
        async with running(fake_kube, identity="three") as three:
            await eventually(lambda: three.elector.is_leader, timeout=5)
            make_pod(fake_kube, "p2", "c2")
            await eventually(lambda: allocation_of(fake_kube, "c2") is not None)
            # The server shows the status write before the controller counts it.
            await eventually(lambda: three.writes >= 2)

    asyncio.run(scenario())


def test_restart_rebuilds_the_ledger_from_allocated_claims(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    capacity = Fraction(81559 * 1024**2)
    fits = int(capacity // (10 * GI))

    async def scenario() -> None:
        async with running(fake_kube, identity="first"):
            for i in range(4):
                make_claim(fake_kube, f"a{i}")
                make_pod(fake_kube, f"pa{i}", f"a{i}")
            await eventually(lambda: _allocated(fake_kube) == 4)
        async with running(fake_kube, identity="second") as second:
            for i in range(fits):
                make_claim(fake_kube, f"b{i}")
                make_pod(fake_kube, f"pb{i}", f"b{i}")
            await eventually(lambda: _allocated(fake_kube) >= fits, timeout=30)
            await settled(second)

    asyncio.run(scenario())
    assert _allocated(fake_kube) == fits
    assert all(v <= capacity for v in _used_memory(fake_kube).values())


def test_forged_grant_is_refused(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    forged = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.fractional.dev/v1alpha1",
                "kind": "GpuShareGrant",
                "device": "gpu-0",
                "shareID": "00000000-0000-0000-0000-000000000001",
                "memory": "80Gi",
                "computePercent": 100,
            },
        }
    }
    make_claim(fake_kube, "c1", config=[forged])

    async def scenario() -> None:
        async with running(fake_kube) as controller:
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: events_for(fake_kube, "c1", "AllocationRefused"))
            await settled(controller)

    asyncio.run(scenario())
    assert allocation_of(fake_kube, "c1") is None
    assert FINALIZER not in (claim_of(fake_kube, "c1")["metadata"].get("finalizers") or [])


def test_informer_resumes_and_relists_after_410(fake_kube: FakeKubeApi) -> None:
    make_claim(fake_kube, "before")

    async def scenario() -> None:
        transport = api_transport(controller_client(fake_kube))
        informer = Informer(transport, CLAIMS, read_timeout_s=0.3)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
            assert informer.relists == 1
            make_claim(fake_kube, "watched")
            await eventually(lambda: len(informer.objects) == 2)
            await asyncio.sleep(0.5)  # an idle stream was resumed, not relisted
            assert informer.relists == 1
            fake_kube.compact()
            make_claim(fake_kube, "after-compaction")
            fake_kube.delete("ResourceClaim", "before", "default")
            fake_kube.compact()
            await eventually(lambda: informer.relists >= 2)
            await eventually(
                lambda: (
                    {o["metadata"]["name"] for o in informer.values()}
                    == {"watched", "after-compaction"}
                )
            )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await transport.close()

    asyncio.run(scenario())


# --- pure parts ------------------------------------------------------------------------


def test_node_fits_pod_selector_affinity_and_taints() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {"zone": "a", "gpus": "4"}},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
    }
    tolerate = {"tolerations": [{"key": "gpu", "operator": "Exists"}]}
    assert not node_fits_pod(node, {"spec": {}})
    assert node_fits_pod(node, {"spec": tolerate})
    assert not node_fits_pod(node, {"spec": {**tolerate, "nodeSelector": {"zone": "b"}}})
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["2"]}]}
                ]
            }
        }
    }
    assert node_fits_pod(node, {"spec": {**tolerate, "affinity": affinity}})
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]
    assert not node_fits_pod(node, {"spec": {**tolerate, "affinity": affinity}})


def test_work_queue_coalesces() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        queue.add("a")
        queue.add("b")
        queue.add("a")
        assert len(queue) == 2
        key = await queue.get()
        assert key == "a"
        queue.add("a")  # while processing: once more after done
        assert len(queue) == 1
        queue.done("a")
        assert await queue.get() == "b"
        assert await queue.get() == "a"

    asyncio.run(scenario())


@pytest.mark.parametrize("memory", ["10Gi"])
def test_claims_of_other_classes_are_left_alone(fake_kube: FakeKubeApi, memory: str) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    controller_env.make_claim(fake_kube, "other", memory, device_class="gpu.fractional.dev")

    async def scenario() -> None:
        async with running(fake_kube) as controller:
            make_pod(fake_kube, "p1", "other")
            await settled(controller)

    asyncio.run(scenario())
    assert allocation_of(fake_kube, "other") is None
    assert not events_for(fake_kube, "other")


def test_shares_on_a_cluster_that_drops_share_ids() -> None:
    """1.34/1.35: the API drops capacity.requests, shareID and consumedCapacity; the
    fraction comes from GpuShare, and written shares are known by their grants."""
    share = {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.fractional.dev/v1alpha1",
                "kind": "GpuShare",
                "memory": "30Gi",
            },
        }
    }
    with FakeKubeApi(kube_minor=34) as api:
        seed_cluster(api, {"node-a": "h100-80gb:1"})
        for name in ("s1", "s2", "s3"):
            make_claim(api, name, config=[share])

        async def scenario() -> None:
            async with running(api) as controller:
                make_pod(api, "p1", "s1")
                make_pod(api, "p2", "s2")
                await eventually(lambda: allocation_of(api, "s1") and allocation_of(api, "s2"))
                for name in ("s1", "s2"):
                    allocation = allocation_of(api, name)
                    assert allocation is not None
                    (result,) = allocation["devices"]["results"]
                    assert result["device"] == "gpu-0" and "shareID" not in result
                # 30Gi + 30Gi are given out of 79.6Gi: a third 30Gi does not fit.
                make_pod(api, "p3", "s3")
                await eventually(lambda: events_for(api, "s3", "CannotAllocate"))
                await settled(controller)
                assert allocation_of(api, "s3") is None

        asyncio.run(scenario())
