"""The API server's rules for ResourceSlices, applied before we publish (pure).

The OpenAPI schema only knows field names and JSON types. The API server's
validation (``pkg/apis/resource/validation``) rejects much more: identifier
grammars, list limits that changed between releases, request-policy alignment,
strict semver, devices xor counters. A slice that breaks one rule is refused
whole, so the node would publish nothing; this module finds every such problem
up front and names where it is, as a JSON-path-like location
(``spec.devices[3].capacity[memory].requestPolicy.validRange.step: ...``).

Which release's rules apply is read from :class:`Capabilities`:
``counters_in_own_slice`` marks the 1.35+ rules (devices xor sharedCounters,
≤8 counter sets, ≤2 consumesCounters entries, 64 devices with counters or
taints, 16 taints, effect ``None``); without it the 1.34 rules apply (≤32
counters over all sets, ≤32 consumed counters per device and ≤1024 per slice,
references resolved inside the slice, 4 taints). Fields whose feature gate the
capabilities say is off are reported too: the API server would silently drop
them and the published slice would not be what we meant.

A few rules are ours, not the API server's; their messages say "driver rule".
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.core.errors import DriverError
from dra_driver.core.quantity import parse_quantity
from dra_driver.core.semver import is_semver
from dra_driver.core.settings import Capabilities

# Limits (resource.k8s.io/v1 constants; see dra-facts 3.1).
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64  # 1.35+
MAX_COUNTER_SETS = 8  # 1.35+
MAX_COUNTERS_PER_SET = 32
MAX_CONSUMPTIONS_PER_DEVICE = 2  # 1.35+
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_SHARED_COUNTERS_1_34 = 32  # all counters over all sets of one slice
MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34 = 32
MAX_CONSUMED_COUNTERS_PER_SLICE_1_34 = 1024
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_TAINTS = 16  # 1.35+
MAX_TAINTS_1_34 = 4
MAX_VALID_VALUES = 10
MAX_BINDING_CONDITIONS = 4
MAX_STRING_VALUE = 64
MAX_IDENTIFIER = 32
MAX_DOMAIN = 63
MAX_DNS_LABEL = 63
MAX_DNS_SUBDOMAIN = 253
MAX_POOL_NAME = 253

TAINT_EFFECTS = ("NoSchedule", "NoExecute")
TAINT_EFFECTS_1_35 = ("None", "NoSchedule", "NoExecute")

_SPEC_FIELDS = frozenset(
    {
        "driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection",
        "devices", "sharedCounters", "partitionTypeAttribute", "skipNodeOperations",
    }
)  # fmt: skip
_POOL_FIELDS = frozenset({"name", "generation", "resourceSliceCount"})
_DEVICE_FIELDS = frozenset(
    {
        "name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector",
        "allNodes", "allowMultipleAllocations", "taints", "bindsToNode", "bindingConditions",
        "bindingFailureConditions", "nodeAllocatableResources",
    }
)  # fmt: skip
_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")
_CAPACITY_FIELDS = frozenset({"value", "requestPolicy"})
_POLICY_FIELDS = frozenset({"default", "validRange", "validValues"})
_RANGE_FIELDS = frozenset({"min", "max", "step"})
_COUNTER_SET_FIELDS = frozenset({"name", "counters"})
_CONSUMPTION_FIELDS = frozenset({"counterSet", "counters", "compatibilityGroups"})
_COUNTER_FIELDS = frozenset({"value"})
_TAINT_FIELDS = frozenset({"key", "value", "effect", "timeAdded"})

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LABEL_NAME = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


class SliceInvalidError(DriverError):
    """A ResourceSlice (or a pool of them) breaks the API server's rules.

    ``problems`` lists every finding as ``"<location>: <what is wrong>"``.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        count = len(self.problems)
        super().__init__(
            f"invalid ResourceSlice ({count} problem{'s' if count != 1 else ''}): "
            + "; ".join(self.problems)
        )


def slice_problems(spec: Mapping[str, Any], capabilities: Capabilities) -> list[str]:
    """Every rule ``spec`` (a ``ResourceSlice.spec`` as JSON) breaks; empty when it is valid."""
    found = _Problems()
    _check_spec(spec, capabilities, "spec", found)
    return found.items


def validate_slice(spec: Mapping[str, Any], capabilities: Capabilities) -> None:
    """Raise :class:`SliceInvalidError` naming every problem of one slice."""
    problems = slice_problems(spec, capabilities)
    if problems:
        raise SliceInvalidError(problems)


def pool_problems(specs: Sequence[Mapping[str, Any]], capabilities: Capabilities) -> list[str]:
    """:func:`slice_problems` for each slice plus the rules that span the pool.

    Cross-slice rules: one driver, pool name and node on every slice; equal
    ``generation``; ``resourceSliceCount`` equal to the number of slices given;
    device names unique in the pool; counter-set names unique in the pool
    (1.35+); every ``consumesCounters`` entry names a counter set and counters
    that exist in the pool (1.35+; 1.34 resolves them inside each slice).
    Locations start with ``slices[<i>]``.
    """
    found = _Problems()
    for index, spec in enumerate(specs):
        found.extend(f"slices[{index}].{p}" for p in slice_problems(spec, capabilities))
    specs = [spec for spec in specs if isinstance(spec, Mapping)]
    if not specs:
        return found.items
    _check_pool_consistency(specs, found)
    _check_pool_devices(specs, capabilities, found)
    return found.items


def validate_pool(specs: Sequence[Mapping[str, Any]], capabilities: Capabilities) -> None:
    """Raise :class:`SliceInvalidError` naming every problem of a whole pool."""
    problems = pool_problems(specs, capabilities)
    if problems:
        raise SliceInvalidError(problems)


# --- implementation -------------------------------------------------------------------


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.items.append(f"{path}: {message}")

    def extend(self, problems: Any) -> None:
        self.items.extend(problems)


def _unknown_fields(
    obj: Mapping[str, Any], allowed: frozenset[str], path: str, found: _Problems
) -> None:
    for key in sorted(set(obj) - allowed, key=str):
        found.add(f"{path}.{key}", "unknown field")


def _dns_label(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_DNS_LABEL:
        return f"must be no more than {MAX_DNS_LABEL} characters (DNS label)"
    if not _DNS_LABEL.fullmatch(name):
        return "must be a DNS label: lower case alphanumerics or '-', alphanumeric at both ends"
    return None


def _dns_subdomain(name: object, limit: int = MAX_DNS_SUBDOMAIN) -> str | None:
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > limit:
        return f"must be no more than {limit} characters"
    if not all(_DNS_LABEL.fullmatch(part) for part in name.split(".")):
        return "must be a DNS subdomain: DNS labels separated by '.'"
    return None


def _driver_name(name: object) -> str | None:
    # The API reuses the CSI driver-name check: ≤63, a DNS subdomain once lower-cased.
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if len(name) > MAX_DOMAIN:
        return f"must be no more than {MAX_DOMAIN} characters"
    return _dns_subdomain(name.lower())


def _c_identifier(name: str) -> str | None:
    if len(name) > MAX_IDENTIFIER:
        return f"identifier {name!r} must be no more than {MAX_IDENTIFIER} characters"
    if not _C_IDENTIFIER.fullmatch(name):
        return f"{name!r} must be a C identifier ([A-Za-z_][A-Za-z0-9_]*)"
    return None


def _qualified_name(name: object) -> str | None:
    """Attribute and capacity names: ``ident`` or ``<domain>/<ident>``."""
    if not isinstance(name, str) or not name:
        return "the name must be a non-empty string"
    domain, slash, ident = name.rpartition("/")
    if not slash:
        return _c_identifier(name)
    problem = None
    if not domain or "/" in domain:
        problem = "must be an identifier or <domain>/<identifier>"
    elif domain_problem := _driver_name(domain):
        problem = f"domain {domain!r} {domain_problem}"
    elif not ident:
        problem = "the name after the domain must not be empty"
    return problem or _c_identifier(ident)


def _label_name(key: object) -> str | None:
    if not isinstance(key, str) or not key:
        return "must be a non-empty string"
    prefix, _, name = key.rpartition("/")
    if "/" in key:
        problem = _dns_subdomain(prefix)
        if problem:
            return f"prefix {problem}"
    if len(name) > MAX_DNS_LABEL or not _LABEL_NAME.fullmatch(name):
        return (
            "name part must be no more than 63 alphanumerics, '-', '_' or '.',"
            " alphanumeric at both ends"
        )
    return None


def _label_value(value: object) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if value and (len(value) > MAX_DNS_LABEL or not _LABEL_NAME.fullmatch(value)):
        return "must be empty or no more than 63 alphanumerics, '-', '_' or '.'"
    return None


def _quantity(value: object, path: str, found: _Problems) -> Fraction | None:
    try:
        return parse_quantity(value)
    except ValueError as err:
        found.add(path, str(err))
        return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(value: object, path: str, found: _Problems) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        found.add(path, "must be an object")
        return None
    return value


def _list(value: object, path: str, found: _Problems) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        found.add(path, "must be a list")
        return None
    return list(value)


def _check_spec(spec: object, caps: Capabilities, path: str, found: _Problems) -> None:
    if not isinstance(spec, Mapping):
        found.add(path, "must be an object")
        return
    _unknown_fields(spec, _SPEC_FIELDS, path, found)
    if "driver" not in spec:
        found.add(f"{path}.driver", "required")
    elif problem := _driver_name(spec["driver"]):
        found.add(f"{path}.driver", problem)
    _check_pool_field(spec.get("pool"), f"{path}.pool", found)
    _check_node_selection(spec, caps, path, found)

    devices = _list(spec.get("devices"), f"{path}.devices", found)
    counter_sets = _list(spec.get("sharedCounters"), f"{path}.sharedCounters", found)
    if caps.counters_in_own_slice and devices is not None and counter_sets is not None:
        found.add(path, "only one of devices and sharedCounters may be set (1.35+)")
    if counter_sets is not None:
        _check_counter_sets(counter_sets, caps, f"{path}.sharedCounters", found)
    if devices is not None:
        _check_devices(spec, devices, caps, path, found)


def _check_pool_field(pool: object, path: str, found: _Problems) -> None:
    if pool is None:
        found.add(path, "required")
        return
    if not isinstance(pool, Mapping):
        found.add(path, "must be an object")
        return
    _unknown_fields(pool, _POOL_FIELDS, path, found)
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        found.add(f"{path}.name", "required: a non-empty string")
    else:
        if len(name) > MAX_POOL_NAME:
            found.add(f"{path}.name", f"must be no more than {MAX_POOL_NAME} characters")
        for part in name.split("/"):
            if problem := _dns_subdomain(part):
                found.add(f"{path}.name", f"part {part!r}: {problem} (parts separated by '/')")
    generation = pool.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool):
        found.add(f"{path}.generation", "required: an integer")
    elif generation < 0:
        found.add(f"{path}.generation", f"must be greater than or equal to zero, not {generation}")
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or isinstance(count, bool):
        found.add(f"{path}.resourceSliceCount", "required: an integer")
    elif count <= 0:
        found.add(f"{path}.resourceSliceCount", f"must be greater than zero, not {count}")


def _check_node_selection(
    spec: Mapping[str, Any], caps: Capabilities, path: str, found: _Problems
) -> None:
    chosen: list[str] = []
    if "nodeName" in spec and spec["nodeName"] is not None:
        node_name = spec["nodeName"]
        if node_name == "":
            found.add(f"{path}.nodeName", "must be either unset or a non-empty string")
        elif problem := _dns_subdomain(node_name):
            found.add(f"{path}.nodeName", problem)
            chosen.append("nodeName")
        else:
            chosen.append("nodeName")
    if spec.get("nodeSelector") is not None:
        chosen.append("nodeSelector")
        _check_node_selector(spec["nodeSelector"], f"{path}.nodeSelector", found)
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in spec and spec[flag] is not None:
            if spec[flag] is True:
                chosen.append(flag)
            else:
                found.add(f"{path}.{flag}", "must be either unset or true")
    if len(chosen) != 1:
        found.add(
            path,
            "exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required"
            + (f", but {', '.join(chosen)} are set" if chosen else ""),
        )
    if spec.get("perDeviceNodeSelection") is True and not caps.partitionable_devices:
        found.add(
            f"{path}.perDeviceNodeSelection",
            "set, but this cluster drops it (DRAPartitionableDevices off)",
        )


def _check_node_selector(selector: object, path: str, found: _Problems) -> None:
    selector_map = _mapping(selector, path, found)
    if selector_map is None:
        return
    terms = selector_map.get("nodeSelectorTerms")
    if not isinstance(terms, list | tuple) or len(terms) != 1:
        found.add(f"{path}.nodeSelectorTerms", "must have exactly one node selector term")


def _check_counter_sets(
    counter_sets: list[Any], caps: Capabilities, path: str, found: _Problems
) -> None:
    if not caps.partitionable_devices:
        found.add(path, "set, but this cluster drops it (DRAPartitionableDevices off)")
    if caps.counters_in_own_slice and len(counter_sets) > MAX_COUNTER_SETS:
        found.add(
            path, f"must have at most {MAX_COUNTER_SETS} counter sets, has {len(counter_sets)}"
        )
        return
    total = 0
    seen: set[str] = set()
    for index, counter_set in enumerate(counter_sets):
        where = f"{path}[{index}]"
        if not isinstance(counter_set, Mapping):
            found.add(where, "must be an object")
            continue
        _unknown_fields(counter_set, _COUNTER_SET_FIELDS, where, found)
        name = counter_set.get("name")
        if not isinstance(name, str) or _dns_label(name):
            found.add(f"{where}.name", _dns_label(name) or "")
        elif name in seen:
            found.add(f"{where}.name", f"duplicate counter set {name!r}")
        else:
            seen.add(name)
        counters = counter_set.get("counters")
        if not isinstance(counters, Mapping) or not counters:
            found.add(f"{where}.counters", "required: at least one counter")
            continue
        total += len(counters)
        if len(counters) > MAX_COUNTERS_PER_SET:
            found.add(
                f"{where}.counters",
                f"must have at most {MAX_COUNTERS_PER_SET} counters, has {len(counters)}",
            )
            continue
        _check_counter_map(counters, f"{where}.counters", found)
    if not caps.counters_in_own_slice and total > MAX_SHARED_COUNTERS_1_34:
        found.add(
            path,
            f"must have at most {MAX_SHARED_COUNTERS_1_34} counters over all sets (1.34),"
            f" has {total}",
        )


def _check_counter_map(counters: Mapping[str, Any], path: str, found: _Problems) -> None:
    for counter_name, counter in counters.items():
        where = f"{path}[{counter_name}]"
        if problem := _dns_label(counter_name):
            found.add(where, f"counter name {problem}")
        if not isinstance(counter, Mapping):
            found.add(where, "must be an object with a value")
            continue
        _unknown_fields(counter, _COUNTER_FIELDS, where, found)
        if "value" not in counter:
            found.add(f"{where}.value", "required")
        else:
            _quantity(counter["value"], f"{where}.value", found)


def _check_devices(
    spec: Mapping[str, Any], devices: list[Any], caps: Capabilities, path: str, found: _Problems
) -> None:
    where = f"{path}.devices"
    heavy = any(
        isinstance(d, Mapping) and (d.get("taints") or d.get("consumesCounters")) for d in devices
    )
    limit = (
        MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if heavy and caps.counters_in_own_slice else MAX_DEVICES
    )
    if len(devices) > limit:
        reason = " (64 when a device has taints or consumesCounters)" if limit < MAX_DEVICES else ""
        found.add(where, f"must have at most {limit} devices{reason}, has {len(devices)}")
        return
    per_device_nodes = spec.get("perDeviceNodeSelection") is True
    seen: set[str] = set()
    consumed_total = 0
    for index, device in enumerate(devices):
        at = f"{where}[{index}]"
        if not isinstance(device, Mapping):
            found.add(at, "must be an object")
            continue
        consumed_total += _check_device(device, caps, per_device_nodes, at, found)
        name = device.get("name")
        if isinstance(name, str):
            if name in seen:
                found.add(f"{at}.name", f"duplicate device name {name!r}")
            seen.add(name)
    if not caps.counters_in_own_slice:
        if consumed_total > MAX_CONSUMED_COUNTERS_PER_SLICE_1_34:
            found.add(
                where,
                f"devices consume at most {MAX_CONSUMED_COUNTERS_PER_SLICE_1_34} counters in"
                f" total (1.34), these consume {consumed_total}",
            )
        sets = _counter_sets_by_name([spec])
        _check_references(devices, sets, where, found)


def _check_device(
    device: Mapping[str, Any],
    caps: Capabilities,
    per_device_nodes: bool,
    path: str,
    found: _Problems,
) -> int:
    """Check one device; return how many counters it consumes (for the 1.34 slice total)."""
    _unknown_fields(device, _DEVICE_FIELDS, path, found)
    if problem := _dns_label(device.get("name")):
        found.add(f"{path}.name", problem)
    attributes = _mapping(device.get("attributes"), f"{path}.attributes", found) or {}
    capacity = _mapping(device.get("capacity"), f"{path}.capacity", found) or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        found.add(
            path,
            f"attributes and capacities together must be at most {MAX_ATTRIBUTES_AND_CAPACITIES},"
            f" has {len(attributes) + len(capacity)}",
        )
    for name, attribute in attributes.items():
        _check_attribute(name, attribute, f"{path}.attributes[{name}]", found)

    shared = device.get("allowMultipleAllocations")
    if shared is not None and not isinstance(shared, bool):
        found.add(f"{path}.allowMultipleAllocations", "must be a boolean")
    if shared is True and not caps.consumable_capacity:
        found.add(
            f"{path}.allowMultipleAllocations",
            "set, but this cluster drops it (DRAConsumableCapacity off)",
        )
    for name, entry in capacity.items():
        _check_capacity(name, entry, shared is True, f"{path}.capacity[{name}]", found)

    consumed = _check_consumptions(device.get("consumesCounters"), caps, path, found)
    _check_taints(device.get("taints"), caps, f"{path}.taints", found)
    _check_device_nodes(device, per_device_nodes, path, found)
    for field in ("bindingConditions", "bindingFailureConditions"):
        conditions = _list(device.get(field), f"{path}.{field}", found)
        if conditions is not None and len(conditions) > MAX_BINDING_CONDITIONS:
            found.add(f"{path}.{field}", f"must have at most {MAX_BINDING_CONDITIONS} entries")
    return consumed


def _check_attribute(name: object, attribute: object, path: str, found: _Problems) -> None:
    if problem := _qualified_name(name):
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
        if kind == "int" and not _is_int(value):
            found.add(at, "must be an integer")
        elif kind == "bool" and not isinstance(value, bool):
            found.add(at, "must be a boolean")
        elif kind in ("string", "version") and not isinstance(value, str):
            found.add(at, "must be a string")
        elif kind == "string" and len(value) > MAX_STRING_VALUE:
            found.add(at, f"must be no more than {MAX_STRING_VALUE} characters, has {len(value)}")
        elif kind == "version" and not is_semver(value):
            found.add(at, f"{value!r} must be strict semver 2.0.0 of at most 64 characters")


def _check_capacity(name: object, entry: object, shared: bool, path: str, found: _Problems) -> None:
    if problem := _qualified_name(name):
        found.add(path, problem)
    if not isinstance(entry, Mapping):
        found.add(path, "must be an object with a value")
        return
    _unknown_fields(entry, _CAPACITY_FIELDS, path, found)
    value = None
    if "value" not in entry:
        found.add(f"{path}.value", "required")
    else:
        value = _quantity(entry["value"], f"{path}.value", found)
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
    policy: object, value: Fraction | None, path: str, found: _Problems
) -> None:
    if not isinstance(policy, Mapping):
        found.add(path, "must be an object")
        return
    _unknown_fields(policy, _POLICY_FIELDS, path, found)
    default = None
    if policy.get("default") is not None:
        default = _quantity(policy["default"], f"{path}.default", found)
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
    options: object, default: Fraction | None, value: Fraction | None, path: str, found: _Problems
) -> None:
    if not isinstance(options, list | tuple):
        found.add(path, "must be a list")
        return
    if len(options) > MAX_VALID_VALUES:
        found.add(path, f"must have at most {MAX_VALID_VALUES} entries, has {len(options)}")
        return
    parsed = [_quantity(option, f"{path}[{i}]", found) for i, option in enumerate(options)]
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
    found: _Problems,
) -> None:
    if not isinstance(valid_range, Mapping):
        found.add(path, "must be an object")
        return
    _unknown_fields(valid_range, _RANGE_FIELDS, path, found)
    if valid_range.get("min") is None:
        found.add(f"{path}.min", "required when validRange is set")
        return
    amounts = _Range(
        low=_quantity(valid_range["min"], f"{path}.min", found),
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
    obj: Mapping[str, Any], key: str, path: str, found: _Problems
) -> Fraction | None:
    return None if obj.get(key) is None else _quantity(obj[key], f"{path}.{key}", found)


def _check_range_bounds(amounts: _Range, low: Fraction, path: str, found: _Problems) -> None:
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
    amounts: _Range, low: Fraction, step: Fraction, path: str, found: _Problems
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


def _check_consumptions(
    consumptions: object, caps: Capabilities, path: str, found: _Problems
) -> int:
    where = f"{path}.consumesCounters"
    entries = _list(consumptions, where, found)
    if entries is None:
        return 0
    if not caps.partitionable_devices and entries:
        found.add(where, "set, but this cluster drops it (DRAPartitionableDevices off)")
    if caps.counters_in_own_slice and len(entries) > MAX_CONSUMPTIONS_PER_DEVICE:
        found.add(
            where, f"must have at most {MAX_CONSUMPTIONS_PER_DEVICE} entries, has {len(entries)}"
        )
        return 0
    total = 0
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        at = f"{where}[{index}]"
        if not isinstance(entry, Mapping):
            found.add(at, "must be an object")
            continue
        _unknown_fields(entry, _CONSUMPTION_FIELDS, at, found)
        counter_set = entry.get("counterSet")
        if not isinstance(counter_set, str) or _dns_label(counter_set):
            found.add(f"{at}.counterSet", _dns_label(counter_set) or "")
        elif counter_set in seen:
            found.add(f"{at}.counterSet", f"duplicate entry for counter set {counter_set!r}")
        else:
            seen.add(counter_set)
        counters = entry.get("counters")
        if not isinstance(counters, Mapping) or not counters:
            found.add(f"{at}.counters", "required: at least one counter")
            continue
        total += len(counters)
        if len(counters) > MAX_COUNTERS_PER_CONSUMPTION:
            found.add(
                f"{at}.counters",
                f"must have at most {MAX_COUNTERS_PER_CONSUMPTION} counters, has {len(counters)}",
            )
            continue
        _check_counter_map(counters, f"{at}.counters", found)
    if not caps.counters_in_own_slice and total > MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34:
        found.add(
            where,
            f"must consume at most {MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34} counters (1.34),"
            f" consumes {total}",
        )
    return total


def _check_taints(taints: object, caps: Capabilities, path: str, found: _Problems) -> None:
    entries = _list(taints, path, found)
    if entries is None:
        return
    if entries and not caps.device_taints:
        found.add(path, "set, but this cluster drops it (DRADeviceTaints off)")
    limit = MAX_TAINTS if caps.counters_in_own_slice else MAX_TAINTS_1_34
    if len(entries) > limit:
        found.add(path, f"must have at most {limit} taints, has {len(entries)}")
        return
    effects = TAINT_EFFECTS_1_35 if caps.counters_in_own_slice else TAINT_EFFECTS
    for index, taint in enumerate(entries):
        at = f"{path}[{index}]"
        if not isinstance(taint, Mapping):
            found.add(at, "must be an object")
            continue
        _unknown_fields(taint, _TAINT_FIELDS, at, found)
        if problem := _label_name(taint.get("key")):
            found.add(f"{at}.key", problem)
        if taint.get("value") is not None and (problem := _label_value(taint["value"])):
            found.add(f"{at}.value", problem)
        effect = taint.get("effect")
        if not effect:
            found.add(f"{at}.effect", "required")
        elif effect not in effects:
            found.add(f"{at}.effect", f"{effect!r} is not one of {', '.join(effects)}")


def _check_device_nodes(
    device: Mapping[str, Any], per_device_nodes: bool, path: str, found: _Problems
) -> None:
    chosen = [f for f in ("nodeName", "nodeSelector", "allNodes") if device.get(f) is not None]
    if not per_device_nodes:
        if chosen:
            found.add(path, f"{', '.join(chosen)} only allowed with perDeviceNodeSelection")
        return
    if device.get("nodeName") == "":
        found.add(f"{path}.nodeName", "must not be empty")
    if device.get("allNodes") is False:
        found.add(f"{path}.allNodes", "must be either unset or true")
    if device.get("nodeSelector") is not None:
        _check_node_selector(device["nodeSelector"], f"{path}.nodeSelector", found)
    if len(chosen) != 1:
        found.add(
            path,
            "exactly one of nodeName, nodeSelector, allNodes is required"
            " with perDeviceNodeSelection",
        )


# --- pool -----------------------------------------------------------------------------


def _check_pool_consistency(specs: Sequence[Mapping[str, Any]], found: _Problems) -> None:
    def pool_field(spec: Mapping[str, Any], field: str) -> Any:
        pool = spec.get("pool")
        return pool.get(field) if isinstance(pool, Mapping) else None

    first = specs[0]
    for index, spec in enumerate(specs[1:], start=1):
        for field in ("driver", "nodeName"):
            if spec.get(field) != first.get(field):
                found.add(
                    f"slices[{index}].spec.{field}",
                    f"differs from slices[0]: {spec.get(field)!r} != {first.get(field)!r}",
                )
        for field in ("name", "generation"):
            if pool_field(spec, field) != pool_field(first, field):
                found.add(
                    f"slices[{index}].spec.pool.{field}",
                    f"differs from slices[0]: {pool_field(spec, field)!r} !="
                    f" {pool_field(first, field)!r}",
                )
    for index, spec in enumerate(specs):
        count = pool_field(spec, "resourceSliceCount")
        if count != len(specs):
            found.add(
                f"slices[{index}].spec.pool.resourceSliceCount",
                f"is {count!r}, but the pool has {len(specs)} slices",
            )


def _counter_sets_by_name(specs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    sets: dict[str, Mapping[str, Any]] = {}
    for spec in specs:
        for counter_set in spec.get("sharedCounters") or ():
            if isinstance(counter_set, Mapping) and isinstance(counter_set.get("name"), str):
                counters = counter_set.get("counters")
                sets.setdefault(
                    counter_set["name"], counters if isinstance(counters, Mapping) else {}
                )
    return sets


def _check_references(
    devices: Sequence[Any], sets: Mapping[str, Mapping[str, Any]], path: str, found: _Problems
) -> None:
    """Every consumesCounters entry names an existing set and counters, within its amount."""
    for index, device in enumerate(devices):
        if not isinstance(device, Mapping):
            continue
        for entry_index, entry in enumerate(device.get("consumesCounters") or ()):
            if not isinstance(entry, Mapping):
                continue
            at = f"{path}[{index}].consumesCounters[{entry_index}]"
            name = entry.get("counterSet")
            if not isinstance(name, str) or name not in sets:
                found.add(f"{at}.counterSet", f"counter set {name!r} is not defined in the pool")
                continue
            available = sets[name]
            counters = entry.get("counters")
            for counter_name, counter in counters.items() if isinstance(counters, Mapping) else ():
                if counter_name not in available:
                    found.add(
                        f"{at}.counters[{counter_name}]",
                        f"counter set {name!r} has no such counter",
                    )
                    continue
                try:
                    need = parse_quantity(
                        counter.get("value") if isinstance(counter, Mapping) else None
                    )
                    have = parse_quantity(available[counter_name].get("value"))
                except (ValueError, AttributeError):
                    continue  # reported where the quantity is
                if need > have:
                    found.add(
                        f"{at}.counters[{counter_name}]",
                        f"consumes more than counter set {name!r} has, so it could never be"
                        " allocated (driver rule)",
                    )


def _check_pool_devices(
    specs: Sequence[Mapping[str, Any]], caps: Capabilities, found: _Problems
) -> None:
    seen_devices: dict[str, str] = {}
    seen_sets: dict[str, str] = {}
    for index, spec in enumerate(specs):
        for d_index, device in enumerate(spec.get("devices") or ()):
            name = device.get("name") if isinstance(device, Mapping) else None
            if not isinstance(name, str):
                continue
            at = f"slices[{index}].spec.devices[{d_index}].name"
            if name in seen_devices and not seen_devices[name].startswith(f"slices[{index}]."):
                found.add(at, f"device {name!r} is also published at {seen_devices[name]}")
            seen_devices.setdefault(name, at)
        if not caps.counters_in_own_slice:
            continue
        for s_index, counter_set in enumerate(spec.get("sharedCounters") or ()):
            name = counter_set.get("name") if isinstance(counter_set, Mapping) else None
            if not isinstance(name, str):
                continue
            at = f"slices[{index}].spec.sharedCounters[{s_index}].name"
            if name in seen_sets and not seen_sets[name].startswith(f"slices[{index}]."):
                found.add(at, f"counter set {name!r} is also defined at {seen_sets[name]}")
            seen_sets.setdefault(name, at)
    if caps.counters_in_own_slice:
        sets = _counter_sets_by_name(specs)
        for index, spec in enumerate(specs):
            devices = spec.get("devices")
            if isinstance(devices, list | tuple):
                _check_references(devices, sets, f"slices[{index}].spec.devices", found)
