"""Attribute and capacity checks (pure): one device's typed attributes and its capacities.

An attribute holds exactly one of int, bool, string and version. A capacity
holds a quantity and, on a device that allows multiple allocations, a request
policy: a default plus either a sorted list of valid values or a range
(min, max, step), all within the capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.base.names import qualified_name
from dra_driver.base.semver import is_semver
from dra_driver.core.slices.grammar import Problems, is_int, quantity, unknown_fields
from dra_driver.core.slices.limits import MAX_STRING_VALUE, MAX_VALID_VALUES

_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
_CAPACITY_FIELDS = frozenset({"value", "requestPolicy"})
_POLICY_FIELDS = frozenset({"default", "validRange", "validValues"})
_RANGE_FIELDS = frozenset({"min", "max", "step"})


def check_attribute(name: object, attribute: object, path: str, found: Problems) -> None:
    if problem := qualified_name(name):
        found.add(path, problem)
    if not isinstance(attribute, Mapping):
        found.add(path, "must be an object with one of int, bool, string, version")
        return
    kinds = [kind for kind in attribute if attribute[kind] is not None]
    known = [kind for kind in kinds if kind in _ATTRIBUTE_KINDS]
    for kind in sorted(set(kinds) - set(_ATTRIBUTE_KINDS)):
        found.add(f"{path}.{kind}", "unknown field (list values need DRAListTypeAttributes)")
    if len(known) != 1:
        found.add(
            path, f"exactly one of int, bool, string, version is required, has {known or 'none'}"
        )
    for kind in known:
        value = attribute[kind]
        at = f"{path}.{kind}"
        if kind == "int" and not is_int(value):
            found.add(at, "must be an integer")
        elif kind == "bool" and not isinstance(value, bool):
            found.add(at, "must be a boolean")
        elif kind in ("string", "version") and not isinstance(value, str):
            found.add(at, "must be a string")
        elif kind == "string" and len(value) > MAX_STRING_VALUE:
            found.add(at, f"must be no more than {MAX_STRING_VALUE} characters, has {len(value)}")
        elif kind == "version" and not is_semver(value):
            found.add(at, f"{value!r} must be strict semver 2.0.0 of at most 64 characters")


def check_capacity(name: object, entry: object, shared: bool, path: str, found: Problems) -> None:
    if problem := qualified_name(name):
        found.add(path, problem)
    if not isinstance(entry, Mapping):
        found.add(path, "must be an object with a value")
        return
    unknown_fields(entry, _CAPACITY_FIELDS, path, found)
    value = None
    if "value" not in entry:
        found.add(f"{path}.value", "required")
    else:
        value = quantity(entry["value"], f"{path}.value", found)
        if value is not None and value < 0:
            found.add(f"{path}.value", "must not be negative (driver rule)")
    policy = entry.get("requestPolicy")
    if policy is None:
        return
    if not shared:
        found.add(f"{path}.requestPolicy", "only allowed when allowMultipleAllocations is true")
        return
    _check_request_policy(policy, value, f"{path}.requestPolicy", found)


def _check_request_policy(
    policy: object, value: Fraction | None, path: str, found: Problems
) -> None:
    if not isinstance(policy, Mapping):
        found.add(path, "must be an object")
        return
    unknown_fields(policy, _POLICY_FIELDS, path, found)
    default = None
    if policy.get("default") is not None:
        default = quantity(policy["default"], f"{path}.default", found)
        if default is not None and value is not None and default > value:
            found.add(
                f"{path}.default",
                "is larger than the capacity value, so it could never be granted (driver rule)",
            )
    valid_values = policy.get("validValues")
    valid_range = policy.get("validRange")
    if valid_values and valid_range is not None:
        found.add(path, "only one of validValues and validRange may be set")
        return
    if valid_values:
        if "default" not in policy or policy["default"] is None:
            found.add(f"{path}.default", "required when validValues is set")
        _check_valid_values(valid_values, default, value, f"{path}.validValues", found)
    elif valid_range is not None:
        if "default" not in policy or policy["default"] is None:
            found.add(f"{path}.default", "required when validRange is set")
        _check_valid_range(valid_range, default, value, f"{path}.validRange", found)


def _check_valid_values(
    options: object, default: Fraction | None, value: Fraction | None, path: str, found: Problems
) -> None:
    if not isinstance(options, list | tuple):
        found.add(path, "must be a list")
        return
    if len(options) > MAX_VALID_VALUES:
        found.add(path, f"must have at most {MAX_VALID_VALUES} entries, has {len(options)}")
        return
    parsed = [quantity(option, f"{path}[{i}]", found) for i, option in enumerate(options)]
    numbers = [q for q in parsed if q is not None]
    for i in range(1, len(parsed)):
        before, this = parsed[i - 1], parsed[i]
        if before is not None and this is not None:
            if this < before:
                found.add(f"{path}[{i}]", "values must be sorted in ascending order")
            elif this == before:
                found.add(f"{path}[{i}]", "duplicate value")
    if value is not None:
        for i, q in enumerate(parsed):
            if q is not None and q > value:
                found.add(f"{path}[{i}]", "is larger than the capacity value")
    if default is not None and default not in numbers:
        found.add(path, "must contain the default")


def _check_valid_range(
    valid_range: object,
    default: Fraction | None,
    value: Fraction | None,
    path: str,
    found: Problems,
) -> None:
    if not isinstance(valid_range, Mapping):
        found.add(path, "must be an object")
        return
    unknown_fields(valid_range, _RANGE_FIELDS, path, found)
    if valid_range.get("min") is None:
        found.add(f"{path}.min", "required when validRange is set")
        return
    amounts = _Range(
        low=quantity(valid_range["min"], f"{path}.min", found),
        high=_optional_quantity(valid_range, "max", path, found),
        step=_optional_quantity(valid_range, "step", path, found),
        default=default,
        value=value,
    )
    if amounts.low is not None:
        _check_range_bounds(amounts, amounts.low, path, found)
        if amounts.step is not None:
            _check_range_step(amounts, amounts.low, amounts.step, path, found)


@dataclass(frozen=True)
class _Range:
    low: Fraction | None
    high: Fraction | None
    step: Fraction | None
    default: Fraction | None
    value: Fraction | None


def _optional_quantity(
    obj: Mapping[str, Any], key: str, path: str, found: Problems
) -> Fraction | None:
    return None if obj.get(key) is None else quantity(obj[key], f"{path}.{key}", found)


def _check_range_bounds(amounts: _Range, low: Fraction, path: str, found: Problems) -> None:
    high, default, value = amounts.high, amounts.default, amounts.value
    if low < 0:
        found.add(f"{path}.min", "must not be negative")
    if value is not None and low > value:
        found.add(f"{path}.min", "is larger than the capacity value")
    if default is not None and default < low:
        found.add(f"{path}.min", "the default is less than min")
    if high is None:
        return
    if low > high:
        found.add(f"{path}.max", "min is larger than max")
    if value is not None and high > value:
        found.add(f"{path}.max", "is larger than the capacity value")
    if default is not None and default > high:
        found.add(f"{path}.max", "the default is more than max")


def _check_range_step(
    amounts: _Range, low: Fraction, step: Fraction, path: str, found: Problems
) -> None:
    if step <= 0:
        found.add(f"{path}.step", "must be greater than zero (driver rule)")
        return
    if amounts.value is not None and low + step > amounts.value:
        found.add(f"{path}.step", "min + step is larger than the capacity value")
    # The API server compares Quantity.Value(), i.e. each amount rounded up to an integer.
    whole_step = math.ceil(step)
    for name, amount in (("default", amounts.default), ("max", amounts.high)):
        if amount is not None and (math.ceil(amount) - math.ceil(low)) % whole_step:
            found.add(f"{path}.step", f"{name} - min is not a multiple of step")
