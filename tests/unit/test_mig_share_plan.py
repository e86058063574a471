"""``plan_prepare`` for MPS shares inside MIG instances: mode, limits, the instance.

A share (a result with ``shareID``) of a MIG device on a GPU whose instances
are MPS-shared is an MPS client of the instance's daemon, with the limits the
allocation granted, bounded by the instance's own memory. A share of a free
placement creates the instance, unless another prepared claim's share already
uses one there: then it joins it (and is not the one to destroy it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from dra_driver.base.errors import AllocationError, OvercommitError
from dra_driver.base.ids import ClaimUID, DeviceName, PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import Inventory
from dra_driver.core.prepare import (
    HeldDevice,
    MigInstance,
    MpsInMig,
    NodeContext,
    PlannedDevice,
    PreparePlan,
    limits_of,
    mig_of,
    owned_shares,
    plan_prepare,
)
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing, Tenancy
from dra_driver.fakes.gpu import build_inventory
from dra_driver.fakes.objects import Allocated, resource_claim, share
from tests.support.planned import mig_instance, mig_plan, mps_in_mig

DRIVER = "gpu.fractional.dev"
NODE = "node-a"
KIND = "k8s.gpu.fractional.dev/claim"
UID = "6f1c3a52-0000-4000-8000-00000000000a"
OTHER = ClaimUID("6f1c3a52-0000-4000-8000-00000000000b")
GIB = 2**30
MIB = 2**20

INVENTORY: Inventory = build_inventory(
    [{"model": "h100-80gb", "mig": True, "migInstances": [{"profile": "3g.40gb", "start": 0}]}],
    NODE,
)
EXISTING = INVENTORY.gpus[0].mig_devices[0]
STATIC = "gpu-0-mig-3g40gb-9-0"  # the existing 3g.40gb instance
FREE = "gpu-0-mig-1g10gb-19-4"  # a free 1g.10gb placement
SHARED = NodeSettings(
    per_gpu={"0": GpuSettings(mig_sharing=Sharing.MPS, tenancy=Tenancy.COOPERATIVE)}
)


def _plan(
    *devices: Allocated,
    settings: NodeSettings = SHARED,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]] | None = None,
) -> PreparePlan:
    ctx = NodeContext(
        driver_name=DRIVER,
        node_name=NODE,
        pool_name=PoolName(NODE),
        cdi_kind=KIND,
        settings=settings,
    )
    raw = resource_claim("ns", "claim-a", uid=UID, node=NODE, devices=devices, driver=DRIVER)
    return plan_prepare(claim_from_dict(raw), INVENTORY, ctx, in_use)


MADE = mig_plan(19, "1g.10gb", 4, 1, uuid="MIG-made-by-the-other-claim", gi_id=2, created=True)
AT_STATIC = mig_plan(9, "3g.40gb", 0, 4, uuid=EXISTING.uuid, gi_id=EXISTING.gi_id)


@pytest.mark.parametrize(
    ("devices", "in_use", "variant", "limits", "instance"),
    [
        pytest.param(
            [share(STATIC, memory="4Gi", compute_percent=25, share_id="s1")],
            None, MpsInMig, (4 * GIB, 25), (EXISTING.uuid, False), id="share-of-existing",
        ),
        pytest.param(
            [share(FREE, memory="2Gi", share_id="s1")],
            None, MpsInMig, (2 * GIB, 0), (None, False), id="share-of-free-placement-creates",
        ),
        pytest.param(
            [share(FREE, memory="2Gi", share_id="s2")],
            {DeviceName(FREE): [HeldDevice(OTHER, mps_in_mig(FREE, mig=MADE))]},
            MpsInMig, (2 * GIB, 0), (MADE.mig_uuid, False), id="joins-instance-of-other-share",
        ),
        pytest.param(
            [share(STATIC, memory=f"{EXISTING.memory_mib}Mi", share_id="s1")],
            None, MigInstance, None, (EXISTING.uuid, False), id="all-of-it-is-the-instance",
        ),
        pytest.param(
            [Allocated(STATIC)], None, MigInstance, None, (EXISTING.uuid, False), id="no-share-id",
        ),
    ],
)  # fmt: skip
def test_mig_share_plan(
    devices: list[Allocated],
    in_use: Mapping[DeviceName, Sequence[HeldDevice]] | None,
    variant: type[PlannedDevice],
    limits: tuple[int, int] | None,
    instance: tuple[str | None, bool],
) -> None:
    """``instance``: the MIG UUID the plan names (None: to create) and ``created``."""
    (device,) = _plan(*devices, in_use=in_use).devices
    assert type(device) is variant
    got = limits_of(device)
    assert (None if got is None else (got.memory_bytes, got.compute_percent)) == limits
    mig = mig_of(device)
    assert mig is not None
    assert (mig.mig_uuid, mig.created) == instance
    assert device.gpu_uuid == INVENTORY.gpus[0].uuid


def test_share_on_a_gpu_that_does_not_share_its_instances_is_the_instance() -> None:
    (device,) = _plan(share(STATIC, memory="4Gi", share_id="s1"), settings=NodeSettings()).devices
    assert isinstance(device, MigInstance)


def test_shares_of_one_instance_cannot_overcommit_its_memory() -> None:
    in_use = {
        DeviceName(STATIC): [
            HeldDevice(OTHER, mps_in_mig(STATIC, memory_bytes=36 * GIB, mig=AT_STATIC))
        ]
    }
    with pytest.raises(OvercommitError, match=f"{STATIC} cannot hold this share"):
        _plan(share(STATIC, memory="8Gi", share_id="s1"), in_use=in_use)
    # What fits beside it (the instance holds 40192Mi) is fine.
    _plan(share(STATIC, memory="2Gi", share_id="s1"), in_use=in_use)


def test_share_of_an_instance_held_exclusively_is_refused() -> None:
    in_use = {DeviceName(STATIC): [HeldDevice(OTHER, mig_instance(STATIC, mig=AT_STATIC))]}
    with pytest.raises(AllocationError, match="refusing to give it out twice"):
        _plan(share(STATIC, memory="4Gi", share_id="s1"), in_use=in_use)


def test_two_shares_of_one_claim_on_one_instance_are_two_devices() -> None:
    plan = _plan(
        share(STATIC, memory="4Gi", share_id="s1", request="a"),
        share(STATIC, memory="2Gi", share_id="s2", request="b"),
    )
    assert [(d.share_id, type(d)) for d in plan.devices] == [("s1", MpsInMig), ("s2", MpsInMig)]
    assert [d.cdi_device_ids for d in plan.devices] == [
        (f"{KIND}={UID}-{STATIC}-s1",),
        (f"{KIND}={UID}-{STATIC}-s2",),
    ]


def test_owned_shares_name_a_mig_share_by_its_instance() -> None:
    """Start-up reconciliation keeps the agent's shares prepared claims own: a share
    inside a MIG instance lives at the instance's daemon, named by the MIG UUID."""
    plan = _plan(share(STATIC, memory="4Gi", share_id="s1"))
    assert owned_shares(plan.devices) == [(EXISTING.uuid, "s1")]
