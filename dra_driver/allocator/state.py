"""The incremental allocator: :class:`AllocatorState` parses slices, classes and the
ledger once, then allocates claim after claim and records what it allocates.

A claim of one device takes the single-device path (:meth:`AllocatorState._one`)
over the device index (:mod:`dra_driver.allocator.device_index`); any other claim
takes the node-by-node search (:mod:`dra_driver.allocator.node_search`). The state
also keeps the memory each namespace holds, for its VRAM quota.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator.capacity import effective_capacity
from dra_driver.allocator.cel import SelectorCache
from dra_driver.allocator.device_index import Group, Match, MatchKey, memory_floor
from dra_driver.allocator.explain import unfit_reason
from dra_driver.allocator.ledger import build_ledger
from dra_driver.allocator.model import (
    AllocatedResult,
    Claim,
    Device,
    DeviceClass,
    ExactRequest,
    allocated_results,
    gather_pools,
    parse_claim,
    parse_class,
)
from dra_driver.allocator.node_search import NodeSearch
from dra_driver.allocator.packing import Policy, best_fit, first_fit
from dra_driver.allocator.quota import VramQuota
from dra_driver.allocator.result import Allocation, AllocationOutcome, Result, build_outcome
from dra_driver.allocator.search import (
    Budget,
    Pick,
    Search,
    constraints_ok,
    index_of,
    place,
    requested_capacity,
)
from dra_driver.base.quantity import Amount
from dra_driver.core import claim_shape
from dra_driver.core.settings import Tenancy
from dra_driver.core.slices import TENANCY_ATTRIBUTE

ALLOCATOR_ATTRIBUTE = "allocator"
CONTROLLER = "controller"


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One controller-managed device's memory as the ledger sees it (one per device,
    kept by the metrics: slots, no per-object dict)."""

    node: str | None
    pool: str
    device: str
    total: int
    free: int
    """``total`` less its shares' memory; 0 while the device is held whole."""


class AllocatorState(NodeSearch):
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
        self._index = [index_of(d) for d in self.devices]
        self._matches: dict[MatchKey, Match] = {}
        self._groups_of: dict[int, list[Group]] = {}
        self.examined = 0
        """Devices checked for fit (placement computed), over all claims so far."""
        self.walked = 0
        """Alone keys computed to rank nodes for multi-device claims, over all claims."""
        self._held: dict[str, Amount] = {}
        self._tenants: dict[tuple[str, str, str], set[str]] = {}
        """Per device whose MPS daemon serves one namespace (``mpsTenancy: namespace``):
        the namespaces of the shares allocated on it."""
        for obj in claims:
            namespace = claim_shape.namespace(obj)
            for r in allocated_results(obj):
                if not r.admin_access:
                    key = (r.driver, r.pool, r.device)
                    self._charge(namespace, key, r.share_id, r.consumed)
                    self._note_tenant(namespace, key, r.share_id)

    def free_memory(self) -> list[DeviceMemory]:
        """Every controller-managed device's total and free memory, in device order.

        Per device: shares take their memory, a whole-device result takes all of it.
        Counters are not applied: a MIG partition whose parent GPU is taken shows
        its own memory as free.
        """
        out = []
        for device in self.devices:
            shareable, caps = effective_capacity(device)
            total = caps["memory"].value if "memory" in caps else 0
            use = self.ledger.use(device.key)
            held = use.exclusive or (not shareable and use.in_use)
            free = 0 if held else max(total - use.consumed.get("memory", 0), 0)
            out.append(
                DeviceMemory(device.node_name, device.pool, device.name, int(total), int(free))
            )
        return out

    def memory_held(self, namespace: str) -> Amount:
        """Memory the claims of ``namespace`` hold on controller-managed devices: shares
        their memory, whole devices all of theirs, admin access nothing."""
        return self._held.get(namespace, 0)

    def _note_tenant(self, namespace: str, key: tuple[str, str, str], share: str | None) -> None:
        pos = self._position.get(key)
        if share is not None and pos is not None and _one_namespace(self.devices[pos]):
            self._tenants.setdefault(key, set()).add(namespace)

    def _tenant_refuses(self, device: Device, namespace: str) -> str | None:
        """The namespace a one-namespace device serves, when it is not ``namespace``
        (asked for every candidate device of every claim: no set is built unless the
        device has tenants)."""
        served = self._tenants.get(device.key)
        if not served or served == {namespace}:
            return None
        return min(served - {namespace})

    def _charge(
        self,
        namespace: str,
        key: tuple[str, str, str],
        share_id: str | None,
        consumed: Mapping[str, Amount],
    ) -> None:
        pos = self._position.get(key)
        if pos is None:
            return  # not a controller-managed device of ours: not charged
        if share_id is not None:
            memory = consumed.get("memory", 0)
        else:
            caps = effective_capacity(self.devices[pos])[1]
            memory = caps["memory"].value if "memory" in caps else 0
        self._held[namespace] = self._held.get(namespace, 0) + memory

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

        verdicts: dict[str, bool] = {}
        kept_off: dict[tuple[str, str, str], str] = {}

        def usable(device: Device) -> bool:
            """``node_filter`` asked once per node per claim, not once per device; a
            device whose MPS daemon serves another namespace is not usable."""
            served = self._tenant_refuses(device, claim.namespace)
            if served is not None:
                kept_off[device.key] = served
                return False
            node = device.node_name
            if node is None or node_filter is None:
                return True
            found = verdicts.get(node)
            if found is None:
                found = verdicts[node] = node_filter(node)
            return found

        matches = self._matches_of(claim, usable)
        if isinstance(matches, AllocationOutcome):
            return matches
        budget = None
        if quota is not None:
            budget = Budget(quota, quota.limit - self.memory_held(claim.namespace))
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
            reason = self._unfit(claim, matches, usable, single=simple)
            if kept_off:
                reason += "; " + _tenancy_note(claim.namespace, kept_off)
            return AllocationOutcome(reason=reason, failure="unfit")
        allocation = build_outcome(
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
    ) -> list[tuple[ExactRequest, Match]] | AllocationOutcome:
        """Every alternative with its matching devices; the failure if a class is missing
        or a selector fails on a usable device."""
        matches: list[tuple[ExactRequest, Match]] = []
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

    def _unfit(
        self,
        claim: Claim,
        matches: list[tuple[ExactRequest, Match]],
        usable: Callable[[Device], bool],
        *,
        single: bool,
    ) -> str:
        alt = matches[0][0]
        return unfit_reason(
            claim,
            driver=self.driver_name,
            devices=self.devices,
            ledger=self.ledger,
            usable=usable,
            matching=sorted({i for _, match in matches for i in match.devices}),
            requested=requested_capacity(alt, claim, self.driver_name) if single else None,
        )

    def record_allocation(self, namespace: str, allocation: Allocation) -> None:
        """Add an allocation this state made with ``record=False`` (a caller that
        decides first and records when it commits to writing it)."""
        self._record(namespace, allocation.results)

    def record_claim(self, claim_obj: Mapping[str, Any]) -> None:
        """Add a claim allocated elsewhere (its ``status.allocation``) to the ledger."""
        self._record(claim_shape.namespace(claim_obj), allocated_results(claim_obj))

    def _record(self, namespace: str, results: Iterable[Result | AllocatedResult]) -> None:
        for r in results:
            if not r.admin_access:
                key = (r.driver, r.pool, r.device)
                self._add(key, r.share_id, r.consumed)
                self._charge(namespace, key, r.share_id, r.consumed)
                self._note_tenant(namespace, key, r.share_id)

    def _over_quota(self, claim: Claim, budget: Budget) -> AllocationOutcome:
        """The refusal: what the namespace holds and the least this claim would take."""
        asked = max(budget.blocked or 0, self._memory_floor(claim))
        used = self.memory_held(claim.namespace)
        return AllocationOutcome(
            reason=budget.quota.refusal(int(used), int(asked)), failure="quota"
        )

    def _memory_floor(self, claim: Claim) -> Amount:
        """Memory the claim takes at least, whatever devices it gets: per request the
        cheapest alternative's memory request times its count (rounding by a request
        policy, and whole devices, only add to it)."""
        total: Amount = 0
        for request in claim.requests:
            total += min(
                0
                if alt.admin_access
                else requested_capacity(alt, claim, self.driver_name).get("memory", 0)
                * (1 if alt.mode == "All" else alt.count)
                for alt in request.alternatives
            )
        return total

    def _add(
        self, key: tuple[str, str, str], share: str | None, consumed: Mapping[str, Amount]
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
        match: Match,
        policy: Policy,
        usable: Callable[[Device], bool],
        *,
        budget: Budget | None = None,
    ) -> Pick | None:
        """The best single-device placement, looking only at devices that could fit."""
        search = Search(claim, self.ledger, policy, {}, self.pool_map)
        requested = requested_capacity(alt, claim, self.driver_name)
        best: tuple[tuple[Any, ...], str, int, Pick] | None = None
        for group in self._groups(match):
            floor = memory_floor(group, alt, requested)
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
                pick = place(search, alt, device)
                if pick is None or not constraints_ok(search, pick):
                    continue
                if budget is not None and not budget.admits(pick.memory):
                    break  # a group's devices (one capacity signature) all charge the same
                rank = (pick.key, device.node_name or "", pos, pick)
                if best is None or rank[:3] < best[:3]:
                    best = rank
                if early:
                    break
        return None if best is None else best[3]


def _one_namespace(device: Device) -> bool:
    """The device's MPS daemon cannot keep tenants apart and serves one namespace."""
    return device.attributes.get(TENANCY_ATTRIBUTE) == Tenancy.NAMESPACE.value


def _tenancy_note(namespace: str, kept_off: Mapping[tuple[str, str, str], str]) -> str:
    """Why devices that might fit were not considered: the one-namespace rule."""
    names = sorted(
        f"{pool}/{device} (namespace {ns})" for (_, pool, device), ns in kept_off.items()
    )
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (
        f"{len(names)} device(s) kept off for namespace {namespace}: their MPS daemon "
        f"(legacy MPS) serves another namespace's claims and cannot keep tenants apart "
        f"(tenancy: namespace): {shown}; set tenancy: cooperative on a GPU whose tenants "
        "trust each other, or add GPUs"
    )
