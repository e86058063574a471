"""MPS shares inside MIG instances: the slices (pure), on every supported version.

A MIG-enabled GPU whose own node-config entry says ``sharing: mps`` publishes
each MIG device (pre-existing instances and, with partitionable devices, every
free placement) as shareable: ``allowMultipleAllocations`` with consumable
``memory`` (the instance's), ``computePercent`` and ``clients``, its engine
counts as attributes. ``allowMultipleAllocations`` together with
``consumesCounters`` is allowed by the API server's validation (no rule couples
them) and the scheduler consumes a shareable partition's counters once, while
any share of it is allocated (dra-facts 6, ``skipCounterCheck``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dra_driver.base.quantity import parse_quantity
from dra_driver.core.model import Inventory
from dra_driver.core.settings import Capabilities, GpuSettings, NodeSettings, Sharing, Tenancy
from dra_driver.core.slices import DesiredSlice, build_slices, mig_share_policy
from dra_driver.fakes.gpu import build_inventory
from tests.support.slice_checks import DRIVER, NODE, assert_publishable

MINORS = (34, 35, 36, 37)
MIB = 2**20
SHARED = NodeSettings(
    per_gpu={"0": GpuSettings(mig_sharing=Sharing.MPS, tenancy=Tenancy.COOPERATIVE)}
)


def _inventory(model: str = "h100-80gb", instances: Sequence[Mapping[str, Any]] = ()) -> Inventory:
    return build_inventory(
        [{"model": model, "mig": True, "migInstances": list(instances)}, {"model": model}],
        NODE,
    )


def _build(
    inventory: Inventory, minor: int, settings: NodeSettings = SHARED
) -> tuple[list[DesiredSlice], Capabilities]:
    caps = Capabilities.for_version(minor)
    slices = build_slices(
        inventory, driver_name=DRIVER, node_name=NODE, settings=settings, capabilities=caps
    )
    assert_publishable(slices, caps, minor)
    return slices, caps


def _devices(slices: Sequence[DesiredSlice]) -> dict[str, Mapping[str, Any]]:
    return {d["name"]: d for s in slices for d in s.spec.get("devices", ())}


@pytest.mark.parametrize("minor", MINORS)
@pytest.mark.parametrize("model", ["h100-80gb", "h200-141gb", "a100-40gb", "a100-80gb"])
@pytest.mark.parametrize("instances", [(), ({"profile": "3g", "start": 0},)], ids=["none", "3g"])
def test_every_pool_is_publishable(
    minor: int, model: str, instances: Sequence[Mapping[str, Any]]
) -> None:
    inventory = _inventory(model)
    profile = next(p for p in inventory.gpus[0].mig_profiles if p.name.startswith("3g"))
    wanted = [{"profile": profile.name, "start": i["start"]} for i in instances]
    _build(_inventory(model, wanted), minor)


@pytest.mark.parametrize("minor", (36, 37))
def test_partitions_and_instances_are_shareable_with_the_instance_memory(minor: int) -> None:
    slices, _ = _build(_inventory(instances=[{"profile": "3g.40gb", "start": 0}]), minor)
    devices = _devices(slices)
    static, partition = devices["gpu-0-mig-3g40gb-9-0"], devices["gpu-0-mig-1g10gb-19-4"]
    for device in (static, partition):
        assert device["allowMultipleAllocations"] is True
        assert device["attributes"]["sharing"] == {"string": "mps"}
        assert set(device["capacity"]) == {"memory", "computePercent", "clients"}
        assert "multiprocessors" in device["attributes"]
    assert "consumesCounters" in partition and "consumesCounters" in static
    assert parse_quantity(static["capacity"]["memory"]["value"]) == 40192 * MIB
    assert static["attributes"]["static"] == {"bool": True}
    assert partition["attributes"]["static"] == {"bool": False}
    assert partition["attributes"]["placementStart"] == {"int": 4}
    # clients: 48 lowered in proportion to the compute slices (3 of 7, 1 of 7).
    assert static["capacity"]["clients"]["value"] == "20"
    assert partition["capacity"]["clients"]["value"] == "6"
    # The GPU without MIG is unchanged: an ordinary MPS-shared GPU.
    assert devices["gpu-1"]["attributes"]["sharing"] == {"string": "mps"}


@pytest.mark.parametrize("minor", (34, 35))
def test_without_consumable_capacity_instances_stay_exclusive(minor: int) -> None:
    slices, _ = _build(_inventory(instances=[{"profile": "3g.40gb", "start": 0}]), minor)
    device = _devices(slices)["gpu-0-mig-3g40gb-9-0"]
    assert "allowMultipleAllocations" not in device
    assert device["attributes"]["sharing"] == {"string": "exclusive"}


@pytest.mark.parametrize(
    "settings",
    [
        NodeSettings(),
        NodeSettings(default=GpuSettings(sharing=Sharing.MPS)),
        NodeSettings(
            per_gpu={"1": GpuSettings(mig_sharing=Sharing.MPS, tenancy=Tenancy.COOPERATIVE)}
        ),
    ],
    ids=["defaults", "node-wide-mps", "other-gpu"],
)
def test_mig_instances_are_exclusive_unless_the_gpu_says_mps(settings: NodeSettings) -> None:
    slices, _ = _build(_inventory(), 36, settings)
    for name, device in _devices(slices).items():
        if "-mig-" in name:
            assert "allowMultipleAllocations" not in device, name
            assert device["attributes"]["sharing"] == {"string": "exclusive"}


@pytest.mark.parametrize(
    ("step", "max_clients", "profile", "clients"),
    [
        (256 * MIB, 48, "1g.10gb", 6),
        (256 * MIB, 4, "7g.80gb", 4),
        (8 * 1024 * MIB, 48, "1g.10gb", None),  # less than two steps of memory
        (256 * MIB, 1, "3g.40gb", None),  # one client is no sharing
    ],
    ids=["1g", "7g-node-limit", "too-small", "one-client"],
)
def test_share_policy_table(step: int, max_clients: int, profile: str, clients: int | None) -> None:
    gpu = _inventory().gpus[0]
    found = next(p for p in gpu.mig_profiles if p.name == profile)
    settings = NodeSettings(memory_step_bytes=step, max_clients=max_clients)
    policy = mig_share_policy(gpu, found, found.memory_mib, settings)
    if clients is None:
        assert policy is None
        return
    assert policy is not None
    memory = found.memory_mib * MIB
    assert (policy.usable, policy.default, policy.clients) == (
        memory,
        memory // step * step,
        clients,
    )
