"""``core.claim_shape``: where each field of a ResourceClaim is, and what a malformed one
gives (an error naming the claim and the field; the controller refuses it and goes on)."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocator import AllocatorState
from dra_driver.allocator.model import allocated_results, parse_claim
from dra_driver.base.errors import ClaimError
from dra_driver.controller.reconcile import (
    CONTROLLER_CLASS,
    ClusterView,
    Refuse,
    decide,
    is_ours,
    placement_key,
)
from dra_driver.core import claim_shape
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.claim_shape import MalformedClaimError

DRIVER = "gpu.fractional.dev"
RESULT = {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}


def claim(**parts: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "namespace": "team-a",
            "name": "train",
            "uid": "u-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["resource.kubernetes.io/delete-protection"],
            "annotations": {"a": "b"},
            "ownerReferences": [{"kind": "Pod", "uid": "p-1", "name": "pod"}],
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.fractional.dev"}},
                    {
                        "name": "alt",
                        "firstAvailable": [
                            {"name": "a", "deviceClassName": "first"},
                            {"name": "b", "deviceClassName": CONTROLLER_CLASS},
                        ],
                    },
                ],
                "config": [{"opaque": {"driver": DRIVER, "parameters": {}}}],
                "constraints": [{"matchAttribute": "x"}],
            }
        },
        "status": {
            "allocation": {
                "devices": {"results": [RESULT], "config": [{"source": "FromClass"}]},
                "nodeSelector": {"nodeSelectorTerms": []},
            },
            "reservedFor": [{"resource": "pods", "name": "pod", "uid": "p-1"}],
        },
    }
    obj.update(parts)
    return obj


def test_every_field_is_read_from_its_place() -> None:
    obj = claim()
    ref = claim_shape.ref(obj)
    assert (ref.namespace, ref.name, ref.uid) == ("team-a", "train", "u-1")
    assert (claim_shape.namespace(obj), claim_shape.name(obj), claim_shape.uid(obj)) == (
        "team-a",
        "train",
        "u-1",
    )
    assert claim_shape.key(obj) == "u-1"
    assert claim_shape.resource_version(obj) == 42
    assert claim_shape.creation_timestamp(obj) == "2026-01-01T00:00:00Z"
    assert claim_shape.finalizers(obj) == ["resource.kubernetes.io/delete-protection"]
    assert claim_shape.metadata_annotations(obj) == {"a": "b"}
    assert [o["uid"] for o in claim_shape.owner_references(obj)] == ["p-1"]
    assert claim_shape.is_allocated(obj) and claim_shape.is_reserved(obj)
    assert claim_shape.allocation_results(obj) == [RESULT]
    assert claim_shape.allocation_configs(obj) == [{"source": "FromClass"}]
    assert claim_shape.node_selector(obj) == {"nodeSelectorTerms": []}
    assert [r["name"] for r in claim_shape.device_requests(obj)] == ["gpu", "alt"]
    assert len(claim_shape.device_configs(obj)) == 1
    assert claim_shape.device_constraints(obj) == [{"matchAttribute": "x"}]
    written = claim(status={"devices": [{"driver": DRIVER, "device": "gpu-0"}]})
    assert claim_shape.device_statuses(written) == [{"driver": DRIVER, "device": "gpu-0"}]
    assert list(claim_shape.requested_classes(obj)) == [
        "gpu.fractional.dev",
        "first",
        CONTROLLER_CLASS,
    ]
    assert not claim_shape.is_deleting(obj)
    assert claim_shape.is_deleting(claim(metadata={"deletionTimestamp": "t"}))


def test_absent_parts_read_as_empty() -> None:
    obj: dict[str, Any] = {}
    assert claim_shape.key(obj) == "/"
    assert claim_shape.resource_version(obj) == 0
    assert claim_shape.resource_version({"metadata": {"resourceVersion": "x1"}}) == 0
    assert claim_shape.finalizers(obj) == []
    assert not claim_shape.is_allocated(obj)
    assert not claim_shape.is_allocated({"status": {"allocation": {}}})
    assert claim_shape.allocation_devices(obj) == {}
    assert claim_shape.allocation_results(obj) == ()
    assert claim_shape.node_selector(obj) == {}
    assert not claim_shape.is_reserved(obj)
    assert list(claim_shape.requested_classes(obj)) == []
    assert claim_shape.key({"metadata": {"namespace": "n", "name": "c"}}) == "n/c"


def test_finalizers_is_a_copy() -> None:
    obj = claim()
    claim_shape.finalizers(obj).append("other")
    assert claim_shape.finalizers(obj) == ["resource.kubernetes.io/delete-protection"]


@pytest.mark.parametrize(
    ("obj", "read", "field"),
    [
        pytest.param(claim(status="allocated"), claim_shape.is_allocated, "status", id="status"),
        pytest.param(
            claim(status={"allocation": ["x"]}),
            claim_shape.is_allocated,
            "status.allocation",
            id="allocation",
        ),
        pytest.param(
            claim(status={"allocation": {"devices": {"results": {"a": 1}}}}),
            claim_shape.allocation_results,
            "status.allocation.devices.results",
            id="results",
        ),
        pytest.param(
            claim(status={"reservedFor": ["pod"]}),
            claim_shape.is_reserved,
            "status.reservedFor[0]",
            id="reserved-for-entry",
        ),
        pytest.param(
            claim(metadata={"name": "train", "namespace": "team-a", "finalizers": "f"}),
            claim_shape.finalizers,
            "metadata.finalizers",
            id="finalizers",
        ),
        pytest.param(
            claim(metadata={"name": "train", "namespace": "team-a", "finalizers": [1]}),
            claim_shape.finalizers,
            "metadata.finalizers[0]",
            id="finalizer-entry",
        ),
        pytest.param(
            claim(spec={"devices": {"requests": "gpu"}}),
            lambda c: list(claim_shape.requested_classes(c)),
            "spec.devices.requests",
            id="requests",
        ),
        pytest.param(
            claim(spec={"devices": {"requests": [{"name": "g", "firstAvailable": {}}]}}),
            lambda c: list(claim_shape.requested_classes(c)),
            "spec.devices.requests[0].firstAvailable",
            id="first-available",
        ),
        pytest.param(
            claim(spec={"devices": {"requests": [{"exactly": {}}]}}),
            parse_claim,
            "spec.devices.requests[0]",
            id="request-without-a-name",
        ),
        pytest.param(
            claim(status={"allocation": {"devices": {"results": [{"request": "gpu"}]}}}),
            allocated_results,
            "status.allocation.devices.results[0]",
            id="result-without-a-driver",
        ),
    ],
)
def test_a_malformed_field_names_the_claim_and_the_field(
    obj: dict[str, Any], read: Any, field: str
) -> None:
    with pytest.raises(MalformedClaimError) as caught:
        read(obj)
    assert caught.value.field == field
    message = str(caught.value)
    assert message.startswith("claim team-a/train")
    assert f"malformed field {field}:" in message
    assert "recreate it with that field fixed" in message
    assert isinstance(caught.value, ClaimError)  # the node's per-claim failure


def test_the_node_fails_that_claim_with_the_field() -> None:
    with pytest.raises(ClaimError, match=r"claim team-a/train.*metadata\.annotations"):
        claim_from_dict(claim(metadata={"name": "train", "namespace": "team-a", "annotations": 3}))
    with pytest.raises(ClaimError, match=r"claim team-a/train.*status\.allocation\.devices"):
        claim_from_dict(claim(status={"allocation": {"devices": "gpu-0"}}))


def view() -> ClusterView:
    state = AllocatorState(slices=[], classes=[], allocated_claims=[], driver_name=DRIVER)
    return ClusterView(driver_name=DRIVER, state=state)


@pytest.mark.parametrize(
    ("parts", "field"),
    [
        pytest.param({"status": "allocated"}, "status", id="status"),
        pytest.param(
            {
                "spec": {
                    "devices": {"requests": [{"exactly": {"deviceClassName": CONTROLLER_CLASS}}]}
                },
                "status": {},
            },
            "spec.devices.requests[0]",
            id="request-without-a-name",
        ),
        pytest.param(
            {"spec": {"devices": {"requests": [{"name": "g", "exactly": []}]}}, "status": {}},
            "spec.devices.requests[0]",
            id="unreadable-requests",
        ),
    ],
)
def test_the_controller_refuses_a_malformed_claim_and_goes_on(
    parts: dict[str, Any], field: str
) -> None:
    obj = claim(**parts)
    pod = {
        "metadata": {"namespace": "team-a", "name": "pod", "uid": "p-1"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "train"}]},
    }
    assert is_ours(obj)  # unreadable counts as ours: decide() says what is wrong
    decision = decide(obj, [pod], {}, view())
    assert isinstance(decision, Refuse)
    assert f"malformed field {field}" in decision.reason
    assert "claim team-a/train" in decision.reason
    assert placement_key("u-1", obj, DRIVER)[0] in (0, 1)  # ordered, not raised
