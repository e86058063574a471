"""Which pod the controller reserves a claim for with its allocation (pure): only the pod
that controls the claim, as the controller manager makes a template's claim."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocator import AllocatorState
from dra_driver.controller.reconcile import PodConsumer, allocation_patch, owning_pod
from tests.support.allocator import CLASSES, DRIVER, claim, request, slices

JsonObj = dict[str, Any]
SHARE_ID = "00000000-0000-0000-0000-000000000001"


def _pod(name: str, uid: str) -> JsonObj:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid}, "spec": {}}


def _claim(owners: list[JsonObj]) -> JsonObj:
    obj = claim(request(memory="10Gi"))
    obj["metadata"] = {"namespace": "default", "name": "c", "uid": "uc", "resourceVersion": "7"}
    if owners:
        obj["metadata"]["ownerReferences"] = owners
    return obj


def _owner(name: str, uid: str, *, controller: bool = True, kind: str = "Pod") -> JsonObj:
    return {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": controller}


@pytest.mark.parametrize(
    ("owners", "expected"),
    [
        ([_owner("p1", "u1")], PodConsumer("p1", "u1")),
        ([], None),
        ([_owner("p1", "u1", controller=False)], None),
        ([_owner("p1", "u1", kind="Job")], None),
        ([_owner("p1", "other-uid")], None),  # a pod of that name, but not that one
    ],
    ids=["its-pod", "no-owner", "owner-not-controller", "not-a-pod", "replaced-pod"],
)
def test_only_the_controlling_pod_is_reserved(
    owners: list[JsonObj], expected: PodConsumer | None
) -> None:
    pods = [_pod("p1", "u1"), _pod("p2", "u2")]
    assert owning_pod(_claim(owners), pods) == expected


def test_the_patch_carries_allocation_and_reservation() -> None:
    obj = _claim([_owner("p1", "u1")])
    state = AllocatorState(
        slices=slices("h100-80gb:1"), classes=CLASSES, allocated_claims=[], driver_name=DRIVER
    )
    outcome = state.allocate(obj, record=False, share_id=lambda: SHARE_ID)
    assert outcome.allocation is not None
    patch = allocation_patch(
        obj, outcome.allocation, "2026-01-01T00:00:00Z", keep_shares=True,
        reserve_for=PodConsumer("p1", "u1"),
    )  # fmt: skip
    assert patch["metadata"] == {"resourceVersion": "7"}
    assert patch["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": "u1"}]
    assert patch["status"]["allocation"]["devices"]["results"]
    plain = allocation_patch(obj, outcome.allocation, "2026-01-01T00:00:00Z", keep_shares=True)
    assert set(plain["status"]) == {"allocation"}
