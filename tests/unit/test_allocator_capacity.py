"""Consumed-capacity rounding, policy checks and fit, as the scheduler does them."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dra_driver.allocator.capacity import consume_one, fits, violates_policy
from dra_driver.allocator.model import Capacity, RequestPolicy

F = Fraction
GI = 2**30
RANGE = RequestPolicy(default=F(GI), min=F(GI), step=F(GI), max=F(8 * GI))
VALUES = RequestPolicy(default=F(2), valid_values=(F(2), F(4), F(8)))
NO_STEP = RequestPolicy(default=F(1), min=F(1))


@pytest.mark.parametrize(
    ("requested", "policy", "value", "expected"),
    [
        (None, None, F(80 * GI), F(80 * GI)),  # no entry, no policy: the whole capacity
        (None, RANGE, F(80 * GI), F(GI)),  # no entry: the default
        (F(5), None, F(100), F(5)),  # as requested
        (F(GI // 2), RANGE, F(80 * GI), F(GI)),  # below min: min
        (F(GI + 1), RANGE, F(80 * GI), F(2 * GI)),  # rounded up to min + n*step
        (F(3 * GI), RANGE, F(80 * GI), F(3 * GI)),  # aligned: as is
        (F(7), NO_STEP, F(100), F(7)),  # no step: as is
        (F(3), VALUES, F(100), F(4)),  # smallest listed value >= request
        (F(9), VALUES, F(100), F(9)),  # above all: as requested (then violates)
    ],
)
def test_consume_one(
    requested: Fraction | None, policy: RequestPolicy | None, value: Fraction, expected: Fraction
) -> None:
    assert consume_one(requested, Capacity(value, policy)) == expected


@pytest.mark.parametrize(
    ("value", "policy", "violates"),
    [
        (F(GI), RANGE, False),
        (F(9 * GI), RANGE, True),  # above max
        (F(9), VALUES, True),  # not listed
        (F(8), VALUES, False),
        (F(5), None, False),
        (F(2), VALUES, False),  # the default
    ],
)
def test_violates_policy(value: Fraction, policy: RequestPolicy | None, violates: bool) -> None:
    assert violates_policy(value, policy) is violates


def test_fit_counts_every_key_and_rejects_unknown_keys() -> None:
    caps = {"memory": Capacity(F(4 * GI), RANGE), "clients": Capacity(F(2), NO_STEP)}
    assert fits({"memory": F(GI)}, caps, {}) == {"memory": F(GI), "clients": F(1)}
    assert isinstance(fits({"memory": F(GI)}, caps, {"clients": F(2)}), str)
    assert isinstance(fits({"memory": F(4 * GI)}, caps, {"memory": F(GI)}), str)
    assert isinstance(fits({"bogus": F(1)}, caps, {}), str)
    assert isinstance(fits({"memory": F(9 * GI)}, {"memory": Capacity(F(99 * GI), RANGE)}, {}), str)
