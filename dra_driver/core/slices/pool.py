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
from dra_driver.core.slices.counters import check_references, counter_sets_by_name
from dra_driver.core.slices.grammar import Problems


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


def _check_unique_across_slices(
    spec: Mapping[str, Any],
    index: int,
    field: str,
    *,
    seen: dict[str, str],
    message: str,
    found: Problems,
) -> None:
    """Names in ``spec.<field>`` of slice ``index`` seen in an earlier slice of the pool
    (``seen``: name -> where first seen; duplicates inside one slice are the slice's
    own check). ``message`` is formatted with the name and the earlier place."""
    for entry_index, entry in enumerate(spec.get(field) or ()):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str):
            continue
        at = f"slices[{index}].spec.{field}[{entry_index}].name"
        if name in seen and not seen[name].startswith(f"slices[{index}]."):
            found.add(at, message.format(name, seen[name]))
        seen.setdefault(name, at)


def check_pool_devices(
    specs: Sequence[Mapping[str, Any]], caps: Capabilities, found: Problems
) -> None:
    seen_devices: dict[str, str] = {}
    seen_sets: dict[str, str] = {}
    for index, spec in enumerate(specs):
        _check_unique_across_slices(
            spec,
            index,
            "devices",
            seen=seen_devices,
            message="device {!r} is also published at {}",
            found=found,
        )
        if caps.counters_in_own_slice:
            _check_unique_across_slices(
                spec,
                index,
                "sharedCounters",
                seen=seen_sets,
                message="counter set {!r} is also defined at {}",
                found=found,
            )
    if caps.counters_in_own_slice:
        sets = counter_sets_by_name(specs)
        for index, spec in enumerate(specs):
            devices = spec.get("devices")
            if isinstance(devices, list | tuple):
                check_references(devices, sets, f"slices[{index}].spec.devices", found)
