r"""Typed, read-only views of the resource.k8s.io/v1 objects the allocator reads (JSON dicts in).

Only the highest generation of each pool counts; a pool whose slices at that
generation are fewer than ``resourceSliceCount`` is incomplete and skipped (as the
scheduler does).

Quantities are exact :data:`~dra_driver.base.quantity.Amount`\ s: ints where whole
(memory is bytes, counts and percentages are whole in every slice the driver
publishes), Fractions where not. A large cluster's devices repeat a few shapes, so
the state shares what repeats (:class:`_Shared`): one capacity mapping per distinct
published capacity, one object per attribute name and short string value. The tables
that find what repeats live for one :func:`gather_pools` pass (not ``sys.intern``:
what the state lets go of is freed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocator.k8s_rules import tolerates
from dra_driver.base.quantity import Amount, parse_amount
from dra_driver.core import claim_shape
from dra_driver.core.allocation import share_grant_for
from dra_driver.core.claim_shape import MalformedClaimError


@dataclass(frozen=True)
class SemVer:
    text: str


AttributeValue = int | bool | str | SemVer | tuple[Any, ...]


@dataclass(frozen=True)
class RequestPolicy:
    default: Amount | None = None
    valid_values: tuple[Amount, ...] | None = None
    min: Amount | None = None
    max: Amount | None = None
    step: Amount | None = None

    @property
    def has_range(self) -> bool:
        return self.min is not None


@dataclass(frozen=True)
class Capacity:
    value: Amount
    policy: RequestPolicy | None = None


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    generation: int
    name: str
    node_name: str | None
    """The node the device is usable on; ``None`` for non-node-local pools."""
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, Capacity]
    allow_multiple_allocations: bool = False
    consumes_counters: tuple[tuple[str, Mapping[str, Amount]], ...] = ()
    taints: tuple[Taint, ...] = ()
    node_selector: Mapping[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True)
class Pool:
    driver: str
    name: str
    generation: int
    devices: tuple[Device, ...]
    counter_sets: Mapping[str, Mapping[str, Amount]] = field(default_factory=dict)


def _attribute(raw: Mapping[str, Any]) -> AttributeValue:
    for kind in ("int", "bool", "string"):
        if kind in raw:
            value: AttributeValue = raw[kind]
            return value
    if "version" in raw:
        return SemVer(str(raw["version"]))
    for kind in ("ints", "bools", "strings"):
        if kind in raw:
            return tuple(raw[kind])
    if "versions" in raw:
        return tuple(SemVer(str(v)) for v in raw["versions"])
    raise ValueError(f"attribute {raw!r} has no value")


def _policy(raw: Mapping[str, Any] | None) -> RequestPolicy | None:
    if not raw:
        return None
    default = parse_amount(raw["default"]) if raw.get("default") is not None else None
    values = raw.get("validValues")
    valid_values = tuple(sorted(parse_amount(v) for v in values)) if values else None
    rng = raw.get("validRange") or {}

    def opt(name: str) -> Amount | None:
        return parse_amount(rng[name]) if rng.get(name) is not None else None

    return RequestPolicy(default, valid_values, opt("min"), opt("max"), opt("step"))


SHORT = 64
"""Attribute strings up to this long are shared (models, architectures, modes); longer
ones are seldom repeated."""


class _Shared:
    """What one :func:`gather_pools` pass shares between devices: the parsed capacity
    mappings (by their published JSON), names, attribute names, short strings and
    versions."""

    def __init__(self) -> None:
        self._capacities: dict[str, Mapping[str, Capacity]] = {}
        self._versions: dict[str, SemVer] = {}
        self._strings: dict[str, str] = {}

    def text(self, value: str) -> str:
        """One object per distinct string of this pass."""
        return self._strings.setdefault(value, value)

    def name(self, value: Any) -> Any:
        """A name shared with every other device's equal one (a string; else as it is)."""
        return self.text(value) if type(value) is str else value

    def capacity(self, raw: Mapping[str, Any] | None) -> Mapping[str, Capacity]:
        """The device's capacities; one (never mutated) mapping per distinct JSON."""
        if not raw:
            return {}
        key = json.dumps(raw, sort_keys=True, separators=(",", ":"))  # 1 is not true
        found = self._capacities.get(key)
        if found is None:
            found = self._capacities[key] = {
                self.text(k): Capacity(parse_amount(v["value"]), _policy(v.get("requestPolicy")))
                for k, v in raw.items()
            }
        return found

    def attributes(self, raw: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
        return {self.text(k): self._attribute(v) for k, v in (raw or {}).items()}

    def _attribute(self, raw: Mapping[str, Any]) -> AttributeValue:
        value = _attribute(raw)
        if isinstance(value, str):
            return self.text(value) if len(value) <= SHORT else value
        if isinstance(value, SemVer):  # one object per distinct version
            return self._versions.setdefault(value.text, value)
        return value


def _device(
    raw: Mapping[str, Any], spec: Mapping[str, Any], generation: int, shared: _Shared
) -> Device:
    body = raw.get("basic", raw)  # v1beta1 wrapped the fields in `basic`
    node = spec.get("nodeName") or body.get("nodeName")
    return Device(
        driver=shared.name(spec["driver"]),
        pool=shared.name(spec["pool"]["name"]),
        generation=generation,
        name=shared.name(raw["name"]),
        node_name=shared.name(node),
        attributes=shared.attributes(body.get("attributes")),
        capacity=shared.capacity(body.get("capacity")),
        allow_multiple_allocations=bool(body.get("allowMultipleAllocations")),
        consumes_counters=tuple(
            (c["counterSet"], {n: parse_amount(x["value"]) for n, x in c["counters"].items()})
            for c in body.get("consumesCounters") or ()
        ),
        taints=tuple(
            Taint(t["key"], t.get("value", ""), t["effect"]) for t in body.get("taints") or ()
        ),
        node_selector=spec.get("nodeSelector") or body.get("nodeSelector"),
    )


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec", obj)
    assert isinstance(spec, Mapping)
    return spec


@dataclass
class _PoolParts:
    """One pool's slices of its newest generation so far, parsed as they come."""

    generation: int
    slice_count: int
    """``resourceSliceCount`` of its first slice: fewer slices is an incomplete pool."""
    slices: int = 0
    devices: list[Device] = field(default_factory=list)
    counter_sets: dict[str, dict[str, Amount]] = field(default_factory=dict)


def gather_pools(slices: Iterable[Mapping[str, Any]]) -> list[Pool]:
    """Pools from ResourceSlice objects (or their ``spec``); newest complete generation only.

    One pass, each slice parsed as it comes and then let go, so that the slices of a
    large cluster need never all be decoded at once (the controller keeps them packed,
    :mod:`dra_driver.controller.cache`)."""
    parts: dict[tuple[str, str], _PoolParts] = {}
    shared = _Shared()
    for obj in slices:
        spec = _spec(obj)
        key = (spec["driver"], spec["pool"]["name"])
        generation = int(spec["pool"].get("generation", 0))
        held = parts.get(key)
        if held is None or generation > held.generation:
            held = parts[key] = _PoolParts(
                generation, int(spec["pool"].get("resourceSliceCount", 1))
            )
        elif generation < held.generation:
            continue
        held.slices += 1
        held.devices.extend(_device(d, spec, generation, shared) for d in spec.get("devices") or ())
        for cs in spec.get("sharedCounters") or ():
            held.counter_sets[cs["name"]] = {
                n: parse_amount(v["value"]) for n, v in cs["counters"].items()
            }
    return [
        Pool(driver, name, p.generation, tuple(p.devices), p.counter_sets)
        for (driver, name), p in sorted(parts.items())
        if p.slices >= p.slice_count  # else incomplete
    ]


# --- classes and claims ----------------------------------------------------------------


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]
    configs: tuple[Mapping[str, Any], ...]
    """``spec.config[]`` entries (``{opaque: {driver, parameters}}``)."""


def parse_class(obj: Mapping[str, Any]) -> DeviceClass:
    spec = obj.get("spec") or {}
    return DeviceClass(
        name=obj["metadata"]["name"],
        selectors=tuple(s["cel"]["expression"] for s in spec.get("selectors") or ()),
        configs=tuple(spec.get("config") or ()),
    )


@dataclass(frozen=True)
class Toleration:
    key: str | None
    operator: str
    value: str | None
    effect: str | None

    def tolerates(self, taint: Taint) -> bool:
        return tolerates(
            self.key,
            self.operator,
            self.value,
            self.effect,
            taint_key=taint.key,
            taint_value=taint.value,
            taint_effect=taint.effect,
        )


@dataclass(frozen=True)
class ExactRequest:
    """One request's device choice (``exactly`` or one ``firstAvailable`` entry)."""

    name: str
    """``main`` or ``main/sub``."""
    device_class: str
    selectors: tuple[str, ...]
    mode: str
    count: int
    admin_access: bool
    tolerations: tuple[Toleration, ...]
    capacity_requests: Mapping[str, Amount]


@dataclass(frozen=True)
class Request:
    name: str
    alternatives: tuple[ExactRequest, ...]
    """One entry for ``exactly``; the ``firstAvailable`` entries in order otherwise."""


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]
    match_attribute: str | None
    distinct_attribute: str | None


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...]
    configs: tuple[Mapping[str, Any], ...]


def _exact(name: str, raw: Mapping[str, Any], admin: bool) -> ExactRequest:
    return ExactRequest(
        name=name,
        device_class=raw["deviceClassName"],
        selectors=tuple(s["cel"]["expression"] for s in raw.get("selectors") or ()),
        mode=raw.get("allocationMode") or "ExactCount",
        count=int(raw.get("count") or 1),
        admin_access=admin and bool(raw.get("adminAccess")),
        tolerations=tuple(
            Toleration(t.get("key"), t.get("operator") or "Equal", t.get("value"), t.get("effect"))
            for t in raw.get("tolerations") or ()
        ),
        capacity_requests={
            k: parse_amount(v)
            for k, v in ((raw.get("capacity") or {}).get("requests") or {}).items()
        },
    )


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """The allocator's view of a claim's spec; :class:`MalformedClaimError` (naming the
    claim and the field) when the spec does not have the schema's shape."""
    requests = []
    for i, raw in enumerate(claim_shape.device_requests(obj)):
        try:
            requests.append(_request(raw))
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise MalformedClaimError(obj, f"spec.devices.requests[{i}]", repr(err)) from err
    constraints = tuple(
        Constraint(
            tuple(c.get("requests") or ()), c.get("matchAttribute"), c.get("distinctAttribute")
        )
        for c in claim_shape.device_constraints(obj)
    )
    return Claim(
        namespace=claim_shape.namespace(obj),
        name=claim_shape.name(obj),
        uid=claim_shape.uid(obj),
        requests=tuple(requests),
        constraints=constraints,
        configs=tuple(claim_shape.device_configs(obj)),
    )


def _request(raw: Mapping[str, Any]) -> Request:
    name = raw["name"]
    if raw.get("exactly") is not None:
        alternatives: tuple[ExactRequest, ...] = (_exact(name, raw["exactly"], True),)
    elif raw.get("firstAvailable"):
        alternatives = tuple(
            _exact(f"{name}/{sub['name']}", sub, False) for sub in raw["firstAvailable"]
        )
    else:  # v1beta1-style flat request
        alternatives = (_exact(name, raw, True),)
    return Request(name, alternatives)


@dataclass(frozen=True)
class AllocatedResult:
    request: str
    driver: str
    pool: str
    device: str
    share_id: str | None
    consumed: Mapping[str, Amount]
    admin_access: bool


def allocated_results(obj: Mapping[str, Any]) -> list[AllocatedResult]:
    """The results of a claim's ``status.allocation`` (empty if not allocated).

    On clusters whose API drops ``shareID`` and ``consumedCapacity`` (1.34,
    1.35) a share written by our controller is known by its ``GpuShareGrant``
    config: such a result is read as the share the grant says, not as the
    whole device (which is what a result without shareID otherwise means).
    """
    configs = claim_shape.allocation_configs(obj)
    results = []
    for i, raw in enumerate(claim_shape.allocation_results(obj)):
        try:
            results.append(_allocated_result(raw, configs))
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            field = f"status.allocation.devices.results[{i}]"
            raise MalformedClaimError(obj, field, repr(err)) from err
    return results


def _allocated_result(
    r: Mapping[str, Any], configs: Sequence[Mapping[str, Any]]
) -> AllocatedResult:
    share_id = r.get("shareID")
    consumed: dict[str, Amount] = {
        k: parse_amount(v) for k, v in (r.get("consumedCapacity") or {}).items()
    }
    if not share_id:
        grant = share_grant_for(configs, r)
        if grant is not None:
            share_id = grant.share_id
            consumed = consumed or {
                "memory": grant.memory_bytes,
                "computePercent": grant.compute_percent,
                "clients": 1,
            }
    return AllocatedResult(
        request=r.get("request", ""),
        driver=r["driver"],
        pool=r["pool"],
        device=r["device"],
        share_id=share_id or None,
        consumed=consumed,
        admin_access=bool(r.get("adminAccess")),
    )


def names(items: Sequence[ExactRequest]) -> list[str]:
    return [i.name for i in items]
