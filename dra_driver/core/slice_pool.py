"""Pool checks (pure): the rules that span the slices of one pool.

One driver, pool name, node and ``generation`` on every slice;
``resourceSliceCount`` equal to the number of slices; device names unique in
the pool; and in 1.35+ counter-set names unique in the pool, with every
``consumesCounters`` entry resolved against the sets of the whole pool.
Locations start with ``slices[<i>]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.core.settings import Capabilities
from dra_driver.core.slice_counters import check_references, counter_sets_by_name
from dra_driver.core.slice_grammar import Problems


def check_pool_consistency(specs: Sequence[Mapping[str, Any]], found: Problems) -> None:
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


def check_pool_devices(
    specs: Sequence[Mapping[str, Any]], caps: Capabilities, found: Problems
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
        sets = counter_sets_by_name(specs)
        for index, spec in enumerate(specs):
            devices = spec.get("devices")
            if isinstance(devices, list | tuple):
                check_references(devices, sets, f"slices[{index}].spec.devices", found)
