"""Device checks (pure): a slice's device list and each device in it.

The list: how many devices a slice may hold, unique names, and in 1.34 the
counters all devices consume and whether the slice defines them. Each device:
its name, fields, attributes and capacities
(:mod:`dra_driver.core.slices.attributes`), counter consumption
(:mod:`dra_driver.core.slices.counters`), taints, node selection
(:mod:`dra_driver.core.slices.nodes`) and binding conditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.base.names import dns_label, label_name, label_value
from dra_driver.core.settings import Capabilities
from dra_driver.core.slices.attributes import check_attribute, check_capacity
from dra_driver.core.slices.counters import (
    check_consumptions,
    check_references,
    counter_sets_by_name,
)
from dra_driver.core.slices.grammar import Problems, as_list, as_mapping, unknown_fields
from dra_driver.core.slices.limits import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_BINDING_CONDITIONS,
    MAX_CONSUMED_COUNTERS_PER_SLICE_1_34,
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    MAX_TAINTS,
    MAX_TAINTS_1_34,
    TAINT_EFFECTS,
    TAINT_EFFECTS_1_35,
)
from dra_driver.core.slices.nodes import check_device_nodes

_DEVICE_FIELDS = frozenset(
    {
        "name", "attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector",
        "allNodes", "allowMultipleAllocations", "taints", "bindsToNode", "bindingConditions",
        "bindingFailureConditions", "nodeAllocatableResources",
    }
)  # fmt: skip
_TAINT_FIELDS = frozenset({"key", "value", "effect", "timeAdded"})


def check_devices(
    spec: Mapping[str, Any], devices: list[Any], caps: Capabilities, path: str, found: Problems
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
        sets = counter_sets_by_name([spec])
        check_references(devices, sets, where, found)


def _check_device(
    device: Mapping[str, Any],
    caps: Capabilities,
    per_device_nodes: bool,
    path: str,
    found: Problems,
) -> int:
    """Check one device; return how many counters it consumes (for the 1.34 slice total)."""
    unknown_fields(device, _DEVICE_FIELDS, path, found)
    if problem := dns_label(device.get("name")):
        found.add(f"{path}.name", problem)
    attributes = as_mapping(device.get("attributes"), f"{path}.attributes", found) or {}
    capacity = as_mapping(device.get("capacity"), f"{path}.capacity", found) or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        found.add(
            path,
            f"attributes and capacities together must be at most {MAX_ATTRIBUTES_AND_CAPACITIES},"
            f" has {len(attributes) + len(capacity)}",
        )
    for name, attribute in attributes.items():
        check_attribute(name, attribute, f"{path}.attributes[{name}]", found)

    shared = device.get("allowMultipleAllocations")
    if shared is not None and not isinstance(shared, bool):
        found.add(f"{path}.allowMultipleAllocations", "must be a boolean")
    if shared is True and not caps.consumable_capacity:
        found.add(
            f"{path}.allowMultipleAllocations",
            "set, but this cluster drops it (DRAConsumableCapacity off)",
        )
    for name, entry in capacity.items():
        check_capacity(name, entry, shared is True, f"{path}.capacity[{name}]", found)

    consumed = check_consumptions(device.get("consumesCounters"), caps, path, found)
    _check_taints(device.get("taints"), caps, f"{path}.taints", found)
    check_device_nodes(device, per_device_nodes, path, found)
    for field in ("bindingConditions", "bindingFailureConditions"):
        conditions = as_list(device.get(field), f"{path}.{field}", found)
        if conditions is not None and len(conditions) > MAX_BINDING_CONDITIONS:
            found.add(f"{path}.{field}", f"must have at most {MAX_BINDING_CONDITIONS} entries")
    return consumed


def _check_taints(taints: object, caps: Capabilities, path: str, found: Problems) -> None:
    entries = as_list(taints, path, found)
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
        unknown_fields(taint, _TAINT_FIELDS, at, found)
        if problem := label_name(taint.get("key")):
            found.add(f"{at}.key", problem)
        if taint.get("value") is not None and (problem := label_value(taint["value"])):
            found.add(f"{at}.value", problem)
        effect = taint.get("effect")
        if not effect:
            found.add(f"{at}.effect", "required")
        elif effect not in effects:
            found.add(f"{at}.effect", f"{effect!r} is not one of {', '.join(effects)}")
