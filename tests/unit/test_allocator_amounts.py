"""The allocator's quantities: ints where whole, Fractions where not, exact either way;
and what a large cluster's devices share in the allocator's state."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import pytest

from dra_driver.allocator import AllocatorState
from dra_driver.base.quantity import parse_amount, parse_quantity
from tests.support.allocator import CLASSES, DRIVER, GI, claim, request, slices


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10Gi", 10 * GI), ("100", 100), ("1k", 1000), ("2e3", 2000), ("1000m", 1), (7, 7)],
)
def test_a_whole_quantity_is_an_int(text: object, expected: int) -> None:
    amount = parse_amount(text)
    assert type(amount) is int
    assert amount == expected == parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.5", Fraction(3, 2)), ("500m", Fraction(1, 2)), ("1e-3", Fraction(1, 1000))],
)
def test_a_fractional_quantity_stays_an_exact_fraction(text: str, expected: Fraction) -> None:
    amount = parse_amount(text)
    assert type(amount) is Fraction
    assert amount == expected


@pytest.mark.parametrize("bad", ["1.5.5", "10 Gi", "", True, 1.5, None])
def test_parse_amount_refuses_what_parse_quantity_refuses(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_amount(bad)


def test_equal_texts_are_one_object() -> None:
    assert parse_amount("81408" + "Mi") is parse_amount("81408Mi")


def _fractional_slice() -> dict[str, Any]:
    """One shareable device whose ``units`` capacity is 1.5 (not a whole number)."""
    return {
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "node-f", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-f",
            "devices": [
                {
                    "name": "gpu-0",
                    "allowMultipleAllocations": True,
                    "attributes": {"allocator": {"string": "controller"}, "index": {"int": 0}},
                    "capacity": {
                        "memory": {"value": "80Gi"},
                        "units": {"value": "1.5"},
                    },
                }
            ],
        }
    }


def _units_claim(n: int, units: str) -> dict[str, Any]:
    obj = claim(request(memory="1Gi"))
    obj["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["units"] = units
    obj["metadata"] |= {"name": f"c{n}", "uid": f"u{n}"}
    return obj


def test_a_fractional_capacity_is_shared_out_exactly() -> None:
    state = AllocatorState(
        slices=[_fractional_slice()], classes=CLASSES, allocated_claims=[], driver_name=DRIVER
    )
    ids = (f"s{n}" for n in itertools.count())
    outcomes = [
        state.allocate(_units_claim(n, "500m"), share_id=lambda: next(ids)) for n in range(4)
    ]
    assert [o.allocation is not None for o in outcomes] == [True, True, True, False]
    first = outcomes[0].allocation
    assert first is not None
    consumed = first.results[0].consumed
    assert type(consumed["memory"]) is int and consumed["memory"] == GI
    assert consumed["units"] == Fraction(1, 2)
    body = first.results[0].to_json()
    assert body["consumedCapacity"]["units"] == "500m"
    assert body["consumedCapacity"]["memory"] == "1Gi"
    used = state.ledger.use((DRIVER, "node-f", "gpu-0")).consumed
    assert used["units"] == Fraction(3, 2) and used["memory"] == 3 * GI
    # Read back from the status written, the claims hold the same, exactly.
    written = [
        _units_claim(n, "500m") | {"status": {"allocation": o.allocation.to_status("t")}}
        for n, o in enumerate(outcomes[:3])
        if o.allocation is not None
    ]
    rebuilt = AllocatorState(
        slices=[_fractional_slice()], classes=CLASSES, allocated_claims=written, driver_name=DRIVER
    )
    assert rebuilt.ledger.use((DRIVER, "node-f", "gpu-0")).consumed == used
    assert rebuilt.allocate(_units_claim(9, "1m")).allocation is None  # 1.5 of 1.5 in use


def test_a_large_claim_of_a_fraction_still_fits_to_the_last_unit() -> None:
    state = AllocatorState(
        slices=[_fractional_slice()], classes=CLASSES, allocated_claims=[], driver_name=DRIVER
    )
    assert state.allocate(_units_claim(0, "1499m")).allocation is not None
    assert state.allocate(_units_claim(1, "1m")).allocation is not None
    assert state.allocate(_units_claim(2, "1m")).allocation is None


def test_devices_of_one_shape_share_their_capacity_and_attribute_names() -> None:
    state = AllocatorState(
        slices=slices("h100-80gb:2", "node-a") + slices("h100-80gb:2", "node-b"),
        classes=CLASSES,
        allocated_claims=[],
        driver_name=DRIVER,
    )
    a, b = (d for d in state.devices if d.name == "gpu-0")
    assert a.node_name != b.node_name
    assert a.capacity is b.capacity
    assert all(type(c.value) is int for c in a.capacity.values())
    names_a = {id(k) for k in a.attributes}
    assert names_a == {id(k) for k in b.attributes}
    assert a.attributes["productName"] is b.attributes["productName"]
    assert a.attributes["uuid"] != b.attributes["uuid"]
