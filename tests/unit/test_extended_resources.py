"""DRA extended resources (KEP-5004): the scheduler-made claim, the chart's classes, the check.

* the scheduler's request names and counts (``tests/support/extended_resources.py``,
  after kubernetes/kubernetes ``extendeddynamicresources.go``);
* the chart's whole-GPU and MIG classes evaluated by the project's CEL against the
  slices the plugin builds, on 1.34 and 1.36 rules, and what a request without
  capacity gets on a shareable GPU (why the whole-GPU class leaves those out);
* the double-advertising check (``core/slices/extended_resources.py``).
"""

from __future__ import annotations

import functools
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.allocator.capacity import consumed_capacity, fits
from dra_driver.allocator.cel import SelectorCache
from dra_driver.allocator.model import Device, gather_pools
from dra_driver.base.ids import PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import ResourceClaim
from dra_driver.core.prepare import Exclusive, NodeContext, plan_prepare
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings, Sharing
from dra_driver.core.slices import advertised, build_slices, conflict_message, parse_names
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.fakes.objects import resource_claim, share
from tests.support.chart import helm_binary
from tests.support.extended_resources import (
    IMPLICIT_PREFIX,
    classes_by_resource,
    extended_resource_requests,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fractional-gpu-dra"
DRIVER = "gpu.fractional.dev"
NODE = "node-a"
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
CLASSES = {GPU: "whole.gpu.fractional.dev", MIG: "mig-1g.10gb.gpu.fractional.dev"}


def container(name: str, limits: dict[str, Any], requests: dict[str, Any] | None = None) -> Any:
    resources: dict[str, Any] = {"limits": limits}
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "cuda", "resources": resources}


def pod(*containers: Any, init: tuple[Any, ...] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"}, "spec": spec}


def names_and_counts(requests: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
    return [(r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests]


# --- the scheduler-made claim ----------------------------------------------------------


def test_one_container_one_gpu_named_by_its_sorted_request_index() -> None:
    """``j`` counts all the container's request names, sorted: cpu, memory, nvidia.com/gpu."""
    p = pod(container("main", {GPU: 1}, {"cpu": "500m", "memory": "1Gi"}))
    requests, mappings = extended_resource_requests(p, CLASSES)
    assert names_and_counts(requests) == [("container-0-request-2", CLASSES[GPU], 1)]
    assert requests[0]["exactly"]["allocationMode"] == "ExactCount"
    assert set(requests[0]["exactly"]) == {"deviceClassName", "allocationMode", "count"}
    assert [(m.container_name, m.resource_name, m.request_name) for m in mappings] == [
        ("main", GPU, "container-0-request-2")
    ]


def test_several_containers_and_resources_get_one_request_each() -> None:
    p = pod(
        container("a", {GPU: 2}),
        container("b", {GPU: 1, MIG: 1}),
        container("c", {"cpu": "1"}),
    )
    requests, mappings = extended_resource_requests(p, CLASSES)
    assert names_and_counts(requests) == [
        ("container-0-request-0", CLASSES[GPU], 2),
        ("container-1-request-0", CLASSES[GPU], 1),
        ("container-1-request-1", CLASSES[MIG], 1),
    ]
    assert {(m.container_name, m.resource_name, m.request_name) for m in mappings} == {
        ("a", GPU, "container-0-request-0"),
        ("b", GPU, "container-1-request-0"),
        ("b", MIG, "container-1-request-1"),
    }


def test_init_containers_reuse_later_requests_and_share_the_largest() -> None:
    """A non-sidecar init container first takes the requests of later long-lived
    containers; what they lack is one request, the largest, for all init containers."""
    p = pod(
        container("main", {GPU: 1}),
        init=(
            container("init-a", {GPU: 1}),  # the main container's one GPU covers it
            container("init-b", {GPU: 3}),  # 1 from main + 2 of its own
            container("init-c", {GPU: 2}),  # 1 from main + 1: folded into init-b's request
        ),
    )
    requests, mappings = extended_resource_requests(p, CLASSES)
    assert names_and_counts(requests) == [
        ("container-1-request-0", CLASSES[GPU], 2),
        ("container-3-request-0", CLASSES[GPU], 1),
    ]
    by_container: dict[str, list[str]] = {}
    for m in mappings:
        by_container.setdefault(m.container_name, []).append(m.request_name)
    assert by_container == {
        "main": ["container-3-request-0"],
        "init-a": ["container-3-request-0"],
        "init-b": ["container-3-request-0", "container-1-request-0"],
        "init-c": ["container-3-request-0", "container-1-request-0"],
    }


def test_a_sidecar_init_container_has_its_own_request() -> None:
    sidecar = {**container("sidecar", {GPU: 1}), "restartPolicy": "Always"}
    requests, _ = extended_resource_requests(
        pod(container("main", {GPU: 1}), init=(sidecar,)), CLASSES
    )
    assert [r["name"] for r in requests] == ["container-0-request-0", "container-1-request-0"]


def test_a_node_whose_device_plugin_has_the_resource_gets_no_request() -> None:
    p = pod(container("main", {GPU: 1, MIG: 1}))
    requests, _ = extended_resource_requests(p, CLASSES, node_allocatable={GPU: "8"})
    assert [r["name"] for r in requests] == ["container-0-request-1"]  # the MIG one only
    requests, _ = extended_resource_requests(p, CLASSES, node_allocatable={GPU: "0"})
    assert len(requests) == 2


def test_implicit_and_explicit_names_of_a_class() -> None:
    classes = [
        {"metadata": {"name": "whole.gpu.fractional.dev"}, "spec": {"extendedResourceName": GPU}},
        {"metadata": {"name": "gpu.fractional.dev"}, "spec": {}},
    ]
    assert classes_by_resource(classes) == {
        GPU: "whole.gpu.fractional.dev",
        IMPLICIT_PREFIX + "whole.gpu.fractional.dev": "whole.gpu.fractional.dev",
        IMPLICIT_PREFIX + "gpu.fractional.dev": "gpu.fractional.dev",
    }


# --- the chart's classes against the slices we publish -------------------------------


@functools.cache
def chart_classes() -> dict[str, dict[str, Any]]:
    helm = helm_binary()
    if helm is None:
        pytest.skip("helm not found on PATH or in hack/bin/: run hack/install-helm.sh")
    done = subprocess.run(
        [helm, "template", "fgd", str(CHART), "--namespace", "fractional-gpu-dra",
         "--set", "extendedResources.enabled=true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "DeviceClass"]
    return {d["metadata"]["name"]: d for d in docs}


def expression(class_name: str) -> str:
    (selector,) = chart_classes()[class_name]["spec"]["selectors"]
    return str(selector["cel"]["expression"])


SETTINGS = NodeSettings(
    default=GpuSettings(Sharing.MPS),
    per_gpu={
        "1": GpuSettings(Sharing.EXCLUSIVE),
        "2": GpuSettings(Sharing.TIMESLICING),
        "3": GpuSettings(Sharing.EXCLUSIVE, Allocator.CONTROLLER),
    },
)
GPUS = "h100-80gb:4,h100-80gb:1:mig"


def devices(minor: int) -> list[Device]:
    inventory = build_inventory(load_spec(GPUS), NODE)
    slices = build_slices(
        inventory,
        driver_name=DRIVER,
        node_name=NODE,
        settings=SETTINGS,
        capabilities=Capabilities.for_version(minor),
    )
    return [d for pool in gather_pools([s.spec for s in slices]) for d in pool.devices]


def matching(class_name: str, minor: int) -> list[str]:
    cache = SelectorCache()
    return [d.name for d in devices(minor) if cache.matches(expression(class_name), d)]


@pytest.mark.parametrize("minor", [34, 35, 36, 37])
def test_the_whole_gpu_class_matches_every_gpu_of_ours(minor: int) -> None:
    """Exclusive, shared and the controller's GPUs alike (the MIG GPU has no whole
    device): a request that names no amount takes a whole GPU on each of them."""
    assert chart_classes()["whole.gpu.fractional.dev"]["spec"]["extendedResourceName"] == GPU
    assert matching("whole.gpu.fractional.dev", minor) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_each_mig_class_matches_its_profile_only() -> None:
    cls = chart_classes()["mig-1g.10gb.gpu.fractional.dev"]
    assert cls["spec"]["extendedResourceName"] == MIG
    found = matching("mig-1g.10gb.gpu.fractional.dev", 36)
    profiles = {d.name: d.attributes.get("profile") for d in devices(36)}
    assert found and {profiles[n] for n in found} == {"1g.10gb"}
    assert len(found) == sum(1 for p in profiles.values() if p == "1g.10gb")
    assert matching("mig-1g.10gb.gpu.fractional.dev", 34) == []  # no partitions before 1.36
    assert "mig-1g.10gb+me.gpu.fractional.dev" not in chart_classes()  # not a resource name


def test_a_request_without_capacity_on_a_shareable_gpu_is_the_whole_gpu() -> None:
    """Why the class may match shareable GPUs: there the scheduler's consumption for a
    request that names no capacity is the request policy's defaults, all the memory,
    so nothing fits beside it and the plan makes it the whole GPU (no MPS client)."""
    gpu0 = next(d for d in devices(36) if d.name == "gpu-0")
    assert gpu0.allow_multiple_allocations
    consumed = consumed_capacity({}, gpu0.capacity)
    assert consumed["computePercent"] == 0 and consumed["clients"] == 1
    # All its memory: no other share fits beside it.
    assert isinstance(fits({"memory": Fraction(2**30)}, gpu0.capacity, consumed), str)

    inventory = build_inventory(load_spec(GPUS), NODE)
    ctx = NodeContext(DRIVER, NODE, PoolName(NODE), "k8s.gpu.fractional.dev/claim", SETTINGS)
    memory = f"{int(consumed['memory'])}"
    claim: ResourceClaim = claim_from_dict(
        resource_claim("ns", "c", uid="u1", devices=[share("gpu-0", memory=memory)])
    )
    (planned,) = plan_prepare(claim, inventory, ctx).devices
    assert isinstance(planned, Exclusive)
    assert planned.share_id  # still the share the scheduler recorded (status.devices key)


# --- the double-advertising check -----------------------------------------------------


def node(allocatable: dict[str, str], capacity: dict[str, str] | None = None) -> dict[str, Any]:
    return {"status": {"allocatable": allocatable, "capacity": capacity or dict(allocatable)}}


def test_parse_names() -> None:
    assert parse_names(" nvidia.com/gpu, ,nvidia.com/mig-1g.10gb,nvidia.com/gpu") == (GPU, MIG)
    assert parse_names("") == ()


def test_a_device_plugin_advertising_our_name_is_reported() -> None:
    names = (GPU, MIG)
    found = advertised(node({GPU: "8", "cpu": "64"}), names)
    assert [(a.name, a.allocatable, a.capacity) for a in found] == [(GPU, "8", "8")]
    message = conflict_message(NODE, found)
    assert message is not None
    assert f"node {NODE} also advertises {GPU} (allocatable 8, capacity 8)" in message
    assert "device plugin" in message


@pytest.mark.parametrize(
    "status",
    [
        node({"cpu": "64"}),  # no device plugin
        node({GPU: "0"}, {GPU: "0"}),  # a device plugin that stopped
        {"status": {}},
    ],
    ids=["absent", "zero", "no-status"],
)
def test_nothing_to_report(status: dict[str, Any]) -> None:
    assert conflict_message(NODE, advertised(status, (GPU,))) is None


def test_capacity_without_allocatable_is_still_reported() -> None:
    message = conflict_message(NODE, advertised(node({}, {GPU: "4"}), (GPU,)))
    assert message is not None and "allocatable 0, capacity 4" in message
