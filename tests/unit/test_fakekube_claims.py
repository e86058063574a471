"""The fake API server checks a claim's ``status.reservedFor`` as kube-apiserver does
(``validateResourceClaimConsumers``, ``ValidateResourceClaimStatusUpdate``) and, as its
status strategy, ignores metadata sent to ``/status``: over HTTP, as the controller
writes."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.fakes.objects import resource_claim
from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_claims import RESERVED_FOR_MAX, reserved_for_errors
from tests.support.http import send_json

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = "application/merge-patch+json"
POD = {"resource": "pods", "name": "p1", "uid": "uid-p1"}


def _status_patch(api: FakeKubeApi, name: str, status: dict[str, Any]) -> tuple[int, Any]:
    return send_json(
        api, "PATCH", f"{CLAIMS}/{name}/status", {"status": status}, content_type=MERGE
    )


def test_allocation_and_reservation_in_one_status_write(fake_kube: FakeKubeApi) -> None:
    allocated = resource_claim("default", "c1")
    allocation = allocated["status"]["allocation"]
    fake_kube.create(resource_claim("default", "c1", allocated=False))
    code, body = _status_patch(fake_kube, "c1", {"allocation": allocation, "reservedFor": [POD]})
    assert code == 200, body
    assert body["status"]["reservedFor"] == [POD]


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        ([{"resource": "pods", "name": "p1"}], "status.reservedFor[0].uid: Required value"),
        ([{"name": "p1", "uid": "u"}], "status.reservedFor[0].resource: Required value"),
        ([POD, {**POD, "name": "p2"}], 'status.reservedFor[1].uid: Duplicate value: "uid-p1"'),
    ],
    ids=["no-uid", "no-resource", "same-uid-twice"],
)
def test_malformed_reservations_are_invalid(
    fake_kube: FakeKubeApi, reserved: list[dict[str, str]], message: str
) -> None:
    allocation = resource_claim("default", "c1")["status"]["allocation"]
    fake_kube.create(resource_claim("default", "c1", allocated=False))
    code, body = _status_patch(fake_kube, "c1", {"allocation": allocation, "reservedFor": reserved})
    assert code == 422 and message in body["message"], body


def test_a_reservation_needs_an_allocation(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(resource_claim("default", "c1", allocated=False))
    code, body = _status_patch(fake_kube, "c1", {"reservedFor": [POD]})
    assert code == 422
    assert "may not be specified when `allocated` is not set" in body["message"]


def test_no_new_reservation_while_the_claim_is_deleted(fake_kube: FakeKubeApi) -> None:
    claim = resource_claim("default", "c1")
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    fake_kube.create(claim)
    assert send_json(fake_kube, "DELETE", f"{CLAIMS}/c1")[0] in (200, 202)
    kept = fake_kube.get("ResourceClaim", "c1", "default")["status"]["reservedFor"]
    code, body = _status_patch(fake_kube, "c1", {"reservedFor": [*kept, POD]})
    assert code == 422 and "new entries may not be added" in body["message"], body
    code, body = _status_patch(fake_kube, "c1", {"reservedFor": None})  # removing is fine
    assert code == 200, body


def test_a_status_write_ignores_the_finalizers_it_carries(fake_kube: FakeKubeApi) -> None:
    """The status strategy resets metadata (``ResetObjectMetaForStatus``): one request
    cannot add the finalizer and the allocation together."""
    allocation = resource_claim("default", "c1")["status"]["allocation"]
    fake_kube.create(resource_claim("default", "c1", allocated=False))
    code, body = send_json(
        fake_kube,
        "PATCH",
        f"{CLAIMS}/c1/status",
        {
            "metadata": {"finalizers": ["resource.kubernetes.io/delete-protection"]},
            "status": {"allocation": allocation},
        },
        content_type=MERGE,
    )
    assert code == 200, body
    assert body["status"]["allocation"]
    assert not body["metadata"].get("finalizers")


def test_at_most_256_reservations() -> None:
    entries = [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"} for i in range(257)]
    claim = {"metadata": {}, "status": {"allocation": {"devices": {}}, "reservedFor": entries}}
    assert reserved_for_errors({}, claim) == [
        f"status.reservedFor: Too long: must have at most {RESERVED_FOR_MAX} items"
    ]
    claim["status"]["reservedFor"] = entries[:256]
    assert reserved_for_errors({}, claim) == []
