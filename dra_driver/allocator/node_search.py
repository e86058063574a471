"""The node-by-node search of :class:`~dra_driver.allocator.state.AllocatorState`, for
claims that are not one device of one alternative (several devices, ``All``, admin
access, ``firstAvailable``).

Nodes are tried in order of a lower bound on their score
(:mod:`dra_driver.allocator.ranking`), each searched by
:func:`~dra_driver.allocator.search._solve`; with admin access or ``matchAttribute``
every node is searched (:meth:`NodeSearch._search_all`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dra_driver.allocator.device_index import DeviceIndex, Group, IndexEntry, Match, memory_floor
from dra_driver.allocator.model import Claim, Device, ExactRequest, Pool
from dra_driver.allocator.packing import Placement, Policy, best_fit, first_fit
from dra_driver.allocator.ranking import AloneKey, LazyNodes, NodeOrder, Ranked, SortedNodes
from dra_driver.allocator.search import (
    Budget,
    Pick,
    Search,
    request_slots,
    requested_capacity,
    solve,
)
from dra_driver.base.quantity import Amount


class NodeSearch(DeviceIndex):
    """The search for multi-device claims over the device index; its attributes are set
    by :class:`~dra_driver.allocator.state.AllocatorState`."""

    pool_map: dict[tuple[str, str], Pool]
    examined: int
    walked: int

    def _search(
        self,
        claim: Claim,
        matches: Sequence[tuple[ExactRequest, Match]],
        policy: Policy,
        usable: Callable[[Device], bool],
        budget: Budget | None = None,
    ) -> tuple[str | None, list[Pick]] | None:
        """The node-by-node search; nodes are tried in order of a lower bound on their score.

        Without admin access and ``matchAttribute`` constraints a claim never picks a
        device twice, so each pick's key is the key of that device taking its request
        alone, and a device that cannot take the request alone is never picked. The
        ``k`` smallest alone keys of a node (``k`` slots) then bound its score from
        below element by element, hence lexicographically. Nodes without ``k`` such
        devices are skipped, the rest are searched in bound order, and the search stops
        once a bound exceeds the best (score, node) found: the same winner as searching
        every node.

        Best fit and first fit find the nodes in that order lazily
        (:class:`~dra_driver.allocator.ranking.LazyNodes`): walking their index from the
        request's floor, a node is ranked when first seen, and the walk ends once it
        passes the best score's first element, so a claim looks at a few nodes, not at
        every device that could fit. Any other policy ranks every node up front.
        """
        if any(alt.admin_access for alt, _ in matches) or any(
            c.match_attribute for c in claim.constraints
        ):
            return self._search_all(claim, matches, policy, usable, budget)
        shapes = self._shapes(claim, matches)
        # Requests of one alternative that is not ``All``: the same slot count on every node.
        alts = [r.alternatives[0] for r in claim.requests if len(r.alternatives) == 1]
        fixed = len(alts) == len(claim.requests) and all(
            a.mode != "All" and a.count > 0 for a in alts
        )

        def rank(node: str | None, keys: Iterable[tuple[Any, ...]]) -> Ranked | None:
            candidates = None if fixed else self._candidates(node, matches, usable)
            if candidates is None:
                k = sum(a.count for a in alts)
            else:
                slots = request_slots(claim, candidates)
                if slots is None:
                    return None
                k = len(slots)
            smallest = heapq.nsmallest(k, keys)
            if len(smallest) < k:
                return None
            return Ranked(tuple(smallest), node or "", node, candidates)

        # LazyNodes needs non-empty bounds: every request then takes at least one slot.
        counted = all(
            a.count > 0 or a.mode == "All" for r in claim.requests for a in r.alternatives
        )
        order: NodeOrder
        if (policy is best_fit or policy is first_fit) and counted:
            order = LazyNodes(
                self._ascending_alone_keys(shapes, policy, usable),
                lambda node: rank(node, self._node_alone_keys(node, shapes, policy, usable)),
            )
        else:
            alone = self._alone_keys(shapes, policy, usable)
            order = SortedNodes(
                r for node, keys in alone.items() if (r := rank(node, keys.values())) is not None
            )
        best: tuple[tuple[Any, ...], str, str | None, list[Pick]] | None = None
        while (ranked := order.next(None if best is None else best[0][0])) is not None:
            if best is not None and (ranked.bound, ranked.name) > (best[0], best[1]):
                break
            node = ranked.node
            found = ranked.candidates
            candidates = found if found is not None else self._candidates(node, matches, usable)
            search = Search(claim, self.ledger, policy, candidates, self.pool_map, budget)
            slots = request_slots(claim, candidates)
            solved = slots is not None and solve(search, slots, 0)
            self.examined += search.examined
            if not solved:
                continue
            score = tuple(sorted(p.key for p in search.picks))
            if best is None or (score, ranked.name) < (best[0], best[1]):
                best = (score, ranked.name, node, list(search.picks))
        return None if best is None else (best[2], best[3])

    def _shapes(
        self, claim: Claim, matches: Sequence[tuple[ExactRequest, Match]]
    ) -> list[tuple[Group, Amount]]:
        """Per alternative, per group of its matching devices that can take it alone:
        the group and the free memory a device needs for it."""
        shapes = []
        for alt, match in matches:
            requested = requested_capacity(alt, claim, self.driver_name)
            for group in self._groups(match):
                floor = memory_floor(group, alt, requested)
                if floor is not None:
                    shapes.append((group, floor))
        return shapes

    def _alone_key(
        self, policy: Policy, group: Group, entry: IndexEntry, floor: Amount
    ) -> tuple[Any, ...]:
        """The key of the device of ``entry`` taking a request of ``floor`` alone."""
        self.walked += 1
        free = entry[0] - floor if group.shareable else 0
        return policy(Placement(self.devices[entry[-1]], free, entry[1], entry[2], entry[3]))

    def _alone_keys(
        self,
        shapes: Sequence[tuple[Group, Amount]],
        policy: Policy,
        usable: Callable[[Device], bool],
    ) -> dict[str | None, dict[int, tuple[Any, ...]]]:
        """Per node, per device whose free memory can hold some alternative alone: the
        smallest key of such a placement (a superset of the devices a search can pick).
        Walks every such device of the cluster."""
        alone: dict[str | None, dict[int, tuple[Any, ...]]] = {}
        for group, floor in shapes:
            at = bisect.bisect_left(group.ordered, (floor,))
            for entry in group.ordered[at:]:
                device = self.devices[entry[-1]]
                if not usable(device):
                    continue
                key = self._alone_key(policy, group, entry, floor)
                keys = alone.setdefault(device.node_name, {})
                old = keys.get(entry[-1])
                if old is None or key < old:
                    keys[entry[-1]] = key
        return alone

    def _node_alone_keys(
        self,
        node: str | None,
        shapes: Sequence[tuple[Group, Amount]],
        policy: Policy,
        usable: Callable[[Device], bool],
    ) -> list[tuple[Any, ...]]:
        """:meth:`_alone_keys` of one node: its devices' smallest alone keys."""
        keys: dict[int, tuple[Any, ...]] = {}
        for group, floor in shapes:
            for pos in group.by_node.get(node, ()):
                entry = group.current.get(pos)
                if entry is None or entry[0] < floor or not usable(self.devices[pos]):
                    continue
                key = self._alone_key(policy, group, entry, floor)
                old = keys.get(pos)
                if old is None or key < old:
                    keys[pos] = key
        return list(keys.values())

    def _ascending_alone_keys(
        self,
        shapes: Sequence[tuple[Group, Amount]],
        policy: Policy,
        usable: Callable[[Device], bool],
    ) -> Iterator[AloneKey]:
        """The alone keys of every usable device, ascending, read as far as the caller
        goes. Only for best fit and first fit: their keys ascend along a group's
        ``ordered`` (free memory less a constant floor first) and ``static`` (the key
        does not depend on use) lists; streams of several shapes are merged."""
        streams = [self._group_alone_keys(g, floor, policy, usable) for g, floor in shapes]
        return streams[0] if len(streams) == 1 else heapq.merge(*streams)

    def _group_alone_keys(
        self, group: Group, floor: Amount, policy: Policy, usable: Callable[[Device], bool]
    ) -> Iterator[AloneKey]:
        if policy is best_fit:
            ordered = group.ordered  # by index: the list is not changed during a search
            positions: Iterable[int] = (
                ordered[i][-1] for i in range(bisect.bisect_left(ordered, (floor,)), len(ordered))
            )
        else:
            positions = group.static
        for pos in positions:
            entry = group.current.get(pos)
            if entry is None or entry[0] < floor:
                continue
            device = self.devices[pos]
            if usable(device):
                yield self._alone_key(policy, group, entry, floor), pos, device.node_name

    def _candidates(
        self,
        node: str | None,
        matches: Sequence[tuple[ExactRequest, Match]],
        usable: Callable[[Device], bool],
    ) -> dict[str, list[Device]]:
        """Per alternative name: the usable matching devices of ``node``, in device order."""
        out: dict[str, list[Device]] = {}
        for alt, match in matches:
            if match.by_node is None:
                match.by_node = {}
                for pos in match.devices:
                    match.by_node.setdefault(self.devices[pos].node_name, []).append(pos)
            for pos in match.by_node.get(node, ()):
                device = self.devices[pos]
                if usable(device):
                    out.setdefault(alt.name, []).append(device)
        return out

    def _search_all(
        self,
        claim: Claim,
        matches: Sequence[tuple[ExactRequest, Match]],
        policy: Policy,
        usable: Callable[[Device], bool],
        budget: Budget | None = None,
    ) -> tuple[str | None, list[Pick]] | None:
        """Search every node (admin access, ``matchAttribute``): the smallest score wins."""
        by_node: dict[str | None, dict[str, list[Device]]] = {}
        for alt, match in matches:
            for pos in match.devices:
                device = self.devices[pos]
                if usable(device):
                    by_node.setdefault(device.node_name, {}).setdefault(alt.name, []).append(device)
        best: tuple[tuple[Any, ...], str | None, list[Pick]] | None = None
        for node, candidates in sorted(by_node.items(), key=lambda kv: kv[0] or ""):
            search = Search(claim, self.ledger, policy, candidates, self.pool_map, budget)
            slots = request_slots(claim, candidates)
            solved = slots is not None and solve(search, slots, 0)
            self.examined += search.examined
            if not solved:
                continue
            score = tuple(sorted(p.key for p in search.picks))
            if best is None or score < best[0]:
                best = (score, node, list(search.picks))
        return None if best is None else (best[1], best[2])
