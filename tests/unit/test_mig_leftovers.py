"""``leftover_mig_instances``: what a rolled-back claim's devices leave to destroy."""

from __future__ import annotations

import pytest

from dra_driver.base.ids import DeviceName, PoolName
from dra_driver.core.model import Inventory
from dra_driver.core.prepare import (
    LeftoverMig,
    MigPlan,
    Mode,
    PlannedDevice,
    leftover_mig_instances,
)
from dra_driver.fakes.gpu import build_inventory

INVENTORY: Inventory = build_inventory(
    [{"model": "h100-80gb", "mig": True, "migInstances": [{"profile": "3g.40gb", "start": 0}]}],
    "node",
)
GPU = INVENTORY.gpus[0]
FOUND = GPU.mig_devices[0]


def dev(mig: MigPlan | None, mode: Mode = Mode.MIG) -> PlannedDevice:
    return PlannedDevice(
        request_names=("r",),
        pool_name=PoolName("node"),
        device_name=DeviceName("d"),
        share_id=None,
        gpu_uuid=GPU.uuid,
        mode=mode,
        cdi_device_ids=(),
        mig=mig,
    )


AT_FOUND = MigPlan(FOUND.profile_id, FOUND.profile_name, FOUND.placement.start, 4)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        pytest.param(
            dev(MigPlan(19, "1g.10gb", 4, 1, mig_uuid="MIG-x", gi_id=7, ci_id=0, created=True)),
            [LeftoverMig(GPU.uuid, 7)],
            id="created-by-the-claim",
        ),
        pytest.param(
            dev(MigPlan(19, "1g.10gb", 4, 1, mig_uuid="MIG-x", gi_id=7, ci_id=0), Mode.MPS),
            [],
            id="existed-before",
        ),
        pytest.param(
            dev(AT_FOUND),
            [LeftoverMig(GPU.uuid, FOUND.gi_id, FOUND.uuid)],
            id="found-at-a-placement-planned-free",
        ),
        pytest.param(dev(AT_FOUND, Mode.MPS), [LeftoverMig(GPU.uuid, FOUND.gi_id, FOUND.uuid)]),
        pytest.param(dev(MigPlan(19, "1g.10gb", 6, 1)), [], id="nothing-at-the-placement"),
        pytest.param(dev(AT_FOUND, Mode.EXCLUSIVE), [], id="not-a-mig-device"),
        pytest.param(dev(None), [], id="no-mig-plan"),
    ],
)
def test_leftover_mig_instances(device: PlannedDevice, expected: list[LeftoverMig]) -> None:
    assert leftover_mig_instances([device], INVENTORY) == tuple(expected)
