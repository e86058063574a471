"""Allocate one claim, as the scheduler would, from slices, classes and the ledger.

Pure: no Kubernetes client, no I/O. The search runs per node (node-local pools),
request by request (``firstAvailable`` alternatives in order), with backtracking
within a step budget; among the nodes where the claim fits, the one whose
solution has the smallest packing key wins.

Within one claim a device is picked at most once unless a ``matchAttribute``
constraint covers both requests (so a ``count > 1`` share never lands twice on
one GPU unless asked).

An optional :class:`~dra_driver.allocator.quota.VramQuota` caps the memory the
claim's namespace holds on controller-managed devices: a placement that would
exceed it is not taken, and when every placement that fits would, the reason
names the namespace, the quota, the memory in use and the memory asked.
"""

from __future__ import annotations

import bisect
import heapq
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from dra_driver.allocator.capacity import effective_capacity, fits
from dra_driver.allocator.cel import CelError, SelectorCache, is_sentinel
from dra_driver.allocator.ledger import Ledger, build_ledger
from dra_driver.allocator.model import (
    AllocatedResult,
    Capacity,
    Claim,
    Device,
    DeviceClass,
    ExactRequest,
    Pool,
    allocated_results,
    gather_pools,
    parse_claim,
    parse_class,
)
from dra_driver.allocator.packing import Placement, Policy, best_fit, first_fit
from dra_driver.allocator.quota import VramQuota
from dra_driver.allocator.ranking import AloneKey, LazyNodes, NodeOrder, Ranked, SortedNodes
from dra_driver.api import GpuShare, GpuShareGrant, decode_config, encode_config
from dra_driver.core.quantity import format_bytes, format_count

ALLOCATOR_ATTRIBUTE = "allocator"
CONTROLLER = "controller"
SEARCH_BUDGET = 10_000
_BIG = 1 << 30


@dataclass(frozen=True)
class Result:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None
    consumed: Mapping[str, Fraction]
    admin_access: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "request": self.request,
            "driver": self.driver,
            "pool": self.pool,
            "device": self.device,
        }
        if self.admin_access:
            out["adminAccess"] = True
        if self.share_id is not None:
            out["shareID"] = self.share_id
            out["consumedCapacity"] = {k: _format(k, v) for k, v in self.consumed.items()}
        return out


def _format(key: str, value: Fraction) -> str:
    if value.denominator != 1:
        return f"{int(value * 1000)}m"
    return format_bytes(int(value)) if key == "memory" else format_count(int(value))


@dataclass(frozen=True)
class Allocation:
    node_name: str | None
    results: tuple[Result, ...]
    configs: tuple[Mapping[str, Any], ...]
    """``devices.config`` entries: class configs (FromClass), claim configs (FromClaim),
    then one ``GpuShareGrant`` per shared result (FromClaim)."""
    grants: tuple[GpuShareGrant, ...]

    def to_status(self, timestamp: str, *, keep_shares: bool = True) -> dict[str, Any]:
        """``status.allocation`` JSON; ``keep_shares=False`` drops shareID/consumedCapacity
        (clusters without consumable capacity)."""
        results = []
        for r in self.results:
            body = r.to_json()
            if not keep_shares:
                body.pop("shareID", None)
                body.pop("consumedCapacity", None)
            results.append(body)
        out: dict[str, Any] = {
            "devices": {"results": results, "config": [dict(c) for c in self.configs]},
            "allocationTimestamp": timestamp,
        }
        if self.node_name is not None:
            out["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [self.node_name]}
                        ]
                    }
                ]
            }
        return out


Failure = Literal["class-not-found", "selector-error", "quota", "unfit"]
"""Why a claim got no allocation (a metrics label): its class is missing, a CEL
selector failed on a candidate, the namespace's VRAM quota, or nothing fits."""


@dataclass(frozen=True)
class AllocationOutcome:
    allocation: Allocation | None = None
    reason: str | None = None
    failure: Failure | None = None
    """Set with ``reason``."""


@dataclass
class _Pick:
    request: ExactRequest
    device: Device
    share: bool
    consumed: dict[str, Fraction]
    key: tuple[Any, ...]
    memory: Fraction
    """What the pick charges the namespace's VRAM quota: a share its memory, a whole
    device all of it, admin access nothing."""


@dataclass
class _Budget:
    """The memory a claim may still take under its namespace's quota; ``blocked`` is
    the least memory of a placement refused for it (the amount a refusal names)."""

    quota: VramQuota
    left: Fraction
    blocked: Fraction | None = None

    def admits(self, memory: Fraction) -> bool:
        if memory <= self.left:
            return True
        if self.blocked is None or memory < self.blocked:
            self.blocked = memory
        return False


@dataclass
class _Search:
    claim: Claim
    ledger: Ledger
    policy: Policy
    candidates: Mapping[str, list[Device]]
    """Per alternative name: matching devices on this node."""
    pools: Mapping[tuple[str, str], Pool]
    budget: _Budget | None = None
    steps: int = 0
    picks: list[_Pick] = field(default_factory=list)
    examined: int = 0


def _index(device: Device) -> int:
    for name in ("index", "parentIndex"):
        value = device.attributes.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return _BIG


def _memory_floor(
    group: _Group, alt: ExactRequest, requested: Mapping[str, Fraction]
) -> Fraction | None:
    """Free memory a device of ``group`` needs to take ``alt`` alone; None: no device can
    (the request does not fit the group's capacities, or asks capacity of a plain one)."""
    if group.shareable:
        need = fits(requested, group.caps, {})
        if isinstance(need, str):
            return None
        return need.get("memory", Fraction(0))
    return None if alt.capacity_requests else Fraction(0)


def _requested(request: ExactRequest, claim: Claim, driver: str) -> dict[str, Fraction]:
    """``capacity.requests``, or (dropped by the API) the claim's ``GpuShare`` config."""
    if request.capacity_requests:
        return dict(request.capacity_requests)
    top = request.name.split("/")[0]
    share: GpuShare | None = None
    for config in claim.configs:
        opaque = config.get("opaque") or {}
        names = config.get("requests") or []
        if opaque.get("driver") != driver or (
            names and request.name not in names and top not in names
        ):
            continue
        try:
            obj = decode_config(opaque.get("parameters") or {}, driver)
        except Exception:
            continue
        if isinstance(obj, GpuShare):
            share = obj
    if share is None:
        return {}
    return {
        "memory": Fraction(share.memory_bytes),
        "computePercent": Fraction(share.compute_percent),
    }


def requested_size(claim_obj: Mapping[str, Any], driver_name: str) -> tuple[int, Fraction]:
    """How much a claim asks, to place a burst largest first: (devices it takes whole,
    memory its shares ask). Per request its first alternative (the one it prefers)
    times its count (``All``: once); a request that names no memory takes a whole
    device (a share's default is all of it), admin access nothing."""
    claim = parse_claim(claim_obj)
    whole, memory = 0, Fraction(0)
    for request in claim.requests:
        alt = request.alternatives[0]
        if alt.admin_access:
            continue
        count = 1 if alt.mode == "All" else alt.count
        asked = _requested(alt, claim, driver_name).get("memory")
        if asked is None:
            whole += count
        else:
            memory += asked * count
    return whole, memory


def _covers(constraint_requests: Sequence[str], name: str) -> bool:
    return (
        not constraint_requests
        or name in constraint_requests
        or (name.split("/", maxsplit=1)[0] in constraint_requests)
    )


def _constraints_ok(search: _Search, pick: _Pick) -> bool:
    name = pick.request.name
    for c in search.claim.constraints:
        if not _covers(c.requests, name):
            continue
        attr = c.match_attribute or c.distinct_attribute
        if attr is None:
            continue
        value = _attr(pick.device, attr)
        if value is None:
            return False
        others = [
            _attr(p.device, attr) for p in search.picks if _covers(c.requests, p.request.name)
        ]
        if c.match_attribute and any(o != value for o in others):
            return False
        if c.distinct_attribute and value in others:
            return False
    for p in search.picks:
        if p.device.key == pick.device.key and not _matched_pair(search.claim, p, pick):
            return False
    return True


def _matched_pair(claim: Claim, a: _Pick, b: _Pick) -> bool:
    return any(
        c.match_attribute
        and _covers(c.requests, a.request.name)
        and _covers(c.requests, b.request.name)
        for c in claim.constraints
    )


def _attr(device: Device, qualified: str) -> object:
    domain, _, ident = qualified.rpartition("/")
    if domain == device.driver and ident in device.attributes:
        return device.attributes[ident]
    return device.attributes.get(qualified)


def _place(search: _Search, request: ExactRequest, device: Device) -> _Pick | None:
    key = device.key
    use = search.ledger.use(key)
    pending = [p for p in search.picks if p.device.key == key]
    shareable, caps = effective_capacity(device)
    admin = request.admin_access
    if not admin and (use.exclusive or any(not p.share for p in pending)):
        return None
    if not shareable:
        if not admin and (use.in_use or pending or request.capacity_requests):
            return None
        consumed: dict[str, Fraction] = {}
    else:
        used = dict(use.consumed)
        for p in pending:
            for k, v in p.consumed.items():
                used[k] = used.get(k, Fraction(0)) + v
        result = fits(_requested(request, search.claim, device.driver), caps, used)
        if isinstance(result, str):
            return None
        consumed = result
    first = not use.in_use and not pending
    if first and not admin and not _counters_fit(search, device):
        return None
    total = caps["memory"].value if "memory" in caps else Fraction(0)
    if shareable:
        used_memory = use.consumed.get("memory", Fraction(0)) + sum(
            (p.consumed.get("memory", Fraction(0)) for p in pending), Fraction(0)
        )
        free = total - used_memory - consumed.get("memory", Fraction(0))
    else:
        free = Fraction(0)
    placement = Placement(device, free, use.shares + len(pending), _index(device), total)
    memory = consumed.get("memory", Fraction(0)) if shareable else total
    return _Pick(
        request,
        device,
        shareable and not admin,
        consumed,
        search.policy(placement),
        Fraction(0) if admin else memory,
    )


def _counters_fit(search: _Search, device: Device) -> bool:
    pool = search.pools.get((device.driver, device.pool))
    for counter_set, counters in device.consumes_counters:
        ckey = (device.driver, device.pool, counter_set)
        available = pool.counter_sets.get(counter_set, {}) if pool else {}
        used = dict(search.ledger.counters_used(ckey))
        for p in search.picks:
            first_pick = all(
                q.device.key != p.device.key for q in search.picks[: search.picks.index(p)]
            )
            if first_pick and not search.ledger.use(p.device.key).in_use:
                for cs, cnt in p.device.consumes_counters:
                    if cs == counter_set:
                        for n, v in cnt.items():
                            used[n] = used.get(n, Fraction(0)) + v
        for name, amount in counters.items():
            if name not in available or used.get(name, Fraction(0)) + amount > available[name]:
                return False
    return True


def _solve(search: _Search, slots: list[list[ExactRequest]], at: int) -> bool:
    """Fill ``slots[at:]``; each slot is the alternatives of one device pick."""
    if at == len(slots):
        return True
    search.steps += 1
    if search.steps > SEARCH_BUDGET:
        return False
    taken = sum((p.memory for p in search.picks), Fraction(0))
    for request in slots[at]:
        options = []
        for device in search.candidates.get(request.name, ()):
            search.examined += 1
            pick = _place(search, request, device)
            if pick is None or not _constraints_ok(search, pick):
                continue
            if search.budget is not None and not search.budget.admits(taken + pick.memory):
                continue
            options.append(pick)
        options.sort(key=lambda p: p.key)
        for pick in options:
            search.picks.append(pick)
            if _solve(search, slots, at + 1):
                return True
            search.picks.pop()
    return False


def allocate(
    claim_obj: Mapping[str, Any],
    *,
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]],
    node_filter: Callable[[str], bool] | None = None,
    driver_name: str,
    policy: Policy = best_fit,
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    cache: SelectorCache | None = None,
    quota: VramQuota | None = None,
) -> AllocationOutcome:
    """Allocate ``claim_obj`` (a ResourceClaim as JSON) or say why it cannot be.

    ``quota``: the VRAM quota of the claim's namespace, charged with what the
    namespace's ``allocated_claims`` hold (see :mod:`dra_driver.allocator.quota`).
    One-shot: builds a throwaway :class:`AllocatorState`. To allocate many claims
    against the same slices, build the state once and call its ``allocate``.
    """
    state = AllocatorState(
        slices=slices,
        classes=classes,
        allocated_claims=allocated_claims,
        driver_name=driver_name,
        cache=cache,
    )
    return state.allocate(
        claim_obj,
        node_filter=node_filter,
        policy=policy,
        share_id=share_id,
        record=False,
        quota=quota,
    )


@dataclass(frozen=True)
class DeviceMemory:
    """One controller-managed device's memory as the ledger sees it."""

    node: str | None
    pool: str
    device: str
    total: int
    free: int
    """``total`` less its shares' memory; 0 while the device is held whole."""


_MatchKey = tuple[str, tuple[str, ...], tuple[Any, ...]]
_Entry = tuple[Any, ...]
"""(free memory, shares, index, total memory, pool, name, position): best-fit order."""


@dataclass
class _Group:
    """The matching devices of one request shape that share one capacity signature."""

    shareable: bool
    caps: Mapping[str, Capacity]
    static: list[int]
    """Positions in first-fit order (pool, index, total memory, name)."""
    ordered: list[_Entry] = field(default_factory=list)
    """Available devices in best-fit order (free memory ascending)."""
    current: dict[int, _Entry] = field(default_factory=dict)
    """Position -> its entry in ``ordered``; absent while the device cannot take a share."""
    by_node: dict[str | None, list[int]] = field(default_factory=dict)
    """Node -> positions of its devices in the group (a node's alone keys, lazily)."""


@dataclass
class _Match:
    devices: list[int]
    """Positions of matching (tolerated) devices, in device order."""
    errors: list[tuple[int, CelError]]
    groups: list[_Group] | None = None
    by_node: dict[str | None, list[int]] | None = None
    """Node name -> positions of its matching devices, in device order."""


class AllocatorState:
    """Slices, classes and the ledger, parsed once; allocations update it incrementally.

    Per request shape (class, selectors, tolerations) the matching devices are found
    once (CEL evaluated once per device) and grouped by capacity signature; each group
    keeps its available devices sorted by free memory. A claim that needs one device
    (the common case) then looks only at devices whose free memory can hold it: a
    bisection and a walk to the first that fits for best fit, the first that fits in
    index order for first fit, all that could fit for any other policy. Other claims
    (several devices, ``All``, admin access, ``firstAvailable``) take the node-by-node
    search over the cached candidates; unless admin access or ``matchAttribute`` lets a
    device be picked twice, only nodes with enough devices that fit alone are searched,
    best lower bound first, stopping once no remaining node can beat the best found;
    for best fit and first fit those nodes are found along the same index, a few per
    claim rather than every device that fits (see :meth:`_search`). Allocations made
    here are recorded (``record``); claims allocated elsewhere are added with
    :meth:`record_claim`. Nothing is ever released: build a new state when claims are
    deallocated or slices change.

    The state also keeps, per namespace, the memory its claims hold on the
    controller-managed devices (:meth:`memory_held`), which a
    :class:`~dra_driver.allocator.quota.VramQuota` is checked against.
    """

    def __init__(
        self,
        *,
        slices: Iterable[Mapping[str, Any]],
        classes: Iterable[Mapping[str, Any]],
        allocated_claims: Iterable[Mapping[str, Any]],
        driver_name: str,
        cache: SelectorCache | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.cache = cache or SelectorCache()
        self.pools = gather_pools(slices)
        self.pool_map = {(p.driver, p.name): p for p in self.pools}
        self.class_map: dict[str, DeviceClass] = {}
        for obj in classes:
            dc = parse_class(obj)
            self.class_map[dc.name] = dc
        claims = list(allocated_claims)
        self.ledger = build_ledger(self.pools, claims)
        self.devices: list[Device] = [
            d
            for p in self.pools
            if p.driver == driver_name
            for d in p.devices
            if d.attributes.get(ALLOCATOR_ATTRIBUTE) == CONTROLLER
        ]
        self._position = {d.key: i for i, d in enumerate(self.devices)}
        self._index = [_index(d) for d in self.devices]
        self._matches: dict[_MatchKey, _Match] = {}
        self._groups_of: dict[int, list[_Group]] = {}
        self.examined = 0
        """Devices checked for fit (placement computed), over all claims so far."""
        self.walked = 0
        """Alone keys computed to rank nodes for multi-device claims, over all claims."""
        self._held: dict[str, Fraction] = {}
        for obj in claims:
            namespace = str((obj.get("metadata") or {}).get("namespace", ""))
            for r in allocated_results(obj):
                if not r.admin_access:
                    self._charge(namespace, (r.driver, r.pool, r.device), r.share_id, r.consumed)

    def free_memory(self) -> list[DeviceMemory]:
        """Every controller-managed device's total and free memory, in device order.

        Per device: shares take their memory, a whole-device result takes all of it.
        Counters are not applied: a MIG partition whose parent GPU is taken shows
        its own memory as free.
        """
        out = []
        for device in self.devices:
            shareable, caps = effective_capacity(device)
            total = caps["memory"].value if "memory" in caps else Fraction(0)
            use = self.ledger.use(device.key)
            if use.exclusive or (not shareable and use.in_use):
                free = Fraction(0)
            else:
                free = max(total - use.consumed.get("memory", Fraction(0)), Fraction(0))
            out.append(
                DeviceMemory(device.node_name, device.pool, device.name, int(total), int(free))
            )
        return out

    def memory_held(self, namespace: str) -> Fraction:
        """Memory the claims of ``namespace`` hold on controller-managed devices: shares
        their memory, whole devices all of theirs, admin access nothing."""
        return self._held.get(namespace, Fraction(0))

    def _charge(
        self,
        namespace: str,
        key: tuple[str, str, str],
        share_id: str | None,
        consumed: Mapping[str, Fraction],
    ) -> None:
        pos = self._position.get(key)
        if pos is None:
            return  # not a controller-managed device of ours: not charged
        if share_id is not None:
            memory = consumed.get("memory", Fraction(0))
        else:
            caps = effective_capacity(self.devices[pos])[1]
            memory = caps["memory"].value if "memory" in caps else Fraction(0)
        self._held[namespace] = self._held.get(namespace, Fraction(0)) + memory

    # --- matching -----------------------------------------------------------------

    def _match(self, alt: ExactRequest, found: DeviceClass) -> _Match:
        key: _MatchKey = (alt.device_class, alt.selectors, alt.tolerations)
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
            match = _Match(positions, errors)
            self._matches[key] = match
        return match

    def _groups(self, match: _Match) -> list[_Group]:
        if match.groups is None:
            by_sig: dict[Any, _Group] = {}
            for pos in match.devices:
                shareable, caps = effective_capacity(self.devices[pos])
                sig = (shareable, tuple(sorted(caps.items())))
                group = by_sig.get(sig)
                if group is None:
                    group = by_sig[sig] = _Group(shareable, caps, [])
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

    def _total(self, group: _Group) -> Fraction:
        return group.caps["memory"].value if "memory" in group.caps else Fraction(0)

    def _placement(self, group: _Group, pos: int) -> Placement:
        device = self.devices[pos]
        return Placement(device, Fraction(0), 0, self._index[pos], self._total(group))

    def _entry(self, group: _Group, pos: int) -> _Entry | None:
        device = self.devices[pos]
        use = self.ledger.use(device.key)
        if use.exclusive or (not group.shareable and use.in_use):
            return None
        total = self._total(group)
        free = total - use.consumed.get("memory", Fraction(0)) if group.shareable else Fraction(0)
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

    # --- allocation ---------------------------------------------------------------

    def allocate(
        self,
        claim_obj: Mapping[str, Any],
        *,
        node_filter: Callable[[str], bool] | None = None,
        policy: Policy = best_fit,
        share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        record: bool = True,
        quota: VramQuota | None = None,
    ) -> AllocationOutcome:
        """Allocate ``claim_obj``; with ``record`` the allocation is added to the ledger.

        ``quota`` (that of the claim's namespace) caps what the namespace holds,
        :meth:`memory_held`, plus what this claim takes."""
        claim = parse_claim(claim_obj)
        if quota is not None and quota.namespace != claim.namespace:
            raise ValueError(
                f"the VRAM quota of namespace {quota.namespace!r} was given for claim"
                f" {claim.namespace}/{claim.name}"
            )

        def usable(device: Device) -> bool:
            return device.node_name is None or node_filter is None or node_filter(device.node_name)

        matches = self._matches_of(claim, usable)
        if isinstance(matches, AllocationOutcome):
            return matches
        budget = None
        if quota is not None:
            budget = _Budget(quota, quota.limit - self.memory_held(claim.namespace))
            if not budget.admits(self._memory_floor(claim)):
                return self._over_quota(claim, budget)

        simple = (
            len(matches) == 1
            and len(claim.requests[0].alternatives) == 1
            and matches[0][0].mode != "All"
            and matches[0][0].count == 1
            and not matches[0][0].admin_access
        )
        if simple:
            alt, match = matches[0]
            picked = self._one(claim, alt, match, policy, usable, budget=budget)
            best = None if picked is None else (picked.device.node_name, [picked])
        else:
            best = self._search(claim, matches, policy, usable, budget)
        if best is None:
            if budget is not None and budget.blocked is not None:
                return self._over_quota(claim, budget)
            checked = sum(1 for d in self.devices if usable(d))
            return AllocationOutcome(
                reason=f"cannot allocate claim {claim.namespace}/{claim.name}: no node has"
                f" controller-managed devices that match and fit every request"
                f" ({checked} candidate device(s) checked)",
                failure="unfit",
            )
        allocation = _build(
            claim=claim,
            node=best[0],
            picks=best[1],
            class_map=self.class_map,
            driver=self.driver_name,
            share_id=share_id,
        )
        if record:
            self._record(claim.namespace, allocation.results)
        return AllocationOutcome(allocation=allocation)

    def _matches_of(
        self, claim: Claim, usable: Callable[[Device], bool]
    ) -> list[tuple[ExactRequest, _Match]] | AllocationOutcome:
        """Every alternative with its matching devices; the failure if a class is missing
        or a selector fails on a usable device."""
        matches: list[tuple[ExactRequest, _Match]] = []
        for request in claim.requests:
            for alt in request.alternatives:
                found = self.class_map.get(alt.device_class)
                if found is None:
                    return AllocationOutcome(
                        reason=f"request {alt.name}: device class {alt.device_class!r} not found",
                        failure="class-not-found",
                    )
                match = self._match(alt, found)
                for pos, error in match.errors:
                    if usable(self.devices[pos]):
                        return AllocationOutcome(reason=str(error), failure="selector-error")
                matches.append((alt, match))
        return matches

    def record_claim(self, claim_obj: Mapping[str, Any]) -> None:
        """Add a claim allocated elsewhere (its ``status.allocation``) to the ledger."""
        namespace = str((claim_obj.get("metadata") or {}).get("namespace", ""))
        self._record(namespace, allocated_results(claim_obj))

    def _record(self, namespace: str, results: Iterable[Result | AllocatedResult]) -> None:
        for r in results:
            if not r.admin_access:
                key = (r.driver, r.pool, r.device)
                self._add(key, r.share_id, r.consumed)
                self._charge(namespace, key, r.share_id, r.consumed)

    def _over_quota(self, claim: Claim, budget: _Budget) -> AllocationOutcome:
        """The refusal: what the namespace holds and the least this claim would take."""
        asked = max(budget.blocked or Fraction(0), self._memory_floor(claim))
        used = self.memory_held(claim.namespace)
        return AllocationOutcome(
            reason=budget.quota.refusal(int(used), int(asked)), failure="quota"
        )

    def _memory_floor(self, claim: Claim) -> Fraction:
        """Memory the claim takes at least, whatever devices it gets: per request the
        cheapest alternative's memory request times its count (rounding by a request
        policy, and whole devices, only add to it)."""
        total = Fraction(0)
        for request in claim.requests:
            total += min(
                Fraction(0)
                if alt.admin_access
                else _requested(alt, claim, self.driver_name).get("memory", Fraction(0))
                * (1 if alt.mode == "All" else alt.count)
                for alt in request.alternatives
            )
        return total

    def _add(
        self, key: tuple[str, str, str], share: str | None, consumed: Mapping[str, Fraction]
    ) -> None:
        driver, pool, name = key
        pos = self._position.get(key)
        device = self.devices[pos] if pos is not None else None
        if device is None:
            found = self.pool_map.get((driver, pool))
            device = next((d for d in found.devices if d.name == name), None) if found else None
        self.ledger.add(key, device, share, consumed)
        if pos is not None:
            self._refresh(pos)

    def _one(
        self,
        claim: Claim,
        alt: ExactRequest,
        match: _Match,
        policy: Policy,
        usable: Callable[[Device], bool],
        *,
        budget: _Budget | None = None,
    ) -> _Pick | None:
        """The best single-device placement, looking only at devices that could fit."""
        search = _Search(claim, self.ledger, policy, {}, self.pool_map)
        requested = _requested(alt, claim, self.driver_name)
        best: tuple[tuple[Any, ...], str, int, _Pick] | None = None
        for group in self._groups(match):
            floor = _memory_floor(group, alt, requested)
            if floor is None:
                continue
            if policy is first_fit:
                order: Iterable[int] = (
                    p
                    for p in group.static
                    if (e := group.current.get(p)) is not None and e[0] >= floor
                )
            else:  # by index: a slice would copy the group's whole tail per claim
                ordered = group.ordered
                at = bisect.bisect_left(ordered, (floor,))
                order = (ordered[i][-1] for i in range(at, len(ordered)))
            early = policy is first_fit or policy is best_fit
            for pos in order:
                device = self.devices[pos]
                if not usable(device):
                    continue
                self.examined += 1
                pick = _place(search, alt, device)
                if pick is None or not _constraints_ok(search, pick):
                    continue
                if budget is not None and not budget.admits(pick.memory):
                    break  # a group's devices (one capacity signature) all charge the same
                rank = (pick.key, device.node_name or "", pos, pick)
                if best is None or rank[:3] < best[:3]:
                    best = rank
                if early:
                    break
        return None if best is None else best[3]

    def _search(
        self,
        claim: Claim,
        matches: Sequence[tuple[ExactRequest, _Match]],
        policy: Policy,
        usable: Callable[[Device], bool],
        budget: _Budget | None = None,
    ) -> tuple[str | None, list[_Pick]] | None:
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
                slots = _slots(claim, candidates)
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
        best: tuple[tuple[Any, ...], str, str | None, list[_Pick]] | None = None
        while (ranked := order.next(None if best is None else best[0][0])) is not None:
            if best is not None and (ranked.bound, ranked.name) > (best[0], best[1]):
                break
            node = ranked.node
            found = ranked.candidates
            candidates = found if found is not None else self._candidates(node, matches, usable)
            search = _Search(claim, self.ledger, policy, candidates, self.pool_map, budget)
            slots = _slots(claim, candidates)
            solved = slots is not None and _solve(search, slots, 0)
            self.examined += search.examined
            if not solved:
                continue
            score = tuple(sorted(p.key for p in search.picks))
            if best is None or (score, ranked.name) < (best[0], best[1]):
                best = (score, ranked.name, node, list(search.picks))
        return None if best is None else (best[2], best[3])

    def _shapes(
        self, claim: Claim, matches: Sequence[tuple[ExactRequest, _Match]]
    ) -> list[tuple[_Group, Fraction]]:
        """Per alternative, per group of its matching devices that can take it alone:
        the group and the free memory a device needs for it."""
        shapes = []
        for alt, match in matches:
            requested = _requested(alt, claim, self.driver_name)
            for group in self._groups(match):
                floor = _memory_floor(group, alt, requested)
                if floor is not None:
                    shapes.append((group, floor))
        return shapes

    def _alone_key(
        self, policy: Policy, group: _Group, entry: _Entry, floor: Fraction
    ) -> tuple[Any, ...]:
        """The key of the device of ``entry`` taking a request of ``floor`` alone."""
        self.walked += 1
        free = entry[0] - floor if group.shareable else Fraction(0)
        return policy(Placement(self.devices[entry[-1]], free, entry[1], entry[2], entry[3]))

    def _alone_keys(
        self,
        shapes: Sequence[tuple[_Group, Fraction]],
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
        shapes: Sequence[tuple[_Group, Fraction]],
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
        shapes: Sequence[tuple[_Group, Fraction]],
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
        self, group: _Group, floor: Fraction, policy: Policy, usable: Callable[[Device], bool]
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
        matches: Sequence[tuple[ExactRequest, _Match]],
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
        matches: Sequence[tuple[ExactRequest, _Match]],
        policy: Policy,
        usable: Callable[[Device], bool],
        budget: _Budget | None = None,
    ) -> tuple[str | None, list[_Pick]] | None:
        """Search every node (admin access, ``matchAttribute``): the smallest score wins."""
        by_node: dict[str | None, dict[str, list[Device]]] = {}
        for alt, match in matches:
            for pos in match.devices:
                device = self.devices[pos]
                if usable(device):
                    by_node.setdefault(device.node_name, {}).setdefault(alt.name, []).append(device)
        best: tuple[tuple[Any, ...], str | None, list[_Pick]] | None = None
        for node, candidates in sorted(by_node.items(), key=lambda kv: kv[0] or ""):
            search = _Search(claim, self.ledger, policy, candidates, self.pool_map, budget)
            slots = _slots(claim, candidates)
            solved = slots is not None and _solve(search, slots, 0)
            self.examined += search.examined
            if not solved:
                continue
            score = tuple(sorted(p.key for p in search.picks))
            if best is None or score < best[0]:
                best = (score, node, list(search.picks))
        return None if best is None else (best[1], best[2])


def _slots(claim: Claim, candidates: Mapping[str, list[Device]]) -> list[list[ExactRequest]] | None:
    slots: list[list[ExactRequest]] = []
    for request in claim.requests:
        alts = list(request.alternatives)
        if len(alts) == 1:
            alt = alts[0]
            n = len(candidates.get(alt.name, ())) if alt.mode == "All" else alt.count
            if n == 0:
                return None
            slots.extend([[alt]] * n)
        # firstAvailable: every alternative with count 1 is one slot; otherwise take
        # the first alternative with enough candidates (a simplification).
        elif all(a.count == 1 and a.mode != "All" for a in alts):
            slots.append(alts)
        else:
            chosen = next((a for a in alts if len(candidates.get(a.name, ())) >= a.count), None)
            if chosen is None:
                return None
            slots.extend([[chosen]] * chosen.count)
    return slots


def _tolerated(request: ExactRequest, device: Device) -> bool:
    return all(
        taint.effect not in ("NoSchedule", "NoExecute")
        or any(t.tolerates(taint) for t in request.tolerations)
        for taint in device.taints
    )


def _build(
    *,
    claim: Claim,
    node: str | None,
    picks: list[_Pick],
    class_map: Mapping[str, DeviceClass],
    driver: str,
    share_id: Callable[[], str],
) -> Allocation:
    results = []
    grants = []
    configs: list[Mapping[str, Any]] = []
    for pick in picks:
        sid = share_id() if pick.share else None
        results.append(
            Result(
                pick.request.name,
                pick.device.driver,
                pick.device.pool,
                pick.device.name,
                sid,
                pick.consumed if pick.share else {},
                pick.request.admin_access,
            )
        )
        for config in class_map[pick.request.device_class].configs:
            configs.append({"source": "FromClass", "requests": [pick.request.name], **config})
        if sid is not None:
            grants.append(
                GpuShareGrant(
                    device=pick.device.name,
                    share_id=sid,
                    memory_bytes=int(pick.consumed.get("memory", 0)),
                    compute_percent=int(pick.consumed.get("computePercent", 0)),
                )
            )
    configs.extend({"source": "FromClaim", **c} for c in claim.configs)
    for result, grant in zip((r for r in results if r.share_id), grants, strict=True):
        configs.append(
            {
                "source": "FromClaim",
                "requests": [result.request],
                "opaque": {"driver": driver, "parameters": encode_config(grant, driver)},
            }
        )
    return Allocation(node, tuple(results), tuple(configs), tuple(grants))
