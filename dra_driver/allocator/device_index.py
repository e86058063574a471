"""The device index of :class:`~dra_driver.allocator.state.AllocatorState`: per request
shape, its matching devices, grouped by capacity signature, kept in packing order.

A request shape (class, selectors, tolerations) is matched once, CEL evaluated once
per device (:class:`Match`). Its devices are grouped by capacity signature
(:class:`Group`); each group keeps its devices in first-fit order and its available
ones sorted by free memory (best fit), and :meth:`DeviceIndex._refresh` moves a
device when an allocation changes its use.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocator.capacity import effective_capacity, fits
from dra_driver.allocator.cel import CelError, SelectorCache, is_sentinel
from dra_driver.allocator.k8s_rules import keeps_off
from dra_driver.allocator.ledger import Ledger
from dra_driver.allocator.model import Capacity, Device, DeviceClass, ExactRequest
from dra_driver.allocator.packing import Placement, first_fit
from dra_driver.base.quantity import Amount

MatchKey = tuple[str, tuple[str, ...], tuple[Any, ...]]
IndexEntry = tuple[Any, ...]
"""(free memory, shares, index, total memory, pool, name, position): best-fit order."""


@dataclass
class Group:
    """The matching devices of one request shape that share one capacity signature."""

    shareable: bool
    caps: Mapping[str, Capacity]
    static: list[int]
    """Positions in first-fit order (pool, index, total memory, name)."""
    ordered: list[IndexEntry] = field(default_factory=list)
    """Available devices in best-fit order (free memory ascending)."""
    current: dict[int, IndexEntry] = field(default_factory=dict)
    """Position -> its entry in ``ordered``; absent while the device cannot take a share."""
    by_node: dict[str | None, list[int]] = field(default_factory=dict)
    """Node -> positions of its devices in the group (a node's alone keys, lazily)."""


@dataclass
class Match:
    devices: list[int]
    """Positions of matching (tolerated) devices, in device order."""
    errors: list[tuple[int, CelError]]
    groups: list[Group] | None = None
    by_node: dict[str | None, list[int]] | None = None
    """Node name -> positions of its matching devices, in device order."""


def memory_floor(group: Group, alt: ExactRequest, requested: Mapping[str, Amount]) -> Amount | None:
    """Free memory a device of ``group`` needs to take ``alt`` alone; None: no device can
    (the request does not fit the group's capacities, or asks capacity of a plain one)."""
    if group.shareable:
        need = fits(requested, group.caps, {})
        if isinstance(need, str):
            return None
        return need.get("memory", 0)
    # A share (asked by capacity.requests or by the claim's GpuShare) never goes to a
    # device that cannot be shared (search.place): no need to walk such a group at all.
    # Without the GpuShare case every MIG partition was walked, and refused, per claim.
    if alt.capacity_requests or (requested and not alt.admin_access):
        return None
    return 0


def _tolerated(request: ExactRequest, device: Device) -> bool:
    return all(
        not keeps_off(taint.effect) or any(t.tolerates(taint) for t in request.tolerations)
        for taint in device.taints
    )


class DeviceIndex:
    """Matching and groups over the controller-managed devices; its attributes are set
    by :class:`~dra_driver.allocator.state.AllocatorState`."""

    driver_name: str
    cache: SelectorCache
    ledger: Ledger
    devices: list[Device]
    _index: list[int]
    _matches: dict[MatchKey, Match]
    _groups_of: dict[int, list[Group]]

    def _match(self, alt: ExactRequest, found: DeviceClass) -> Match:
        key: MatchKey = (alt.device_class, alt.selectors, alt.tolerations)
        match = self._matches.get(key)
        if match is None:
            selectors = [s for s in found.selectors if not is_sentinel(s, self.driver_name)]
            selectors += alt.selectors
            positions: list[int] = []
            errors: list[tuple[int, CelError]] = []
            for pos, device in enumerate(self.devices):
                if not _tolerated(alt, device):
                    continue
                try:
                    if all(self.cache.matches(s, device) for s in selectors):
                        positions.append(pos)
                except CelError as err:
                    errors.append((pos, err))
            match = Match(positions, errors)
            self._matches[key] = match
        return match

    def _groups(self, match: Match) -> list[Group]:
        if match.groups is None:
            by_sig: dict[Any, Group] = {}
            for pos in match.devices:
                shareable, caps = effective_capacity(self.devices[pos])
                sig = (shareable, tuple(sorted(caps.items())))
                group = by_sig.get(sig)
                if group is None:
                    group = by_sig[sig] = Group(shareable, caps, [])
                group.static.append(pos)
            for group in by_sig.values():
                group.static.sort(key=lambda p: first_fit(self._placement(group, p)))
                for pos in group.static:
                    group.by_node.setdefault(self.devices[pos].node_name, []).append(pos)
                    entry = self._entry(group, pos)
                    if entry is not None:
                        group.current[pos] = entry
                        group.ordered.append(entry)
                    self._groups_of.setdefault(pos, []).append(group)
                group.ordered.sort()
            match.groups = list(by_sig.values())
        return match.groups

    def _total(self, group: Group) -> Amount:
        return group.caps["memory"].value if "memory" in group.caps else 0

    def _placement(self, group: Group, pos: int) -> Placement:
        device = self.devices[pos]
        return Placement(device, 0, 0, self._index[pos], self._total(group))

    def _entry(self, group: Group, pos: int) -> IndexEntry | None:
        device = self.devices[pos]
        use = self.ledger.use(device.key)
        if use.exclusive or (not group.shareable and use.in_use):
            return None
        total = self._total(group)
        free = total - use.consumed.get("memory", 0) if group.shareable else 0
        return (free, use.shares, self._index[pos], total, device.pool, device.name, pos)

    def _refresh(self, pos: int) -> None:
        for group in self._groups_of.get(pos, ()):
            old = group.current.pop(pos, None)
            if old is not None:
                del group.ordered[bisect.bisect_left(group.ordered, old)]
            new = self._entry(group, pos)
            if new is not None:
                group.current[pos] = new
                bisect.insort(group.ordered, new)
