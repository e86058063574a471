"""The pure allocator on slices built by the real slice builder (fake GPUs)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from dra_driver.allocator import AllocationOutcome, AllocatorState, allocate, first_fit
from tests.support.allocator import (
    CLASS,
    CLASSES,
    DRIVER,
    GI,
    D,
    claim,
    request,
    slices,
)


def run(
    claim_obj: Mapping[str, Any], allocated: list[dict[str, Any]] | None = None, **kw: Any
) -> AllocationOutcome:
    ids = (f"00000000-0000-0000-0000-{n:012d}" for n in itertools.count())
    kw.setdefault("slices", slices())
    return allocate(
        claim_obj,
        classes=kw.pop("classes", CLASSES),
        allocated_claims=allocated or [],
        driver_name=DRIVER,
        share_id=lambda: next(ids),
        **kw,
    )


def as_allocated(outcome: AllocationOutcome) -> dict[str, Any]:
    assert outcome.allocation is not None, outcome.reason
    return {"status": {"allocation": outcome.allocation.to_status("2026-01-01T00:00:00Z")}}


def devices_of(outcome: AllocationOutcome) -> list[str]:
    assert outcome.allocation is not None, outcome.reason
    return [r.device for r in outcome.allocation.results]


def test_share_result_grant_and_status() -> None:
    outcome = run(claim())
    assert outcome.allocation is not None
    status = outcome.allocation.to_status("2026-01-01T00:00:00Z")
    result = status["devices"]["results"][0]
    assert result["device"] == "gpu-0" and result["pool"] == "node-a"
    assert result["shareID"] == "00000000-0000-0000-0000-000000000000"
    assert result["consumedCapacity"] == {"memory": "10Gi", "computePercent": "0", "clients": "1"}
    assert status["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]
    grant = status["devices"]["config"][-1]
    assert grant["opaque"]["parameters"]["kind"] == "GpuShareGrant"
    assert outcome.allocation.grants[0].memory_bytes == 10 * GI


def test_rounding_to_step() -> None:
    outcome = run(claim(request(memory="1000Mi")))
    assert outcome.allocation is not None
    assert outcome.allocation.results[0].consumed["memory"] == 1024 * 2**20


def test_best_fit_picks_fullest_then_fewer_shares_then_lower_index() -> None:
    first = run(claim())
    assert devices_of(first) == ["gpu-0"]  # tie: lower index
    second = run(claim(), [as_allocated(first)])
    assert devices_of(second) == ["gpu-0"]  # the fuller GPU that still fits
    big = run(claim(request(memory="75Gi")), [as_allocated(first)])
    assert devices_of(big) == ["gpu-1"]  # gpu-0 cannot fit it
    assert devices_of(run(claim(), [as_allocated(first)], policy=first_fit)) == ["gpu-0"]


def test_exclusive_and_admin_access_accounting() -> None:
    exclusive = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}
                    ]
                }
            }
        }
    }
    assert devices_of(run(claim(), [exclusive])) == ["gpu-1"]
    admin = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "r",
                            "driver": DRIVER,
                            "pool": "node-a",
                            "device": d,
                            "adminAccess": True,
                        }
                        for d in ("gpu-0", "gpu-1")
                    ]
                }
            }
        }
    }
    assert devices_of(run(claim(), [admin])) == ["gpu-0"]
    both = run(
        claim(),
        [
            exclusive,
            {
                **exclusive,
                "status": {
                    "allocation": {
                        "devices": {
                            "results": [
                                {
                                    "request": "r",
                                    "driver": DRIVER,
                                    "pool": "node-a",
                                    "device": "gpu-1",
                                }
                            ]
                        }
                    }
                },
            },
        ],
    )
    assert both.allocation is None and "cannot allocate" in (both.reason or "")


def test_count_two_lands_on_two_gpus_and_distinct_attribute() -> None:
    assert sorted(devices_of(run(claim(request(count=2))))) == ["gpu-0", "gpu-1"]
    assert run(claim(request(count=3))).allocation is None
    distinct = claim(
        request(count=2),
        constraints=[{"distinctAttribute": f"{DRIVER}/uuid"}],
    )
    assert sorted(devices_of(run(distinct))) == ["gpu-0", "gpu-1"]


def test_first_available_falls_back() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "huge",
                "deviceClassName": CLASS,
                "capacity": {"requests": {"memory": "200Gi"}},
            },
            {
                "name": "small",
                "deviceClassName": CLASS,
                "capacity": {"requests": {"memory": "1Gi"}},
            },
        ],
    }
    outcome = run(claim(req))
    assert outcome.allocation is not None
    assert outcome.allocation.results[0].request == "gpu/small"


def test_mig_counters_do_not_overlap() -> None:
    mig_slices = slices("h100-80gb:1:mig")
    whole = {
        "name": "m",
        "exactly": {
            "deviceClassName": "mig",
            "selectors": [{"cel": {"expression": f'{D}.profile == "7g.80gb"'}}],
        },
    }
    first = run(claim(whole), slices=mig_slices)
    assert devices_of(first) == ["gpu-0-mig-7g80gb-0-0"]
    assert run(claim(whole), [as_allocated(first)], slices=mig_slices).allocation is None
    small = {"name": "m", "exactly": {"deviceClassName": "mig", "count": 7}}
    seven = run(claim(small), slices=mig_slices)
    names = devices_of(seven)
    assert len(names) == 7 and all("1g" in n for n in names), names
    assert (
        run(
            claim({"name": "m", "exactly": {"deviceClassName": "mig"}}),
            [as_allocated(seven)],
            slices=mig_slices,
        ).allocation
        is None
    )


def test_taints_and_tolerations() -> None:
    tainted = slices()
    for s in tainted:
        for dev in s["spec"].get("devices", []):
            dev["taints"] = [{"key": "broken", "value": "yes", "effect": "NoSchedule"}]
    assert run(claim(), slices=tainted).allocation is None
    tol = request(tolerations=[{"key": "broken", "operator": "Exists"}])
    assert devices_of(run(claim(tol), slices=tainted)) == ["gpu-0"]


def test_sentinel_dropped_and_allocator_attribute_filter() -> None:
    assert run(claim()).allocation is not None
    scheduler_owned = run(claim(), slices=slices(allocator="scheduler"))
    assert scheduler_owned.allocation is None


def test_cel_error_fails_claim_with_reason() -> None:
    bad = request(selectors=[{"cel": {"expression": f"{D}.nope == 1"}}])
    outcome = run(claim(bad))
    assert outcome.allocation is None and "nope" in (outcome.reason or "")


def test_dropped_capacity_uses_attributes_and_gpushare_config() -> None:
    old = slices(minor=34)
    share = {
        "requests": ["gpu"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": f"{DRIVER}/v1alpha1",
                "kind": "GpuShare",
                "memory": "1000Mi",
            },
        },
    }
    outcome = run(claim(request(memory=None), config=[share]), slices=old)
    assert outcome.allocation is not None, outcome.reason
    result = outcome.allocation.results[0]
    assert result.share_id is not None and result.consumed["memory"] == 1024 * 2**20


def test_node_filter_and_generations() -> None:
    both = slices(node="node-a") + slices(node="node-b")
    outcome = run(claim(), slices=both, node_filter=lambda n: n == "node-b")
    assert outcome.allocation is not None and outcome.allocation.node_name == "node-b"
    stale = slices(spec="h100-80gb:1")
    newer = [
        {"spec": {**s["spec"], "pool": {**s["spec"]["pool"], "generation": 1}}} for s in slices()
    ]
    assert run(claim(request(count=2)), slices=stale + newer).allocation is not None


def test_a_gpushare_claim_looks_at_no_mig_partition() -> None:
    """A share asked by a GpuShare config (no capacity.requests) never goes to a MIG
    partition, so best fit does not walk them: one device is examined, not each of the
    partitions ahead of the shareable GPU (per claim, on every node with a MIG GPU)."""
    share = {
        "requests": ["gpu"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuShare", "memory": "4Gi"},
        },
    }
    state = AllocatorState(
        slices=slices("h100-80gb:1:mig,h100-80gb:1"),
        classes=CLASSES,
        allocated_claims=[],
        driver_name=DRIVER,
    )
    outcome = state.allocate(claim(request(memory=None), config=[share]), record=False)
    assert devices_of(outcome) == ["gpu-1"]
    assert state.examined == 1
