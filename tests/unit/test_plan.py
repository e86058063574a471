"""``plan_prepare``: what a claim gets on this node, or why not."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from dra_driver.base.errors import (
    AllocationError,
    ClaimError,
    ClaimNotAllocatedError,
    ClaimNotOnNodeError,
)
from dra_driver.base.ids import ClaimUID, DeviceName, PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.cdi import CdiSpec, DeviceNode
from dra_driver.core.model import Inventory, ResourceClaim
from dra_driver.core.prepare import HeldDevice, Mode, NodeContext, PreparePlan, plan_prepare
from dra_driver.fakes.gpu import build_inventory
from dra_driver.fakes.objects import Allocated, resource_claim
from tests.support.planned import admin, exclusive, time_sliced

DRIVER = "gpu.fractional.dev"
NODE = "node-a"
KIND = "k8s.gpu.fractional.dev/claim"
UID = "6f1c3a52-0000-4000-8000-000000000001"
OTHER_UID = ClaimUID("6f1c3a52-0000-4000-8000-000000000002")
CLAIM_STR = f"ns/claim-1:{UID}"

CTX = NodeContext(driver_name=DRIVER, node_name=NODE, pool_name=PoolName(NODE), cdi_kind=KIND)

# Minors differ from indexes on purpose: /dev/nvidia<N> must use the minor.
INVENTORY: Inventory = build_inventory(
    [
        {"model": "h100-80gb", "minor": 4},
        {"model": "h100-80gb", "minor": 5},
        {"model": "l4", "minor": 7},
    ],
    NODE,
)
MINOR = {"gpu-0": 4, "gpu-1": 5, "gpu-2": 7}


def claim(*devices: Allocated, node: str | None = NODE, allocated: bool = True) -> ResourceClaim:
    raw = resource_claim(
        "ns", "claim-1", uid=UID, node=node, devices=devices, driver=DRIVER, allocated=allocated
    )
    return claim_from_dict(raw)


def plan(
    rc: ResourceClaim, in_use: Mapping[DeviceName, Sequence[HeldDevice]] | None = None
) -> PreparePlan:
    return plan_prepare(rc, INVENTORY, CTX, in_use)


@dataclass(frozen=True)
class Want:
    """One expected planned device."""

    device: str
    requests: tuple[str, ...]
    mode: Mode = Mode.EXCLUSIVE
    share_id: str | None = None

    @property
    def cdi_name(self) -> str:
        suffix = f"-{self.share_id}" if self.share_id else ""
        return f"{UID}-{self.device}{suffix}"


# --- what a claim gets ---------------------------------------------------------------

PLAN_CASES = [
    pytest.param(
        [Allocated("gpu-1")],
        [Want("gpu-1", ("gpu",))],
        id="exclusive-gpu",
    ),
    pytest.param(
        [Allocated("gpu-0", request="train/h100")],
        [Want("gpu-0", ("train",))],
        id="sub-request-stripped-to-main",
    ),
    pytest.param(
        [Allocated("gpu-0", request="a"), Allocated("gpu-2", request="b")],
        [Want("gpu-0", ("a",)), Want("gpu-2", ("b",))],
        id="two-devices",
    ),
    pytest.param(
        [Allocated("gpu-0", request="b"), Allocated("gpu-0", request="a/x")],
        [Want("gpu-0", ("a", "b"))],
        id="two-results-one-device-merged",
    ),
    pytest.param(
        [Allocated("gpu-1", share_id="7d0c9e")],
        [Want("gpu-1", ("gpu",), Mode.MPS, "7d0c9e")],
        id="share",
    ),
    pytest.param(
        [Allocated("gpu-1", admin_access=True)],
        [Want("gpu-1", ("gpu",), Mode.ADMIN)],
        id="admin-access",
    ),
    pytest.param(
        [Allocated("gpu-1", request="mon", admin_access=True), Allocated("gpu-1", request="use")],
        [Want("gpu-1", ("mon", "use"), Mode.EXCLUSIVE)],
        id="admin-and-exclusive-on-one-device-strongest-wins",
    ),
    pytest.param(
        [Allocated("gpu-0", driver="other.example.com"), Allocated("gpu-2")],
        [Want("gpu-2", ("gpu",))],
        id="other-drivers-results-ignored",
    ),
]


@pytest.mark.parametrize(("devices", "want"), PLAN_CASES)
def test_plan(devices: list[Allocated], want: list[Want]) -> None:
    result = plan(claim(*devices))

    assert result.claim_uid == UID
    got = [
        (d.device_name, d.request_names, d.mode, d.share_id, d.pool_name, d.cdi_device_ids)
        for d in result.devices
    ]
    assert got == [
        (w.device, w.requests, w.mode, w.share_id, NODE, (f"{KIND}={w.cdi_name}",)) for w in want
    ]
    uuids = {g.device_name: g.uuid for g in INVENTORY.gpus}
    assert [d.gpu_uuid for d in result.devices] == [uuids[DeviceName(w.device)] for w in want]
    assert_spec(result.cdi_spec, want)


def assert_spec(spec: CdiSpec, want: list[Want]) -> None:
    assert spec.kind == KIND
    assert [(d.name, d.edits.device_nodes) for d in spec.devices] == [
        (
            w.cdi_name,
            (DeviceNode(f"/dev/nvidia{MINOR[w.device]}", "c", 195, MINOR[w.device]),),
        )
        for w in want
    ]
    # The control node is needed by every device, so it sits in the spec-level edits.
    assert spec.common_edits.device_nodes == (DeviceNode("/dev/nvidiactl", "c", 195, 255),)
    for device in spec.devices:
        assert spec.qualified_name(device) == f"{KIND}={device.name}"


def test_no_node_selector_is_planned_by_pool() -> None:
    devices = [Allocated("gpu-0", pool=NODE)]
    result = plan(claim(*devices, node=None))
    assert [d.device_name for d in result.devices] == ["gpu-0"]


# --- why not ---------------------------------------------------------------------------

ERROR_CASES = [
    pytest.param(
        claim(allocated=False),
        ClaimNotAllocatedError,
        ["not allocated"],
        id="not-allocated",
    ),
    pytest.param(
        claim(Allocated("gpu-0", pool=NODE), node="node-b"),
        ClaimNotOnNodeError,
        ["node-b", f"this node {NODE}"],
        id="node-selector-names-other-node",
    ),
    pytest.param(
        claim(Allocated("gpu-0", driver="other.example.com")),
        ClaimNotOnNodeError,
        [f"no results for driver {DRIVER}"],
        id="results-only-for-another-driver",
    ),
    pytest.param(
        claim(Allocated("gpu-0", pool="node-b")),
        ClaimNotOnNodeError,
        ["pool node-b", f"pool {NODE}"],
        id="results-in-another-pool",
    ),
    pytest.param(
        claim(Allocated("gpu-9")),
        AllocationError,
        ["gpu-9", "devices here: gpu-0, gpu-1, gpu-2"],
        id="unknown-device",
    ),
]


@pytest.mark.parametrize(("rc", "error", "fragments"), ERROR_CASES)
def test_plan_refuses(rc: ResourceClaim, error: type[ClaimError], fragments: list[str]) -> None:
    with pytest.raises(error) as info:
        plan(rc)
    message = str(info.value)
    assert CLAIM_STR in message
    for fragment in fragments:
        assert fragment in message
    assert info.value.claim == rc.ref


# --- double use ------------------------------------------------------------------------

CONFLICT_CASES = [
    pytest.param(
        Allocated("gpu-1"),
        [HeldDevice(OTHER_UID, exclusive("gpu-1"))],
        True,
        id="exclusive-vs-exclusive",
    ),
    pytest.param(
        Allocated("gpu-1", share_id="s1"),
        [HeldDevice(OTHER_UID, exclusive("gpu-1"))],
        True,
        id="share-vs-exclusive",
    ),
    pytest.param(
        Allocated("gpu-1"),
        [HeldDevice(OTHER_UID, time_sliced("gpu-1"))],
        True,
        id="exclusive-vs-share",
    ),
    pytest.param(
        Allocated("gpu-1", share_id="s1"),
        [HeldDevice(OTHER_UID, time_sliced("gpu-1"))],
        False,
        id="share-vs-share",
    ),
    pytest.param(
        Allocated("gpu-1", admin_access=True),
        [HeldDevice(OTHER_UID, exclusive("gpu-1"))],
        False,
        id="admin-vs-exclusive",
    ),
    pytest.param(
        Allocated("gpu-1"),
        [HeldDevice(OTHER_UID, admin("gpu-1"))],
        False,
        id="exclusive-vs-admin",
    ),
    pytest.param(
        Allocated("gpu-1"),
        [HeldDevice(ClaimUID(UID), exclusive("gpu-1"))],
        False,
        id="own-earlier-use",
    ),
    pytest.param(
        Allocated("gpu-1"),
        [
            HeldDevice(ClaimUID(UID), exclusive("gpu-1")),
            HeldDevice(OTHER_UID, time_sliced("gpu-1")),
        ],
        True,
        id="own-use-does-not-hide-another",
    ),
]


@pytest.mark.parametrize(("device", "uses", "conflict"), CONFLICT_CASES)
def test_conflicts(device: Allocated, uses: list[HeldDevice], conflict: bool) -> None:
    rc = claim(device)
    in_use = {DeviceName("gpu-1"): uses}
    if conflict:
        with pytest.raises(AllocationError) as info:
            plan(rc, in_use)
        assert CLAIM_STR in str(info.value)
        assert "gpu-1" in str(info.value)
        assert OTHER_UID in str(info.value)
    else:
        assert [d.device_name for d in plan(rc, in_use).devices] == ["gpu-1"]


def test_use_of_another_device_is_no_conflict() -> None:
    in_use = {DeviceName("gpu-0"): [HeldDevice(OTHER_UID, exclusive("gpu-0"))]}
    assert [d.device_name for d in plan(claim(Allocated("gpu-1")), in_use).devices] == ["gpu-1"]


# --- determinism -----------------------------------------------------------------------

MANY = [
    Allocated("gpu-2", request="c"),
    Allocated("gpu-0", request="a"),
    Allocated("gpu-1", request="b", share_id="s2"),
    Allocated("gpu-1", request="d", share_id="s1"),
    Allocated("gpu-0", request="e/x"),
    Allocated("gpu-2", request="f", admin_access=True),
]


def test_same_input_same_plan() -> None:
    assert plan(claim(*MANY)) == plan(claim(*MANY))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_result_order_does_not_matter(seed: int) -> None:
    shuffled = list(MANY)
    random.Random(seed).shuffle(shuffled)
    assert shuffled != MANY
    assert plan(claim(*shuffled)) == plan(claim(*MANY))


def test_exclusive_and_share_of_one_device_in_one_claim_is_refused() -> None:
    claim = claim_from_dict(
        resource_claim(
            "ns",
            "mixed",
            uid=UID,
            devices=[
                Allocated("gpu-0", request="whole"),
                Allocated("gpu-0", request="part", share_id="5a1e2d3c-0000-4000-8000-000000000001"),
            ],
        )
    )
    with pytest.raises(AllocationError, match="both exclusively and as a share") as info:
        plan_prepare(claim, INVENTORY, CTX)
    assert str(claim.ref) in str(info.value)
