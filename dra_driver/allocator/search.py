"""One claim's backtracking search over one node's candidate devices.

Where a share goes: a request that names an amount (``capacity.requests``, or the
claim's ``GpuShare`` config where the API dropped those) is placed only on a
shareable device (``allowMultipleAllocations``, or its policy attributes before
1.36): an MPS or time-sliced GPU, an MPS-shared MIG instance. Never on an exclusive
GPU or a MIG partition, whatever their size: the controller serves the class of
shares, a whole device would hold far more than asked, and best fit would prefer it
(nothing is left free on it). The kube-scheduler's own rule differs (README, "Where a
share goes"): there an amount is a selector against a dedicated device's capacity.

What a request asks (:func:`requested_capacity`; :func:`requested_size` for a whole claim),
whether a device can take a request next to the picks made so far (:func:`place`:
exclusivity, capacity, counters; :func:`constraints_ok`: ``matchAttribute``,
``distinctAttribute`` and one pick per device), and :func:`solve`, which fills the
claim's slots (:func:`request_slots`) trying placements in packing-key order and
backtracking within :data:`SEARCH_BUDGET` steps. A namespace's VRAM quota enters as
a :class:`Budget`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocator.capacity import effective_capacity, fits
from dra_driver.allocator.ledger import Ledger
from dra_driver.allocator.model import Claim, Device, ExactRequest, Pool, parse_claim
from dra_driver.allocator.packing import Placement, Policy
from dra_driver.allocator.quota import VramQuota
from dra_driver.api import GpuShare, decode_config
from dra_driver.base.quantity import Amount

SEARCH_BUDGET = 10_000
_BIG = 1 << 30


@dataclass
class Pick:
    request: ExactRequest
    device: Device
    share: bool
    consumed: dict[str, Amount]
    key: tuple[Any, ...]
    memory: Amount
    """What the pick charges the namespace's VRAM quota: a share its memory, a whole
    device all of it, admin access nothing."""


@dataclass
class Budget:
    """The memory a claim may still take under its namespace's quota; ``blocked`` is
    the least memory of a placement refused for it (the amount a refusal names)."""

    quota: VramQuota
    left: Amount
    blocked: Amount | None = None

    def admits(self, memory: Amount) -> bool:
        if memory <= self.left:
            return True
        if self.blocked is None or memory < self.blocked:
            self.blocked = memory
        return False


@dataclass
class Search:
    claim: Claim
    ledger: Ledger
    policy: Policy
    candidates: Mapping[str, list[Device]]
    """Per alternative name: matching devices on this node."""
    pools: Mapping[tuple[str, str], Pool]
    budget: Budget | None = None
    steps: int = 0
    picks: list[Pick] = field(default_factory=list)
    examined: int = 0


def index_of(device: Device) -> int:
    for name in ("index", "parentIndex"):
        value = device.attributes.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return _BIG


def requested_capacity(request: ExactRequest, claim: Claim, driver: str) -> dict[str, Amount]:
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
        found = _share_in(opaque.get("parameters") or {}, driver)
        if found is not None:
            share = found
    if share is None:
        return {}
    return {
        "memory": share.memory_bytes,
        "computePercent": share.compute_percent,
    }


_SCALARS = (str, int, float, bool, type(None))


def _share_in(parameters: Mapping[str, Any], driver: str) -> GpuShare | None:
    """The ``GpuShare`` these opaque parameters decode to; None for anything else, or
    for parameters that do not decode (:func:`decide` names what is wrong with them).
    A flat object (every share is one) is decoded once per distinct value: a claim's
    size is asked for when a batch is ordered and again when it is allocated, and a
    burst has a handful of distinct shares."""
    if isinstance(parameters, Mapping) and all(
        isinstance(v, _SCALARS) for v in parameters.values()
    ):
        return _decoded_share(tuple(sorted(parameters.items())), driver)
    return _decoded_share_of(parameters, driver)


@functools.lru_cache(maxsize=256)
def _decoded_share(items: tuple[tuple[str, Any], ...], driver: str) -> GpuShare | None:
    return _decoded_share_of(dict(items), driver)


def _decoded_share_of(parameters: Any, driver: str) -> GpuShare | None:
    try:
        obj = decode_config(parameters, driver)
    except Exception:
        return None
    return obj if isinstance(obj, GpuShare) else None


def requested_size(claim_obj: Mapping[str, Any], driver_name: str) -> tuple[int, Amount]:
    """How much a claim asks, to place a burst largest first: (devices it takes whole,
    memory its shares ask). Per request its first alternative (the one it prefers)
    times its count (``All``: once); a request that names no memory takes a whole
    device (a share's default is all of it), admin access nothing."""
    claim = parse_claim(claim_obj)
    whole = 0
    memory_asked: Amount = 0
    for request in claim.requests:
        alt = request.alternatives[0]
        if alt.admin_access:
            continue
        count = 1 if alt.mode == "All" else alt.count
        asked = requested_capacity(alt, claim, driver_name).get("memory")
        if asked is None:
            whole += count
        else:
            memory_asked += asked * count
    return whole, memory_asked


def _covers(constraint_requests: Sequence[str], name: str) -> bool:
    return (
        not constraint_requests
        or name in constraint_requests
        or (name.split("/", maxsplit=1)[0] in constraint_requests)
    )


def constraints_ok(search: Search, pick: Pick) -> bool:
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


def _matched_pair(claim: Claim, a: Pick, b: Pick) -> bool:
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


def place(search: Search, request: ExactRequest, device: Device) -> Pick | None:
    key = device.key
    use = search.ledger.use(key)
    pending = [p for p in search.picks if p.device.key == key]
    shareable, caps = effective_capacity(device)
    admin = request.admin_access
    if not admin and (use.exclusive or any(not p.share for p in pending)):
        return None
    if not shareable:
        # A share (an amount asked by capacity.requests or, where the API dropped
        # those, by the claim's GpuShare) goes only to a shareable device: never to an
        # exclusive GPU or a MIG partition, however large (README "Where a share goes").
        asked = requested_capacity(request, search.claim, device.driver)
        if not admin and (use.in_use or pending or asked):
            return None
        consumed: dict[str, Amount] = {}
    else:
        used = dict(use.consumed)
        for p in pending:
            for k, v in p.consumed.items():
                used[k] = used.get(k, 0) + v
        result = fits(requested_capacity(request, search.claim, device.driver), caps, used)
        if isinstance(result, str):
            return None
        consumed = result
    first = not use.in_use and not pending
    if first and not admin and not _counters_fit(search, device):
        return None
    total = caps["memory"].value if "memory" in caps else 0
    if shareable:
        used_memory = use.consumed.get("memory", 0) + sum(
            (p.consumed.get("memory", 0) for p in pending), 0
        )
        free = total - used_memory - consumed.get("memory", 0)
    else:
        free = 0
    placement = Placement(device, free, use.shares + len(pending), index_of(device), total)
    memory = consumed.get("memory", 0) if shareable else total
    return Pick(
        request,
        device,
        shareable and not admin,
        consumed,
        search.policy(placement),
        0 if admin else memory,
    )


def _counters_fit(search: Search, device: Device) -> bool:
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
                            used[n] = used.get(n, 0) + v
        for name, amount in counters.items():
            if name not in available or used.get(name, 0) + amount > available[name]:
                return False
    return True


def solve(search: Search, slots: list[list[ExactRequest]], at: int) -> bool:
    """Fill ``slots[at:]``; each slot is the alternatives of one device pick."""
    if at == len(slots):
        return True
    search.steps += 1
    if search.steps > SEARCH_BUDGET:
        return False
    taken = sum((p.memory for p in search.picks), 0)
    for request in slots[at]:
        options = []
        for device in search.candidates.get(request.name, ()):
            search.examined += 1
            pick = place(search, request, device)
            if pick is None or not constraints_ok(search, pick):
                continue
            if search.budget is not None and not search.budget.admits(taken + pick.memory):
                continue
            options.append(pick)
        options.sort(key=lambda p: p.key)
        for pick in options:
            search.picks.append(pick)
            if solve(search, slots, at + 1):
                return True
            search.picks.pop()
    return False


def request_slots(
    claim: Claim, candidates: Mapping[str, list[Device]]
) -> list[list[ExactRequest]] | None:
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
