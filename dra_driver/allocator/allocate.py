"""Allocate one claim, as the scheduler would, from slices, classes and the ledger.

Pure: no Kubernetes client, no I/O. The search runs per node (node-local pools),
request by request (``firstAvailable`` alternatives in order), with backtracking
within a step budget; among the nodes where the claim fits, the one whose
solution has the smallest packing key wins.

Within one claim a device is picked at most once unless a ``matchAttribute``
constraint covers both requests (so a ``count > 1`` share never lands twice on
one GPU unless asked).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.allocator.capacity import effective_capacity, fits
from dra_driver.allocator.cel import CelError, SelectorCache, is_sentinel
from dra_driver.allocator.ledger import Ledger, build_ledger
from dra_driver.allocator.model import (
    Claim,
    Device,
    DeviceClass,
    ExactRequest,
    Pool,
    gather_pools,
    parse_claim,
    parse_class,
)
from dra_driver.allocator.packing import Placement, Policy, best_fit
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


@dataclass(frozen=True)
class AllocationOutcome:
    allocation: Allocation | None = None
    reason: str | None = None


@dataclass
class _Pick:
    request: ExactRequest
    device: Device
    share: bool
    consumed: dict[str, Fraction]
    key: tuple[Any, ...]


@dataclass
class _Search:
    claim: Claim
    ledger: Ledger
    policy: Policy
    candidates: Mapping[str, list[Device]]
    """Per alternative name: matching devices on this node."""
    pools: Mapping[tuple[str, str], Pool]
    steps: int = 0
    picks: list[_Pick] = field(default_factory=list)


def _index(device: Device) -> int:
    for name in ("index", "parentIndex"):
        value = device.attributes.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return _BIG


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
    return _Pick(request, device, shareable and not admin, consumed, search.policy(placement))


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
    for request in slots[at]:
        options = []
        for device in search.candidates.get(request.name, ()):
            pick = _place(search, request, device)
            if pick is not None and _constraints_ok(search, pick):
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
) -> AllocationOutcome:
    """Allocate ``claim_obj`` (a ResourceClaim as JSON) or say why it cannot be."""
    cache = cache or SelectorCache()
    claim = parse_claim(claim_obj)
    pools = gather_pools(slices)
    pool_map = {(p.driver, p.name): p for p in pools}
    class_map: dict[str, DeviceClass] = {}
    for obj in classes:
        dc = parse_class(obj)
        class_map[dc.name] = dc
    ledger = build_ledger(pools, allocated_claims)

    devices = [
        d
        for p in pools
        if p.driver == driver_name
        for d in p.devices
        if d.attributes.get(ALLOCATOR_ATTRIBUTE) == CONTROLLER
        and (d.node_name is None or node_filter is None or node_filter(d.node_name))
    ]
    by_node: dict[str | None, dict[str, list[Device]]] = {}
    try:
        for request in claim.requests:
            for alt in request.alternatives:
                found = class_map.get(alt.device_class)
                if found is None:
                    return AllocationOutcome(
                        reason=f"request {alt.name}: device class {alt.device_class!r} not found"
                    )
                selectors = [s for s in found.selectors if not is_sentinel(s, driver_name)]
                selectors += alt.selectors
                for device in devices:
                    if not _tolerated(alt, device):
                        continue
                    if all(cache.matches(s, device) for s in selectors):
                        by_node.setdefault(device.node_name, {}).setdefault(alt.name, []).append(
                            device
                        )
    except CelError as err:
        return AllocationOutcome(reason=str(err))

    best: tuple[tuple[Any, ...], str | None, list[_Pick]] | None = None
    for node, candidates in sorted(by_node.items(), key=lambda kv: kv[0] or ""):
        search = _Search(claim, ledger, policy, candidates, pool_map)
        slots = _slots(claim, candidates)
        if slots is None or not _solve(search, slots, 0):
            continue
        score = tuple(sorted(p.key for p in search.picks))
        if best is None or score < best[0]:
            best = (score, node, list(search.picks))
    if best is None:
        return AllocationOutcome(
            reason=f"cannot allocate claim {claim.namespace}/{claim.name}: no node has"
            f" controller-managed devices that match and fit every request"
            f" ({len(devices)} candidate device(s) checked)"
        )
    return AllocationOutcome(
        allocation=_build(
            claim=claim,
            node=best[1],
            picks=best[2],
            class_map=class_map,
            driver=driver_name,
            share_id=share_id,
        )
    )


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
