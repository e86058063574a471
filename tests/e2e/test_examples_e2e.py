"""Each example of ``deploy/examples`` on a real cluster: pods run, allocations are right.

Which examples run depends on the server's version and on what the driver
publishes: native-path shares need 1.36+ (on 1.34/1.35 the API server drops
``capacity.requests``, so they would silently become whole-GPU claims and prove
nothing about shares); the controller path waits for the controller; MIG and
shares need devices that offer them. Every skip says which of these it was.
Evidence from inside the containers comes from their logs (the example pods
print their ``CUDA_MPS_*`` environment and ``ls -l /dev/nvidia*``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from dra_driver.base.quantity import parse_whole
from tests.support.cluster import Cluster, Example, delete_namespace, wait_for_event
from tests.support.examples import Obj, pod_image

pytestmark = pytest.mark.e2e

NATIVE = (1, 36)
GPU_NODE = re.compile(r"^c\S+\s.*\s/dev/nvidia\d+$", re.MULTILINE)
"""An ``ls -l`` line of a character device ``/dev/nvidia<N>`` (real or stand-in)."""
MPS_ENV = "CUDA_MPS_PIPE_DIRECTORY="

ApplyExample = Callable[[str], Example]
DeviceKey = tuple[str, str]


# --- what the driver publishes ------------------------------------------------------


def attribute(device: Obj, name: str) -> object:
    """A device attribute's value (``{"string": "gpu"}`` -> ``"gpu"``), or None."""
    value = (device.get("attributes") or {}).get(name)
    if not value:
        return None
    return next(iter(value.values()))


def published_devices(cluster: Cluster) -> dict[DeviceKey, Obj]:
    """Our devices by (pool, device name), with the slice's node as ``_node``."""
    devices = {}
    for item in cluster.slices():
        spec = item["spec"]
        for device in spec.get("devices") or []:
            devices[spec["pool"]["name"], device["name"]] = {
                **device,
                "_node": spec.get("nodeName"),
            }
    return devices


def shareable_gpus_per_node(cluster: Cluster) -> dict[str, list[Obj]]:
    """GPUs the kube-scheduler shares (native path), per node: not the controller's."""
    nodes: dict[str, list[Obj]] = {}
    for device in published_devices(cluster).values():
        if (
            attribute(device, "type") == "gpu"
            and device.get("allowMultipleAllocations")
            and attribute(device, "allocator") != "controller"
        ):
            nodes.setdefault(str(device["_node"]), []).append(device)
    return nodes


CONTROLLER_SETUP = (
    "the controller deployed (chart value controller.enabled=true) and at least one GPU"
    " with allocator: controller (nodeSettings.perNode.<node>.gpus.<index>.allocator;"
    " hack/kind/install-driver.sh sets both, see CONTROLLER_GPU in hack/kind/common.sh)"
)


def require_controller_path(cluster: Cluster) -> None:
    """Skip unless E2E_CONTROLLER_PATH=1; then the cluster must have controller GPUs."""
    if os.environ.get("E2E_CONTROLLER_PATH") != "1":
        pytest.skip(
            f"controller path: set E2E_CONTROLLER_PATH=1 on a cluster with {CONTROLLER_SETUP};"
            " without them nothing allocates share.gpu.fractional.dev claims"
        )
    devices = published_devices(cluster).values()
    if not any(attribute(d, "allocator") == "controller" for d in devices):
        pytest.fail(
            f"E2E_CONTROLLER_PATH=1 but no published device has allocator: controller; the"
            f" controller path needs {CONTROLLER_SETUP}"
        )


def require_native(
    cluster: Cluster, dropped: str = "and the claim would become a whole-GPU claim"
) -> None:
    """Skip below 1.36, where capacity.requests is silently dropped, ``dropped`` saying
    what that does to the test's claim."""
    if cluster.version < NATIVE:
        pytest.skip(
            f"native-path share: needs Kubernetes 1.36+ (DRAConsumableCapacity); this server is"
            f" {cluster.version[0]}.{cluster.version[1]}, where capacity.requests is silently"
            f" dropped {dropped}"
        )


def require_shareable_gpus(cluster: Cluster, count: int) -> None:
    best = max((len(v) for v in shareable_gpus_per_node(cluster).values()), default=0)
    if best < count:
        pytest.skip(
            f"needs a node with {count} shareable GPU(s) (allowMultipleAllocations: sharing"
            f" mps or timeslicing, allocator scheduler); the most on one node is {best}"
        )


# --- what a claim got ---------------------------------------------------------------


def results(claim: Obj, cluster: Cluster) -> list[Obj]:
    allocation = (claim.get("status") or {}).get("allocation")
    assert allocation, f"claim {claim['metadata']['name']} is not allocated"
    ours = [r for r in allocation["devices"]["results"] if r["driver"] == cluster.driver]
    assert ours, f"claim {claim['metadata']['name']}: no result of driver {cluster.driver}"
    return ours


def device_of(result: Obj, devices: dict[DeviceKey, Obj]) -> Obj:
    key = (result["pool"], result["device"])
    assert key in devices, f"allocated device {key} is not in any ResourceSlice of ours"
    return devices[key]


def assert_device_status(example: Example, pod: str, claim_name: str) -> None:
    """The plugin wrote ``status.devices`` for each of our results (server-side apply):
    keyed by pool, device and shareID, with Ready and DeviceHealthy True. The chart
    grants the write (``kubeletPlugin.writeDeviceStatus``, on by default)."""
    cluster = example.cluster
    deadline = time.monotonic() + 30
    while True:
        claim = example.claim_of(pod, claim_name)
        wanted = {(r["pool"], r["device"], r.get("shareID")) for r in results(claim, cluster)}
        entries = {
            (d["pool"], d["device"], d.get("shareID")): d
            for d in (claim.get("status") or {}).get("devices") or []
            if d.get("driver") == cluster.driver
        }
        if wanted <= set(entries) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert wanted <= set(entries), (
        f"claim {claim['metadata']['name']}: no status.devices entry for "
        f"{sorted(map(str, wanted - set(entries)))} after 30s (see the plugin's log for a "
        "403 naming the RBAC rule)"
    )
    for key in wanted:
        conditions = {c["type"]: c["status"] for c in entries[key].get("conditions") or []}
        assert conditions.get("Ready") == "True", (key, entries[key])
        assert conditions.get("DeviceHealthy") == "True", (key, entries[key])
        assert (entries[key].get("data") or {}).get("mode"), (key, entries[key])


def memory(result: Obj) -> int:
    consumed = result.get("consumedCapacity") or {}
    assert "memory" in consumed, f"no consumedCapacity.memory in {result}"
    return parse_whole(consumed["memory"])


def compute_percent(result: Obj) -> int:
    consumed = result.get("consumedCapacity") or {}
    assert "computePercent" in consumed, f"no consumedCapacity.computePercent in {result}"
    return parse_whole(consumed["computePercent"])


def assert_share_env(example: Example, pod: str, device: Obj) -> None:
    """An MPS share's container sees its pipe directory; a GPU device node is there."""
    mps = attribute(device, "sharing") == "mps"
    text = example.wait_logs(pod, MPS_ENV if mps else "/dev/nvidia")
    if mps:
        assert MPS_ENV in text, f"pod {pod}: no {MPS_ENV} in its environment:\n{text}"
    assert GPU_NODE.search(text), f"pod {pod}: no /dev/nvidiaN device node:\n{text}"


# --- the examples ---------------------------------------------------------------------


def test_whole_gpu(cluster: Cluster, example: ApplyExample) -> None:
    ex = example("whole-gpu")
    ex.wait_running()
    (result,) = results(ex.claim_of("pod0", "gpu"), cluster)
    device = device_of(result, published_devices(cluster))
    assert attribute(device, "type") == "gpu"
    text = ex.wait_logs("pod0", "/dev/nvidia")
    assert GPU_NODE.search(text), f"no /dev/nvidiaN device node in pod0:\n{text}"
    assert_device_status(ex, "pod0", "gpu")


def test_vram_share(cluster: Cluster, example: ApplyExample) -> None:
    require_native(cluster)
    require_shareable_gpus(cluster, 1)
    ex = example("vram-share")
    ex.wait_running()
    (result,) = results(ex.claim_of("pod0", "gpu"), cluster)
    assert result.get("shareID"), f"a share has a shareID: {result}"
    assert memory(result) == parse_whole("10Gi")
    device = device_of(result, published_devices(cluster))
    assert device.get("allowMultipleAllocations")
    assert_share_env(ex, "pod0", device)
    assert_device_status(ex, "pod0", "gpu")


def test_two_pods_different_limits(cluster: Cluster, example: ApplyExample) -> None:
    require_native(cluster)
    require_shareable_gpus(cluster, 1)
    ex = example("two-pods-different-limits")
    pods = ex.wait_running()
    assert len({p["spec"]["nodeName"] for p in pods}) == 1, "pod affinity: one node"
    small = results(ex.claim_of("pod-small", "gpu"), cluster)[0]
    large = results(ex.claim_of("pod-large", "gpu"), cluster)[0]
    assert (small["pool"], small["device"]) == (large["pool"], large["device"]), "one GPU"
    assert small.get("shareID") and large.get("shareID")
    assert small["shareID"] != large["shareID"]
    assert (memory(small), memory(large)) == (parse_whole("10Gi"), parse_whole("20Gi"))
    device = device_of(small, published_devices(cluster))
    assert attribute(device, "index") == 0
    for pod in ("pod-small", "pod-large"):
        assert_share_env(ex, pod, device)
        assert_device_status(ex, pod, "gpu")


def test_controller_path_share(cluster: Cluster, example: ApplyExample) -> None:
    require_controller_path(cluster)
    ex = example("controller-path-share")
    ex.wait_running()
    (result,) = results(ex.claim_of("pod0", "gpu"), cluster)
    device = device_of(result, published_devices(cluster))
    assert attribute(device, "type") == "gpu"
    assert attribute(device, "allocator") == "controller", device
    if cluster.version >= NATIVE:  # the API keeps shareID only with consumable capacity
        assert result.get("shareID"), f"a share has a shareID: {result}"
    assert_share_env(ex, "pod0", device)
    assert_device_status(ex, "pod0", "gpu")


def test_mig_1g_by_cel(cluster: Cluster, example: ApplyExample) -> None:
    if cluster.version < NATIVE:
        pytest.skip(
            "MIG partitions are partitionable devices (DRAPartitionableDevices, beta from"
            f" 1.36); this server is {cluster.version[0]}.{cluster.version[1]}"
        )
    devices = published_devices(cluster)
    if not any(
        str(attribute(d, "profile") or "").startswith("1g.")
        and attribute(d, "sharing") == "exclusive"
        for d in devices.values()
    ):
        pytest.skip(
            "no published MIG device has a 1g profile and sharing exclusive (no MIG-enabled"
            " GPU here, or only GPUs whose MIG instances are MPS-shared)"
        )
    ex = example("mig-1g-by-cel")
    ex.wait_running()
    (result,) = results(ex.claim_of("pod0", "mig"), cluster)
    device = device_of(result, devices)
    assert attribute(device, "type") == "mig"
    assert str(attribute(device, "profile")).startswith("1g.")
    assert attribute(device, "sharing") == "exclusive", "an isolated instance"
    assert not result.get("shareID"), f"an isolated instance is no share: {result}"
    text = ex.wait_logs("pod0", "nvidia-cap")
    assert "nvidia-cap" in text, f"no MIG capability nodes in pod0:\n{text}"
    assert MPS_ENV not in text, f"an isolated instance has no MPS client env:\n{text}"


MPS_MIG_SETUP = (
    "a MIG-enabled GPU whose own node-config entry says sharing: mps and tenancy: cooperative"
    " (nodeSettings.perNode.<node>.gpus.<index>; a node-wide sharing leaves"
    " MIG instances exclusive; hack/kind/install-driver.sh sets it, see MPS_MIG_GPU in"
    " hack/kind/common.sh)"
)


def test_mig_mps_shares(cluster: Cluster, example: ApplyExample) -> None:
    """Two pods, two shares of one MIG instance, each with the MPS limits it asked for."""
    if cluster.version < NATIVE:
        pytest.skip(
            "MPS shares of a MIG instance: need consumable capacity and partitionable devices"
            f" (1.36+); this server is {cluster.version[0]}.{cluster.version[1]}, where MIG"
            " instances are published exclusive and capacity.requests is silently dropped"
        )
    devices = published_devices(cluster)
    if not any(
        attribute(d, "type") == "mig" and attribute(d, "sharing") == "mps" for d in devices.values()
    ):
        pytest.skip(f"no published MIG device has sharing mps: needs {MPS_MIG_SETUP}")
    ex = example("mig-mps-shares")
    pods = ex.wait_running()
    assert len({p["spec"]["nodeName"] for p in pods}) == 1, "pod affinity: one node"
    (small,) = results(ex.claim_of("pod-small", "mig"), cluster)
    (large,) = results(ex.claim_of("pod-large", "mig"), cluster)
    assert (small["pool"], small["device"]) == (large["pool"], large["device"]), "one instance"
    assert small.get("shareID") and large.get("shareID")
    assert small["shareID"] != large["shareID"]
    assert (memory(small), memory(large)) == (parse_whole("2Gi"), parse_whole("4Gi"))
    assert (compute_percent(small), compute_percent(large)) == (30, 60)
    device = device_of(small, devices)
    assert (attribute(device, "type"), attribute(device, "sharing")) == ("mig", "mps")
    assert attribute(device, "placementStart") == 0
    assert str(attribute(device, "profile")).startswith("1g.")
    # The instance's MPS daemon is legacy: each share's caps are its client env (device
    # 0, the one its clients see), printed by the pod before its device nodes.
    for pod, mib, percent in (("pod-small", 2048, 30), ("pod-large", 4096, 60)):
        text = ex.wait_logs(pod, "nvidia-cap")
        assert MPS_ENV in text, f"pod {pod}: no {MPS_ENV} in its environment:\n{text}"
        assert "nvidia-cap" in text, f"pod {pod}: no MIG capability nodes:\n{text}"
        for entry in (
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={mib}M",
            f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}",
        ):
            assert entry in text, f"pod {pod}: no {entry} in its environment:\n{text}"
        assert_device_status(ex, pod, "mig")


def _mig_share_claim(driver_name: str, namespace: str, parent_index: int, memory: str) -> Obj:
    """A claim for an MPS share of the 1g partition at placementStart 0 of one GPU."""
    driver = f'"{driver_name}"'
    expression = (
        f"device.attributes[{driver}].sharing == 'mps' && "
        f"device.attributes[{driver}].placementStart == 0 && "
        f"device.attributes[{driver}].parentIndex == {parent_index} && "
        f"device.attributes[{driver}].profile.startsWith('1g.') && "
        f"!device.attributes[{driver}].profile.contains('+')"
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mig", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.gpu.fractional.dev",
                            "selectors": [{"cel": {"expression": expression}}],
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
    }


def test_mig_mps_shares_of_two_namespaces_need_the_opt_in(cluster: Cluster) -> None:
    """A MIG instance's MPS daemon is legacy MPS: its clients get its control socket and
    /dev/shm. Its shares are published only for a GPU that opts in (tenancy:
    cooperative, which says so on the device), and then two namespaces' pods share one
    instance; every MPS-shared MIG device published says it is cooperative."""
    if cluster.version < NATIVE:
        pytest.skip("MPS shares of a MIG instance need Kubernetes 1.36+ (see test_mig_mps_shares)")
    devices = published_devices(cluster)
    shared = [
        d
        for d in devices.values()
        if attribute(d, "type") == "mig" and attribute(d, "sharing") == "mps"
    ]
    if not shared:
        pytest.skip(f"no published MIG device has sharing mps: needs {MPS_MIG_SETUP}")
    for device in shared:
        assert attribute(device, "mpsTenancy") == "cooperative", (
            f"{device['name']}: an MPS-shared MIG device without the opt-in: {device}"
        )
    first = min(shared, key=lambda d: (str(d["_node"]), d["name"]))
    node, parent = str(first["_node"]), int(str(attribute(first, "parentIndex")))
    claims = cluster.resource("resource.k8s.io/v1", "ResourceClaim")
    namespaces = ("fgd-tenant-a", "fgd-tenant-b")
    for namespace in namespaces:
        assert delete_namespace(cluster, namespace), f"{namespace}: left over and stuck"
    try:
        for namespace, memory in zip(namespaces, ("2Gi", "3Gi"), strict=True):
            cluster.core.create_namespace({"metadata": {"name": namespace}})
            claims.create(
                namespace=namespace,
                body=_mig_share_claim(cluster.driver, namespace, parent, memory),
            )
            cluster.core.create_namespaced_pod(
                namespace,
                pod_image(
                    {
                        "metadata": {"name": "pod0"},
                        "spec": {
                            "nodeSelector": {"kubernetes.io/hostname": node},
                            "containers": [
                                {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}
                            ],
                            "resourceClaims": [{"name": "mig", "resourceClaimName": "mig"}],
                        },
                    },
                ),
            )
        deadline = time.monotonic() + cluster.timeout_s
        phases: list[str] = []
        while time.monotonic() < deadline:
            phases = [
                str(cluster.core.read_namespaced_pod("pod0", ns).status.phase) for ns in namespaces
            ]
            if phases == ["Running", "Running"]:
                break
            time.sleep(2)
        assert phases == ["Running", "Running"], f"pods of both namespaces: {phases}"
        a, b = (
            results(claims.get(name="mig", namespace=ns).to_dict(), cluster)[0] for ns in namespaces
        )
        assert (a["pool"], a["device"]) == (b["pool"], b["device"]), "one instance, two tenants"
        assert a.get("shareID") and b.get("shareID") and a["shareID"] != b["shareID"]
    finally:
        for namespace in namespaces:
            assert delete_namespace(cluster, namespace), f"{namespace}: not gone"


def test_shared_claim_two_pods(cluster: Cluster, example: ApplyExample) -> None:
    ex = example("shared-claim-two-pods")
    pods = ex.wait_running()
    assert len({p["spec"]["nodeName"] for p in pods}) == 1, "the allocation's node"
    (claim,) = ex.claims()
    reserved = {r["uid"] for r in claim["status"].get("reservedFor") or []}
    assert reserved == {p["metadata"]["uid"] for p in pods}
    (result,) = results(claim, cluster)
    assert attribute(device_of(result, published_devices(cluster)), "type") == "gpu"
    for pod in ("pod0", "pod1"):
        text = ex.wait_logs(pod, "/dev/nvidia")
        assert GPU_NODE.search(text), f"no /dev/nvidiaN device node in {pod}:\n{text}"


def require_gpus(cluster: Cluster, count: int) -> None:
    """Skip unless one node publishes ``count`` whole GPUs of ours (any sharing: on a
    shareable GPU a request without capacity takes all of it)."""
    nodes: dict[str, int] = {}
    for device in published_devices(cluster).values():
        if attribute(device, "type") == "gpu":
            nodes[str(device["_node"])] = nodes.get(str(device["_node"]), 0) + 1
    best = max(nodes.values(), default=0)
    if best < count:
        pytest.skip(f"needs a node with {count} GPUs of ours (not MIG); the most on one is {best}")


def test_count_two_distinct(cluster: Cluster, example: ApplyExample) -> None:
    """Two whole GPUs in one request, distinct by uuid: both in the container, neither
    an MPS share (two shares on two GPUs are refused at admission instead:
    tests/e2e/test_admission_e2e.py)."""
    if cluster.version < NATIVE:
        pytest.skip(
            "distinctAttribute: needs Kubernetes 1.36+ (DRAConsumableCapacity); this server is"
            f" {cluster.version[0]}.{cluster.version[1]}, where it is silently dropped"
        )
    require_gpus(cluster, 2)
    ex = example("count-two-distinct")
    ex.wait_running()
    got = results(ex.claim_of("pod0", "gpus"), cluster)
    assert len(got) == 2, got
    devices = published_devices(cluster)
    pair = [device_of(r, devices) for r in got]
    assert [attribute(d, "type") for d in pair] == ["gpu", "gpu"], pair
    assert len({(r["pool"], r["device"]) for r in got}) == 2, f"two devices: {got}"
    assert attribute(pair[0], "uuid") != attribute(pair[1], "uuid"), "distinctAttribute"
    text = ex.wait_logs("pod0", "/dev/nvidia")
    assert len(GPU_NODE.findall(text)) >= 2, f"pod0 does not see two GPU device nodes:\n{text}"
    assert MPS_ENV not in text, f"whole GPUs have no MPS client env:\n{text}"
    assert_device_status(ex, "pod0", "gpus")
    claim = ex.claim_of("pod0", "gpus")
    modes = [
        (d.get("data") or {}).get("mode")
        for d in (claim.get("status") or {}).get("devices") or []
        if d.get("driver") == cluster.driver
    ]
    assert modes == ["exclusive", "exclusive"], f"prepared as whole GPUs: {modes}"


def test_oversized_share_stays_pending_with_our_event(cluster: Cluster) -> None:
    """A share no GPU can hold: the claim stays unallocated, the pod Pending, and our
    controller says why in an Event on the claim."""
    require_controller_path(cluster)
    namespace = "fgd-oversized"
    claims = cluster.resource("resource.k8s.io/v1", "ResourceClaim")
    # A namespace left by an earlier run may still be Terminating: wait for its 404.
    assert delete_namespace(cluster, namespace), f"{namespace}: left over and stuck"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    try:
        claims.create(
            namespace=namespace,
            body={
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "too-big", "namespace": namespace},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {"deviceClassName": "share.gpu.fractional.dev"},
                            }
                        ],
                        "config": [
                            {
                                "requests": ["gpu"],
                                "opaque": {
                                    "driver": cluster.driver,
                                    "parameters": {
                                        "apiVersion": f"{cluster.driver}/v1alpha1",
                                        "kind": "GpuShare",
                                        "memory": "4Ti",
                                    },
                                },
                            }
                        ],
                    }
                },
            },
        )
        cluster.core.create_namespaced_pod(
            namespace,
            pod_image(
                {
                    "metadata": {"name": "pod0"},
                    "spec": {
                        "containers": [
                            {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "too-big"}],
                    },
                },
            ),
        )
        events = wait_for_event(
            cluster, namespace, "too-big", lambda e: e.startswith("CannotAllocate:")
        )
        assert any(e.startswith("CannotAllocate:") for e in events), (
            f"no CannotAllocate Event; events: {events}"
        )
        claim = claims.get(name="too-big", namespace=namespace).to_dict()
        assert not (claim.get("status") or {}).get("allocation")
        pod = cluster.core.read_namespaced_pod("pod0", namespace)
        assert pod.status.phase == "Pending"
    finally:
        assert delete_namespace(cluster, namespace), f"{namespace}: not gone"
