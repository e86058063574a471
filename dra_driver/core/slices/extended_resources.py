"""DRA extended resources (KEP-5004) on this node: the double-advertising check (pure).

A DeviceClass with ``spec.extendedResourceName`` (e.g. ``nvidia.com/gpu``) lets
pods written for a device plugin ask for our devices. On one node a name must
come from DRA or from a device plugin, never both: the scheduler serves a
node's extended resource from the device plugin wherever ``status.allocatable``
has it (non-zero), and from DRA only where it does not, so with both the
device plugin's pods and our claims can be given the same GPU
(kubernetes/kubernetes ``pkg/scheduler/framework/plugins/dynamicresources/
extendeddynamicresources.go``, ``filterExtendedResources``). The plugin checks
its Node for the names the chart's classes serve and warns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.base.quantity import parse_quantity

EVENT_REASON = "ExtendedResourceConflict"


def parse_names(text: str) -> tuple[str, ...]:
    """``--extended-resource-names``: comma-separated, blanks ignored, order kept."""
    return tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


@dataclass(frozen=True)
class Advertised:
    """One of our extended resource names as the Node's status lists it."""

    name: str
    allocatable: str | None
    capacity: str | None

    @property
    def served_by_device_plugin(self) -> bool:
        """The scheduler's test: a non-zero allocatable means the device plugin serves it."""
        return _positive(self.allocatable)


def _positive(amount: str | None) -> bool:
    if amount is None:
        return False
    try:
        return parse_quantity(amount) > 0
    except ValueError:
        return True  # unparsable, but there: report it


def advertised(node: Mapping[str, Any], names: Sequence[str]) -> list[Advertised]:
    """Our names that the Node's ``status.allocatable`` or ``status.capacity`` has."""
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or {}
    capacity = status.get("capacity") or {}
    found = []
    for name in names:
        if name in allocatable or name in capacity:
            a, c = allocatable.get(name), capacity.get(name)
            found.append(
                Advertised(name, None if a is None else str(a), None if c is None else str(c))
            )
    return found


def conflict_message(node_name: str, found: Sequence[Advertised]) -> str | None:
    """The warning for ``found``, or None when nothing conflicts.

    An entry with zero allocatable and zero capacity (a device plugin that
    stopped; the kubelet keeps its names at 0 for a while) is not a conflict.
    """
    live = [a for a in found if a.served_by_device_plugin or _positive(a.capacity)]
    if not live:
        return None
    listed = ", ".join(
        f"{a.name} (allocatable {a.allocatable or '0'}, capacity {a.capacity or '0'})" for a in live
    )
    return (
        f"node {node_name} also advertises {listed} in its status, from a device plugin: the "
        "scheduler serves these names from the device plugin on this node, not from this "
        "driver, and this driver's DRA claims can be given the same GPUs. Remove the device "
        "plugin from this node (or take the node out of this driver's opt-in label), or turn "
        "the chart's extendedResources off"
    )
