"""plan_prepare's modes: MPS limits, time-slicing, MIG, and the overcommit guard."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dra_driver.base.errors import AllocationError
from dra_driver.base.ids import ClaimUID, DeviceName, PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import Inventory, ResourceClaim
from dra_driver.core.prepare import (
    Exclusive,
    HeldDevice,
    MigInstance,
    MpsLimits,
    MpsShare,
    NodeContext,
    PlannedDevice,
    PreparePlan,
    TimeSliced,
    plan_prepare,
)
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.fakes.objects import Allocated, resource_claim, share
from tests.support.planned import mig_instance, mig_plan, mps_share

DRIVER = "gpu.fractional.dev"
NODE = "node-a"
GI = 2**30
UID = "5e0a7c1d-0000-4000-8000-000000000001"
OTHER = ClaimUID("5e0a7c1d-0000-4000-8000-000000000002")
GPUS: Inventory = build_inventory(load_spec("h100-80gb:2"), NODE)
H100_USABLE = GPUS.gpus[0].memory_bytes


def ctx(**settings: Any) -> NodeContext:
    return NodeContext(
        driver_name=DRIVER,
        node_name=NODE,
        pool_name=PoolName(NODE),
        cdi_kind="k8s.gpu.fractional.dev/claim",
        settings=NodeSettings(**settings),
    )


def claim(*devices: Allocated, configs: Sequence[Mapping[str, Any]] = ()) -> ResourceClaim:
    return claim_from_dict(
        resource_claim("ns", "c", uid=UID, node=NODE, devices=devices, configs=configs)
    )


def gpu_config(**mps: Any) -> dict[str, Any]:
    return {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "mps": mps}


def plan(
    rc: ResourceClaim,
    context: NodeContext | None = None,
    inventory: Inventory = GPUS,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]] | None = None,
) -> PreparePlan:
    return plan_prepare(rc, inventory, context or ctx(), in_use)


def test_mps_share_gets_the_granted_limits() -> None:
    (device,) = plan(claim(share("gpu-0", memory="10Gi", compute_percent=25))).devices
    assert isinstance(device, MpsShare)
    assert device.limits == MpsLimits(memory_bytes=10 * GI, compute_percent=25)


def test_claim_config_may_lower_the_limits() -> None:
    rc = claim(share("gpu-0", memory="10Gi", compute_percent=25),
               configs=[gpu_config(memoryLimit="8Gi", computePercent=10)])  # fmt: skip
    (device,) = plan(rc).devices
    assert isinstance(device, MpsShare)
    assert device.limits == MpsLimits(memory_bytes=8 * GI, compute_percent=10)


def test_claim_config_may_not_raise_them() -> None:
    rc = claim(share("gpu-0", memory="10Gi"), configs=[gpu_config(memoryLimit="20Gi")])
    with pytest.raises(AllocationError, match="exceeds the 10Gi") as info:
        plan(rc)
    assert f"ns/c:{UID}" in str(info.value)


def test_time_sliced_gpu_gives_a_share_without_limits() -> None:
    (device,) = plan(claim(share("gpu-1")), ctx(default=GpuSettings(Sharing.TIMESLICING))).devices
    assert isinstance(device, TimeSliced)


def test_a_share_of_an_exclusive_gpu_is_refused() -> None:
    with pytest.raises(AllocationError, match=r"does not share it \(sharing=exclusive\)"):
        plan(claim(share("gpu-0")), ctx(default=GpuSettings(Sharing.EXCLUSIVE)))


def test_a_result_without_share_id_holds_the_whole_gpu() -> None:
    (device,) = plan(claim(Allocated("gpu-0"))).devices
    assert isinstance(device, Exclusive)


@pytest.mark.parametrize(
    ("memory", "percent", "config", "variant"),
    [
        # The request policy's default (a claim naming no amount): all but < 1 step.
        (H100_USABLE // (256 * 2**20) * 256 * 2**20, 0, None, Exclusive),
        (H100_USABLE, 100, None, Exclusive),
        (H100_USABLE - 256 * 2**20, 0, None, MpsShare),  # room for one more share
        (H100_USABLE, 50, None, MpsShare),  # an SM cap: a real MPS limit
        (H100_USABLE, 0, gpu_config(memoryLimit="40Gi"), MpsShare),  # lowered by config
    ],
    ids=["policy-default", "all-and-100-percent", "one-step-left", "sm-cap", "config-lowers"],
)
def test_a_share_of_all_the_memory_is_the_whole_gpu(
    memory: int, percent: int, config: dict[str, Any] | None, variant: type[PlannedDevice]
) -> None:
    """On 1.36 a claim that names no amount (the whole-gpu example, nvidia.com/gpu) gets a
    share of the default, all the memory: nothing fits beside it, so no MPS client."""
    rc = claim(share("gpu-0", memory=str(memory), compute_percent=percent),
               configs=[config] if config else [])  # fmt: skip
    (device,) = plan(rc).devices
    assert type(device) is variant
    assert device.share_id  # still the share the allocation holds (status.devices key)


@pytest.mark.parametrize(
    ("prepared_gib", "asked", "refusal"),
    [
        (60, "10Gi", None),
        (70, "20Gi", "gpu-0 cannot hold this share: 1 share(s) already prepared there hold 70Gi"),
        (0, "80Gi", "grants 80Gi (consumedCapacity) on gpu-0, which has 80535Mi"),
    ],
    ids=["fits", "overcommit", "bigger-than-usable"],
)
def test_overcommit_guard(prepared_gib: int, asked: str, refusal: str | None) -> None:
    in_use = {DeviceName("gpu-0"): [HeldDevice(OTHER, mps_share(memory_bytes=prepared_gib * GI))]}
    rc = claim(share("gpu-0", memory=asked))
    context = ctx(memory_reserve_bytes=GI)
    if refusal is None:
        assert isinstance(plan(rc, context, in_use=in_use).devices[0], MpsShare)
        return
    with pytest.raises(AllocationError, match=re.escape(refusal)):
        plan(rc, context, in_use=in_use)


def test_overhead_per_context_counts() -> None:
    in_use = {DeviceName("gpu-0"): [HeldDevice(OTHER, mps_share(memory_bytes=40 * GI))]}
    rc = claim(share("gpu-0", memory=f"{H100_USABLE // GI - 40}Gi"))
    assert plan(rc, in_use=in_use).devices
    with pytest.raises(AllocationError, match="overhead"):
        plan(rc, ctx(mps_context_overhead_bytes=512 * 2**20), in_use=in_use)


MIG_NODE = build_inventory(
    [{"model": "h100-80gb", "mig": True, "migInstances": [{"profile": "3g.40gb", "start": 0}]}],
    NODE,
)


def test_existing_mig_instance() -> None:
    (device,) = plan(claim(Allocated("gpu-0-mig-3g40gb-9-0")), inventory=MIG_NODE).devices
    existing = MIG_NODE.gpus[0].mig_devices[0]
    assert isinstance(device, MigInstance)
    assert device.mig == mig_plan(
        9, "3g.40gb", 0, 4, uuid=existing.uuid, gi_id=existing.gi_id, ci_id=existing.ci_id
    )


def test_free_placement_is_created_at_prepare() -> None:
    (device,) = plan(claim(Allocated("gpu-0-mig-1g10gb-19-5")), inventory=MIG_NODE).devices
    assert isinstance(device, MigInstance)
    assert device.mig == mig_plan(19, "1g.10gb", 5, 1)


def test_a_mig_device_is_held_alone() -> None:
    in_use = {
        DeviceName("gpu-0-mig-1g10gb-19-5"): [
            HeldDevice(OTHER, mig_instance("gpu-0-mig-1g10gb-19-5"))
        ]
    }
    with pytest.raises(AllocationError, match="already prepared for claim"):
        plan(claim(Allocated("gpu-0-mig-1g10gb-19-5")), inventory=MIG_NODE, in_use=in_use)


@pytest.mark.parametrize("device", ["gpu-0", "gpu-0-mig-1g10gb-19-0"], ids=["whole", "overlap"])
def test_devices_this_node_does_not_publish_are_refused(device: str) -> None:
    # The whole GPU is not published while MIG is on; placement 0 overlaps the 3g instance.
    with pytest.raises(AllocationError, match=f"device {device} is not on this node"):
        plan(claim(Allocated(device)), inventory=MIG_NODE)


def test_controller_grant_without_share_id_is_an_mps_share() -> None:
    """1.34/1.35: the API dropped shareID; the controller's GpuShareGrant says the share."""
    raw = resource_claim("ns", "c", uid=UID, node=NODE, devices=[Allocated("gpu-0")])
    raw["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": f"{DRIVER}/v1alpha1",
                    "kind": "GpuShareGrant",
                    "device": "gpu-0",
                    "shareID": "3f1e2d4c-5b6a-4789-8abc-def012345678",
                    "memory": "12Gi",
                    "computePercent": 30,
                },
            },
        }
    ]
    (device,) = plan(claim_from_dict(raw)).devices
    assert isinstance(device, MpsShare)
    assert device.limits == MpsLimits(memory_bytes=12 * GI, compute_percent=30)
