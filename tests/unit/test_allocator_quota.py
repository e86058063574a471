"""The per-namespace VRAM quota of the controller path, in the pure allocator."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from dra_driver.allocator import (
    AllocationOutcome,
    AllocatorState,
    InvalidQuotaError,
    VramQuota,
    allocate,
    parse_vram_quota,
    quota_annotation,
    sentinel_expression,
)
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings, Sharing
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec

DRIVER = "gpu.fractional.dev"
CLASS = "share.gpu.fractional.dev"
GI = 2**30
MI = 2**20
ANNOTATION = "gpu.fractional.dev/vram-quota"


def slices(sharing: Sharing = Sharing.MPS) -> list[dict[str, Any]]:
    """Two fake H100s on ``node-a``, controller-managed, as a 1.36 cluster keeps them."""
    settings = GpuSettings(allocator=Allocator.CONTROLLER, sharing=sharing)
    built = build_slices(
        build_inventory(load_spec("h100-80gb:2"), "node-a"),
        driver_name=DRIVER,
        node_name="node-a",
        settings=NodeSettings(default=settings),
        capabilities=Capabilities.for_version(36),
    )
    return [{"spec": s.spec} for s in built]


def device_class(name: str, *selectors: str) -> dict[str, Any]:
    exprs = [sentinel_expression(DRIVER), *selectors]
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs]},
    }


CLASSES = [
    device_class(CLASS),
    device_class("gpu", f'device.attributes["{DRIVER}"].type == "gpu"'),
]


def request(name: str = "gpu", memory: str | None = "10Gi", **extra: Any) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": CLASS, **extra}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": exactly}


def quota(limit: str | int, namespace: str = "team-a") -> VramQuota:
    value = limit if isinstance(limit, int) else int(limit.removesuffix("Gi")) * GI
    return VramQuota(namespace=namespace, limit=value, annotation=ANNOTATION)


def claim(*requests: Mapping[str, Any], namespace: str = "team-a", **devices: Any) -> Any:
    return {
        "metadata": {"namespace": namespace, "name": "c", "uid": "u1"},
        "spec": {"devices": {"requests": list(requests or [request()]), **devices}},
    }


def held(
    namespace: str,
    memory: str | None,
    device: str = "gpu-0",
    *,
    admin: bool = False,
    **meta: Any,
) -> dict[str, Any]:
    """An allocated claim of ``namespace``: a share of ``memory``, or (None) the whole
    ``device``."""
    result: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": "node-a"}
    result["device"] = device
    if memory is not None:
        result |= {"shareID": f"s-{namespace}-{memory}", "consumedCapacity": {"memory": memory}}
    if admin:
        result["adminAccess"] = True
    return {
        "metadata": {"namespace": namespace, "name": f"held-{memory}", **meta},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def run(
    claim_obj: Mapping[str, Any], allocated: list[dict[str, Any]], **kw: Any
) -> AllocationOutcome:
    ids = (f"share-{n}" for n in itertools.count())
    return allocate(
        claim_obj,
        slices=kw.pop("slices", slices()),
        classes=CLASSES,
        allocated_claims=allocated,
        driver_name=DRIVER,
        share_id=lambda: next(ids),
        **kw,
    )


def refused(outcome: AllocationOutcome) -> str:
    assert outcome.allocation is None, "expected a quota refusal"
    assert outcome.failure == "quota", outcome.reason
    assert outcome.reason is not None
    return outcome.reason


# --- fits / exceeds --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "used", "asked", "fits"),
    [
        ("40Gi", ["20Gi"], "10Gi", True),
        ("40Gi", ["20Gi", "10Gi"], "10Gi", True),  # exactly the quota
        ("40Gi", ["20Gi", "12Gi"], "10Gi", False),
        ("40Gi", [], "41Gi", False),
        ("0Gi", [], "1Gi", False),
    ],
    ids=["room", "exactly-full", "exceeds", "one-claim-too-big", "zero-quota"],
)
def test_quota_fits_or_refuses(limit: str, used: list[str], asked: str, fits: bool) -> None:
    allocated = [held("team-a", m, f"gpu-{n % 2}") for n, m in enumerate(used)]
    outcome = run(claim(request(memory=asked)), allocated, quota=quota(limit))
    if fits:
        assert outcome.allocation is not None, outcome.reason
        return
    reason = refused(outcome)
    total_used = sum(int(m.removesuffix("Gi")) for m in used)
    assert f"namespace team-a: VRAM quota {limit if limit != '0Gi' else '0'}" in reason
    assert f"annotation {ANNOTATION}" in reason
    assert f"{total_used}Gi in use" in reason or (total_used == 0 and "0 in use" in reason)
    assert f"{asked} asked" in reason


def test_the_reason_in_full() -> None:
    outcome = run(claim(request(memory="10Gi")), [held("team-a", "32Gi")], quota=quota("40Gi"))
    assert refused(outcome) == (
        "namespace team-a: VRAM quota 40Gi (annotation gpu.fractional.dev/vram-quota)"
        " exceeded: 32Gi in use, 10Gi asked, 8Gi left"
    )


def test_without_quota_the_same_claim_fits() -> None:
    outcome = run(claim(request(memory="10Gi")), [held("team-a", "32Gi")])
    assert outcome.allocation is not None


def test_only_the_namespace_own_claims_are_charged() -> None:
    others = [held("team-b", "30Gi", "gpu-0"), held("team-b", "30Gi", "gpu-1")]
    outcome = run(claim(request(memory="40Gi")), others, quota=quota("40Gi"))
    assert outcome.allocation is not None, outcome.reason
    mine = [held("team-a", "30Gi", "gpu-0")]
    assert "30Gi in use" in refused(run(claim(request(memory="40Gi")), mine, quota=quota("40Gi")))


def test_whole_devices_charge_their_memory_and_admin_access_nothing() -> None:
    state = AllocatorState(
        slices=slices(),
        classes=CLASSES,
        allocated_claims=[held("team-a", None, "gpu-0"), held("team-a", None, "gpu-1", admin=True)],
        driver_name=DRIVER,
    )
    gpu_memory = next(
        d.capacity["memory"].value for d in state.devices if d.name == "gpu-0"
    )  # the GPU's shareable memory, as published
    assert state.memory_held("team-a") == gpu_memory
    assert state.memory_held("team-b") == 0
    reason = refused(
        state.allocate(claim(request(memory="1Gi")), quota=quota(int(gpu_memory)), record=False)
    )
    assert "1Gi asked, 0 left" in reason


def test_claims_being_deleted_are_charged_until_their_allocation_is_gone() -> None:
    deleting = held("team-a", "30Gi", deletionTimestamp="2026-01-01T00:00:00Z")
    reason = refused(run(claim(request(memory="20Gi")), [deleting], quota=quota("40Gi")))
    assert "30Gi in use" in reason
    gone = {**deleting, "status": {}}
    assert run(claim(request(memory="20Gi")), [gone], quota=quota("40Gi")).allocation is not None


def test_asked_is_the_memory_after_the_request_policy_rounding() -> None:
    # 1000Mi rounds up to the 256Mi step: 1Gi is consumed, so a 1000Mi quota refuses it.
    limit = 1000 * MI
    reason = refused(run(claim(request(memory="1000Mi")), [], quota=quota(limit)))
    assert "VRAM quota 1000Mi" in reason and "1Gi asked" in reason
    assert run(claim(request(memory="1000Mi")), [], quota=quota(GI)).allocation is not None


# --- multi-device claims ---------------------------------------------------------------


def test_count_two_is_charged_twice() -> None:
    two = claim(request(memory="10Gi", count=2))
    reason = refused(run(two, [held("team-a", "25Gi")], quota=quota("40Gi")))
    assert "25Gi in use, 20Gi asked, 15Gi left" in reason
    outcome = run(two, [held("team-a", "20Gi")], quota=quota("40Gi"))
    assert outcome.allocation is not None and len(outcome.allocation.results) == 2


def test_two_requests_are_charged_together() -> None:
    pair = claim(request("a", memory="8Gi"), request("b", memory="8Gi"))
    assert "16Gi asked" in refused(run(pair, [], quota=quota("15Gi")))
    assert run(pair, [], quota=quota("16Gi")).allocation is not None


def test_first_available_takes_the_alternative_within_the_quota() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": CLASS, "capacity": {"requests": {"memory": "40Gi"}}},
            {
                "name": "small",
                "deviceClassName": CLASS,
                "capacity": {"requests": {"memory": "8Gi"}},
            },
        ],
    }
    outcome = run(claim(req), [held("team-a", "24Gi")], quota=quota("40Gi"))
    assert outcome.allocation is not None, outcome.reason
    assert outcome.allocation.results[0].request == "gpu/small"
    assert "8Gi asked" in refused(run(claim(req), [held("team-a", "33Gi")], quota=quota("40Gi")))


def test_a_whole_gpu_is_charged_all_its_memory() -> None:
    whole = claim(request(memory=None, deviceClassName="gpu"))
    # Shared GPUs: no memory asked means the request policy's default, the whole GPU.
    reason = refused(run(whole, [], quota=quota("40Gi")))
    assert "0 in use, 81408Mi asked" in reason
    # Exclusive GPUs (no shares): the result holds the device, charged its memory.
    exclusive = slices(sharing=Sharing.EXCLUSIVE)
    assert "0 in use, 81559Mi asked" in refused(
        run(whole, [], slices=exclusive, quota=quota(81558 * MI))
    )
    placed = run(whole, [], slices=exclusive, quota=quota(81559 * MI))
    assert placed.allocation is not None, placed.reason
    assert placed.allocation.results[0].share_id is None


# --- the incremental state -------------------------------------------------------------


def test_state_charges_its_own_allocations_and_recorded_claims() -> None:
    state = AllocatorState(
        slices=slices(), classes=CLASSES, allocated_claims=[], driver_name=DRIVER
    )
    limit = quota("30Gi")
    for _ in range(3):
        outcome = state.allocate(claim(request(memory="10Gi")), quota=limit)
        assert outcome.allocation is not None, outcome.reason
    assert state.memory_held("team-a") == 30 * GI
    assert "30Gi in use" in refused(state.allocate(claim(request(memory="1Gi")), quota=limit))
    other = quota("30Gi", namespace="team-b")
    state.record_claim(held("team-b", "25Gi", "gpu-1"))
    assert state.memory_held("team-b") == 25 * GI
    assert "25Gi in use" in refused(
        state.allocate(claim(request(memory="6Gi"), namespace="team-b"), quota=other)
    )


def test_a_quota_for_another_namespace_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="team-b"):
        run(claim(), [], quota=quota("40Gi", namespace="team-b"))


# --- the annotation --------------------------------------------------------------------


def namespace(value: Any = None, name: str = "team-a") -> dict[str, Any]:
    annotations = {} if value is None else {ANNOTATION: value}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_annotation_key_derives_from_the_driver_name() -> None:
    assert quota_annotation(DRIVER) == ANNOTATION
    assert quota_annotation("gpu.example.com") == "gpu.example.com/vram-quota"
    other = {"metadata": {"name": "x", "annotations": {"gpu.example.com/vram-quota": "1Gi"}}}
    assert parse_vram_quota(other, DRIVER) is None
    assert parse_vram_quota(other, "gpu.example.com") == VramQuota(
        "x", GI, "gpu.example.com/vram-quota"
    )


@pytest.mark.parametrize(
    ("value", "limit"),
    [("40Gi", 40 * GI), ("500G", 500 * 10**9), ("81920Mi", 80 * GI), ("0", 0), ("1e9", 10**9)],
)
def test_valid_annotations(value: str, limit: int) -> None:
    assert parse_vram_quota(namespace(value), DRIVER) == VramQuota("team-a", limit, ANNOTATION)


def test_no_annotation_or_no_namespace_means_no_quota() -> None:
    assert parse_vram_quota(namespace(), DRIVER) is None
    assert parse_vram_quota({"metadata": {"name": "team-a"}}, DRIVER) is None
    assert parse_vram_quota(None, DRIVER) is None


@pytest.mark.parametrize(
    ("value", "cause"),
    [
        ("forty", "is not a quantity"),
        ("40 Gi", "is not a quantity"),
        ("40GB", "is not a quantity"),
        ("", "is not a quantity"),
        ("-1Gi", "negative"),
        ("500m", "whole number of bytes"),
        ("1.5", "whole number of bytes"),
    ],
)
def test_malformed_annotations_name_namespace_annotation_and_format(value: str, cause: str) -> None:
    with pytest.raises(InvalidQuotaError) as caught:
        parse_vram_quota(namespace(value), DRIVER)
    message = str(caught.value)
    assert message.startswith(f"namespace team-a: annotation {ANNOTATION}={value!r}")
    assert cause in message
    assert "expected a memory quantity in bytes such as 40Gi" in message
    assert caught.value.namespace == "team-a" and caught.value.annotation == ANNOTATION
