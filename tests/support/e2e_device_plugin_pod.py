"""What the device-plugin-pod example must get on a cluster (DRA extended resources, KEP-5004).

Shared by the chart mode (``test_device_plugin_pod_e2e.py``) and the host-process
mode (``test_device_plugin_pod_host_process.py``). The pod asks
``resources.limits: nvidia.com/gpu: 1`` and names no claim; the scheduler makes
the claim. Checked: ``pod.status.extendedResourceClaimStatus`` names a claim
annotated ``resource.kubernetes.io/extended-resource-claim``, owned by the pod,
with one ExactCount request per container (no capacity, no config of its own);
its one result of ours is a whole GPU (no shareID) the scheduler may hand out
whole; the container sees a GPU device node.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.support.cluster import POLL_S, Cluster, Example
from tests.support.examples import Obj

EXAMPLE = "device-plugin-pod"
RESOURCE = "nvidia.com/gpu"
ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
REQUEST_NAME = re.compile(r"^container-\d+-request-\d+$")
GPU_NODE = re.compile(r"^c\S+\s.*\s/dev/nvidia\d+$", re.MULTILINE)


def attribute(device: Obj, name: str) -> object:
    value = (device.get("attributes") or {}).get(name)
    return next(iter(value.values())) if value else None


def is_whole_gpu(device: Obj) -> bool:
    """What the chart's whole-GPU class selects (deviceclass-extended-gpu.yaml)."""
    return attribute(device, "type") == "gpu"


def require_extended_class(cluster: Cluster) -> Obj:
    """The DeviceClass serving nvidia.com/gpu, or a skip saying why there is none."""
    classes = cluster.objects("resource.k8s.io/v1", "DeviceClass")
    ours = [c for c in classes if (c.get("spec") or {}).get("extendedResourceName") == RESOURCE]
    if not ours:
        gate = (
            "DRAExtendedResource is on by default here"
            if cluster.version >= (1, 36)
            else f"on {cluster.version[0]}.{cluster.version[1]} DRAExtendedResource is alpha and"
            " off: the API server drops extendedResourceName unless the gate is on"
        )
        pytest.skip(
            f"no DeviceClass has extendedResourceName {RESOURCE}: install the chart with"
            f" extendedResources.enabled=true ({gate})"
        )
    return ours[0]


def whole_gpus_by_node(cluster: Cluster, node: str | None) -> dict[str, int]:
    """Published GPUs of ours the whole-GPU class matches, counted per node."""
    nodes: dict[str, int] = {}
    for item in cluster.slices():
        spec = item["spec"]
        where = spec.get("nodeName")
        if node is not None and where != node:
            continue
        for device in spec.get("devices") or []:
            if is_whole_gpu(device):
                nodes[str(where)] = nodes.get(str(where), 0) + 1
    return nodes


def require_whole_gpu(cluster: Cluster, node: str | None = None, wait_s: float = 0) -> None:
    """A GPU of ours the class matches, on a node whose device plugin does not advertise
    nvidia.com/gpu (there the scheduler would serve the pod from the device plugin).
    ``wait_s``: a plugin just started publishes its slices one by one, so the first one
    seen may not hold the whole GPUs yet; look again until then before skipping."""
    deadline = time.monotonic() + wait_s
    nodes = whole_gpus_by_node(cluster, node)
    while not nodes and time.monotonic() < deadline:
        time.sleep(POLL_S)
        nodes = whole_gpus_by_node(cluster, node)
    if not nodes:
        pytest.skip(
            "no published GPU the whole-GPU class matches (type gpu): every GPU of this"
            " driver is MIG-enabled, or none is published"
        )
    clean = [n for n in nodes if not _device_plugin_on(cluster, n)]
    if not clean:
        pytest.skip(
            f"every node with a whole GPU of ours ({sorted(nodes)}) also advertises {RESOURCE}"
            " in status.allocatable (a device plugin): the scheduler serves the pod from it"
        )


def _device_plugin_on(cluster: Cluster, node: str) -> bool:
    obj = cluster.resource("v1", "Node").get(name=node).to_dict()
    amount = str(((obj.get("status") or {}).get("allocatable") or {}).get(RESOURCE) or "0")
    return amount != "0"


def extended_claim(example: Example, pod_name: str) -> tuple[Obj, list[Any]]:
    """The scheduler-made claim of the pod once allocated, and the pod's request mappings."""
    timeout = example.cluster.timeout_s
    deadline = time.monotonic() + timeout
    resource = example.cluster.resource("resource.k8s.io/v1", "ResourceClaim")
    while True:
        pod = example.pod(pod_name)
        status = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        name = status.get("resourceClaimName")
        if name:
            claim: Obj = resource.get(name=name, namespace=example.namespace).to_dict()
            if (claim.get("status") or {}).get("allocation"):
                return claim, list(status.get("requestMappings") or [])
        if time.monotonic() > deadline:
            pytest.fail(
                f"pod {pod_name}: no allocated extended-resource claim after {timeout:.0f}s"
                f" (pod status: {pod.get('status')})"
            )
        time.sleep(POLL_S)


def check_claim(cluster: Cluster, example: Example, claim: Obj, mappings: list[Any]) -> Obj:
    """The claim is the scheduler's, as KEP-5004 describes it; returns our one result."""
    pod = example.pod("pod0")
    meta = claim["metadata"]
    assert (meta.get("annotations") or {}).get(ANNOTATION) == "true", meta
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    assert [(o["kind"], o["uid"]) for o in owners] == [("Pod", pod["metadata"]["uid"])]
    requests = claim["spec"]["devices"]["requests"]
    assert len(requests) == 1, requests
    (request,) = requests
    assert REQUEST_NAME.match(request["name"]), request
    exact = request["exactly"]
    assert exact.get("allocationMode", "ExactCount") == "ExactCount" and exact.get("count") == 1
    assert "capacity" not in exact and "selectors" not in exact, exact
    assert "config" not in claim["spec"]["devices"]
    assert [(m["containerName"], m["resourceName"], m["requestName"]) for m in mappings] == [
        ("ctr0", RESOURCE, request["name"])
    ]
    results: list[Obj] = [
        r
        for r in claim["status"]["allocation"]["devices"]["results"]
        if r["driver"] == cluster.driver
    ]
    assert len(results) == 1, results
    (result,) = results
    assert result["request"] == request["name"]
    devices = {
        (item["spec"]["pool"]["name"], d["name"]): d
        for item in cluster.slices()
        for d in item["spec"].get("devices") or []
    }
    device = devices.get((result["pool"], result["device"]))
    assert device is not None, f"{result} is not a published device of ours"
    assert is_whole_gpu(device), device
    if device.get("allowMultipleAllocations"):
        # A shareable GPU: the request took the policy's default, all the memory.
        default = device["capacity"]["memory"]["requestPolicy"]["default"]
        assert result.get("shareID") and result["consumedCapacity"]["memory"] == default, result
    else:
        assert not result.get("shareID"), f"a whole GPU has no shareID: {result}"
    entries = [
        e
        for e in (claim.get("status") or {}).get("devices") or []
        if (e["driver"], e["device"]) == (cluster.driver, result["device"])
    ]
    for entry in entries:  # written by the plugin after prepare, where status.devices is on
        assert (entry.get("data") or {}).get("mode") == "exclusive", entry
    return result


def check_logs(example: Example) -> None:
    text = example.wait_logs("pod0", "/dev/nvidia")
    assert GPU_NODE.search(text), f"no /dev/nvidiaN device node in pod0:\n{text}"
