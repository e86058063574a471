"""``leftover_mig_instances``: what a rolled-back claim's devices leave to destroy."""

from __future__ import annotations

import pytest

from dra_driver.core.model import Inventory
from dra_driver.core.prepare import LeftoverMig, PlannedDevice, leftover_mig_instances
from dra_driver.fakes.gpu import build_inventory
from tests.support.planned import admin, exclusive, mig_instance, mig_plan, mps_in_mig

INVENTORY: Inventory = build_inventory(
    [{"model": "h100-80gb", "mig": True, "migInstances": [{"profile": "3g.40gb", "start": 0}]}],
    "node",
)
GPU = INVENTORY.gpus[0]
FOUND = GPU.mig_devices[0]


AT_FOUND = mig_plan(FOUND.profile_id, FOUND.profile_name, FOUND.placement.start, 4)
MADE = mig_plan(19, "1g.10gb", 4, 1, uuid="MIG-x", gi_id=7, ci_id=0, created=True)
EXISTING = mig_plan(19, "1g.10gb", 4, 1, uuid="MIG-x", gi_id=7, ci_id=0)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        pytest.param(
            mig_instance("d", gpu=GPU.uuid, mig=MADE),
            [LeftoverMig(GPU.uuid, 7)],
            id="created-by-the-claim",
        ),
        pytest.param(
            mps_in_mig("d", gpu=GPU.uuid, mig=EXISTING),
            [],
            id="existed-before",
        ),
        pytest.param(
            mig_instance("d", gpu=GPU.uuid, mig=AT_FOUND),
            [LeftoverMig(GPU.uuid, FOUND.gi_id, FOUND.uuid)],
            id="found-at-a-placement-planned-free",
        ),
        pytest.param(
            mps_in_mig("d", gpu=GPU.uuid, mig=AT_FOUND),
            [LeftoverMig(GPU.uuid, FOUND.gi_id, FOUND.uuid)],
            id="a-share-found-at-a-placement-planned-free",
        ),
        pytest.param(
            mig_instance("d", gpu=GPU.uuid, mig=mig_plan(19, "1g.10gb", 6, 1)),
            [],
            id="nothing-at-the-placement",
        ),
        pytest.param(admin("d", gpu=GPU.uuid, mig=AT_FOUND), [], id="admin-of-a-mig-device"),
        pytest.param(exclusive("d", gpu=GPU.uuid), [], id="no-mig-plan"),
    ],
)
def test_leftover_mig_instances(device: PlannedDevice, expected: list[LeftoverMig]) -> None:
    assert leftover_mig_instances([device], INVENTORY) == tuple(expected)
