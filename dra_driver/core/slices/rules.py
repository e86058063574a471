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

The checks are split by what they look at: :mod:`~dra_driver.core.slices.limits`
(the API's limits), :mod:`~dra_driver.base.names` (names and labels, with their
length limits), :mod:`~dra_driver.core.slices.grammar` (quantities and shapes),
:mod:`~dra_driver.core.slices.nodes`,
:mod:`~dra_driver.core.slices.devices`, :mod:`~dra_driver.core.slices.attributes`,
:mod:`~dra_driver.core.slices.counters` and :mod:`~dra_driver.core.slices.pool`.
This module checks a slice's top-level fields and is the entry point; the
limits are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.base.errors import DriverError
from dra_driver.base.names import (
    MAX_DNS_LABEL,
    MAX_DNS_SUBDOMAIN,
    MAX_DOMAIN,
    MAX_IDENTIFIER,
    dns_subdomain,
    driver_name,
)
from dra_driver.core.settings import Capabilities
from dra_driver.core.slices.counters import check_counter_sets
from dra_driver.core.slices.devices import check_devices
from dra_driver.core.slices.grammar import Problems, as_list, unknown_fields
from dra_driver.core.slices.limits import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_BINDING_CONDITIONS,
    MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34,
    MAX_CONSUMED_COUNTERS_PER_SLICE_1_34,
    MAX_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTER_SETS,
    MAX_COUNTERS_PER_CONSUMPTION,
    MAX_COUNTERS_PER_SET,
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS_OR_COUNTERS,
    MAX_POOL_NAME,
    MAX_SHARED_COUNTERS_1_34,
    MAX_STRING_VALUE,
    MAX_TAINTS,
    MAX_TAINTS_1_34,
    MAX_VALID_VALUES,
    TAINT_EFFECTS,
    TAINT_EFFECTS_1_35,
)
from dra_driver.core.slices.nodes import check_node_selection
from dra_driver.core.slices.pool import check_pool_consistency, check_pool_devices

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_BINDING_CONDITIONS",
    "MAX_CONSUMED_COUNTERS_PER_DEVICE_1_34",
    "MAX_CONSUMED_COUNTERS_PER_SLICE_1_34",
    "MAX_CONSUMPTIONS_PER_DEVICE",
    "MAX_COUNTERS_PER_CONSUMPTION",
    "MAX_COUNTERS_PER_SET",
    "MAX_COUNTER_SETS",
    "MAX_DEVICES",
    "MAX_DEVICES_WITH_TAINTS_OR_COUNTERS",
    "MAX_DNS_LABEL",
    "MAX_DNS_SUBDOMAIN",
    "MAX_DOMAIN",
    "MAX_IDENTIFIER",
    "MAX_POOL_NAME",
    "MAX_SHARED_COUNTERS_1_34",
    "MAX_STRING_VALUE",
    "MAX_TAINTS",
    "MAX_TAINTS_1_34",
    "MAX_VALID_VALUES",
    "TAINT_EFFECTS",
    "TAINT_EFFECTS_1_35",
    "SliceInvalidError",
    "pool_problems",
    "slice_problems",
    "validate_pool",
    "validate_slice",
]

_SPEC_FIELDS = frozenset(
    {
        "driver", "pool", "nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection",
        "devices", "sharedCounters", "partitionTypeAttribute", "skipNodeOperations",
    }
)  # fmt: skip
_POOL_FIELDS = frozenset({"name", "generation", "resourceSliceCount"})


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
    found = Problems()
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
    found = Problems()
    for index, spec in enumerate(specs):
        found.extend(f"slices[{index}].{p}" for p in slice_problems(spec, capabilities))
    specs = [spec for spec in specs if isinstance(spec, Mapping)]
    if not specs:
        return found.items
    check_pool_consistency(specs, found)
    check_pool_devices(specs, capabilities, found)
    return found.items


def validate_pool(specs: Sequence[Mapping[str, Any]], capabilities: Capabilities) -> None:
    """Raise :class:`SliceInvalidError` naming every problem of a whole pool."""
    problems = pool_problems(specs, capabilities)
    if problems:
        raise SliceInvalidError(problems)


def _check_spec(spec: object, caps: Capabilities, path: str, found: Problems) -> None:
    if not isinstance(spec, Mapping):
        found.add(path, "must be an object")
        return
    unknown_fields(spec, _SPEC_FIELDS, path, found)
    if "driver" not in spec:
        found.add(f"{path}.driver", "required")
    elif problem := driver_name(spec["driver"]):
        found.add(f"{path}.driver", problem)
    _check_pool_field(spec.get("pool"), f"{path}.pool", found)
    check_node_selection(spec, caps, path, found)

    devices = as_list(spec.get("devices"), f"{path}.devices", found)
    counter_sets = as_list(spec.get("sharedCounters"), f"{path}.sharedCounters", found)
    if caps.counters_in_own_slice and devices is not None and counter_sets is not None:
        found.add(path, "only one of devices and sharedCounters may be set (1.35+)")
    if counter_sets is not None:
        check_counter_sets(counter_sets, caps, f"{path}.sharedCounters", found)
    if devices is not None:
        check_devices(spec, devices, caps, path, found)


def _check_pool_field(pool: object, path: str, found: Problems) -> None:
    if pool is None:
        found.add(path, "required")
        return
    if not isinstance(pool, Mapping):
        found.add(path, "must be an object")
        return
    unknown_fields(pool, _POOL_FIELDS, path, found)
    name = pool.get("name")
    if not isinstance(name, str) or not name:
        found.add(f"{path}.name", "required: a non-empty string")
    else:
        if len(name) > MAX_POOL_NAME:
            found.add(f"{path}.name", f"must be no more than {MAX_POOL_NAME} characters")
        for part in name.split("/"):
            if problem := dns_subdomain(part):
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
