"""Counter checks (pure): shared counter sets and the counters devices consume from them.

``sharedCounters`` lists named counter sets; a device's ``consumesCounters``
lists, per counter set, the amounts it takes. Both are lists of named counter
maps with the same shape rules (:func:`_check_counter_entries`) but different
limits. :func:`check_references` checks that what is consumed exists: inside
one slice in 1.34, across the pool in 1.35+.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.base.names import dns_label
from dra_driver.base.quantity import parse_quantity
from dra_driver.core.settings import Capabilities
from dra_driver.core.slices.grammar import Problems, as_list, quantity, unknown_fields
from dra_driver.core.slices.limits import (
    MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34,
    MAX_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTER_SETS,
    MAX_COUNTERS_PER_CONSUMPTION,
    MAX_COUNTERS_PER_SET,
    MAX_SHARED_COUNTERS_1_34,
)

_COUNTER_SET_FIELDS = frozenset({"name", "counters"})
_CONSUMPTION_FIELDS = frozenset({"counterSet", "counters", "compatibilityGroups"})
_COUNTER_FIELDS = frozenset({"value"})


def check_counter_sets(
    counter_sets: list[Any], caps: Capabilities, path: str, found: Problems
) -> None:
    """Check a slice's sharedCounters."""
    if not caps.partitionable_devices:
        found.add(path, "set, but this cluster drops it (DRAPartitionableDevices off)")
    if caps.counters_in_own_slice and len(counter_sets) > MAX_COUNTER_SETS:
        found.add(
            path, f"must have at most {MAX_COUNTER_SETS} counter sets, has {len(counter_sets)}"
        )
        return
    total = _check_counter_entries(
        counter_sets,
        fields=_COUNTER_SET_FIELDS,
        name_field="name",
        duplicate="duplicate counter set",
        max_counters=MAX_COUNTERS_PER_SET,
        path=path,
        found=found,
    )
    if not caps.counters_in_own_slice and total > MAX_SHARED_COUNTERS_1_34:
        found.add(
            path,
            f"must have at most {MAX_SHARED_COUNTERS_1_34} counters over all sets (1.34),"
            f" has {total}",
        )


def check_consumptions(consumptions: object, caps: Capabilities, path: str, found: Problems) -> int:
    """Check a device's consumesCounters; return how many counters it consumes."""
    where = f"{path}.consumesCounters"
    entries = as_list(consumptions, where, found)
    if entries is None:
        return 0
    if not caps.partitionable_devices and entries:
        found.add(where, "set, but this cluster drops it (DRAPartitionableDevices off)")
    if caps.counters_in_own_slice and len(entries) > MAX_CONSUMPTIONS_PER_DEVICE:
        found.add(
            where, f"must have at most {MAX_CONSUMPTIONS_PER_DEVICE} entries, has {len(entries)}"
        )
        return 0
    total = _check_counter_entries(
        entries,
        fields=_CONSUMPTION_FIELDS,
        name_field="counterSet",
        duplicate="duplicate entry for counter set",
        max_counters=MAX_COUNTERS_PER_CONSUMPTION,
        path=where,
        found=found,
    )
    if not caps.counters_in_own_slice and total > MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34:
        found.add(
            where,
            f"must consume at most {MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34} counters (1.34),"
            f" consumes {total}",
        )
    return total


def _check_counter_entries(
    entries: list[Any],
    *,
    fields: frozenset[str],
    name_field: str,
    duplicate: str,
    max_counters: int,
    path: str,
    found: Problems,
) -> int:
    """Check a list of named counter maps; return how many counters the entries hold.

    Each entry is an object with ``fields``: a DNS-label name in ``name_field``,
    unique in the list (else ``<duplicate> '<name>'``), and 1 to ``max_counters``
    counters.
    """
    total = 0
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        at = f"{path}[{index}]"
        if not isinstance(entry, Mapping):
            found.add(at, "must be an object")
            continue
        unknown_fields(entry, fields, at, found)
        name = entry.get(name_field)
        if not isinstance(name, str) or dns_label(name):
            found.add(f"{at}.{name_field}", dns_label(name) or "")
        elif name in seen:
            found.add(f"{at}.{name_field}", f"{duplicate} {name!r}")
        else:
            seen.add(name)
        counters = entry.get("counters")
        if not isinstance(counters, Mapping) or not counters:
            found.add(f"{at}.counters", "required: at least one counter")
            continue
        total += len(counters)
        if len(counters) > max_counters:
            found.add(
                f"{at}.counters",
                f"must have at most {max_counters} counters, has {len(counters)}",
            )
            continue
        _check_counter_map(counters, f"{at}.counters", found)
    return total


def _check_counter_map(counters: Mapping[str, Any], path: str, found: Problems) -> None:
    for counter_name, counter in counters.items():
        where = f"{path}[{counter_name}]"
        if problem := dns_label(counter_name):
            found.add(where, f"counter name {problem}")
        if not isinstance(counter, Mapping):
            found.add(where, "must be an object with a value")
            continue
        unknown_fields(counter, _COUNTER_FIELDS, where, found)
        if "value" not in counter:
            found.add(f"{where}.value", "required")
        else:
            quantity(counter["value"], f"{where}.value", found)


def counter_sets_by_name(specs: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Counter-set name → its counters, over all ``specs`` (the first definition wins)."""
    sets: dict[str, Mapping[str, Any]] = {}
    for spec in specs:
        for counter_set in spec.get("sharedCounters") or ():
            if isinstance(counter_set, Mapping) and isinstance(counter_set.get("name"), str):
                counters = counter_set.get("counters")
                sets.setdefault(
                    counter_set["name"], counters if isinstance(counters, Mapping) else {}
                )
    return sets


def check_references(
    devices: Sequence[Any], sets: Mapping[str, Mapping[str, Any]], path: str, found: Problems
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
