"""What to do with one claim (pure :func:`decide`) and doing it (I/O :func:`apply`).

:func:`decide` sees the claim, the pods and nodes from the caches and the
controller's :class:`ClusterView` (slices, classes, allocated claims with our
answers laid over them, :mod:`.inflight`) and returns one :class:`Decision`. Only claims
whose requests use the controller-managed class are ours.

:func:`apply` writes as the scheduler does: first the
``resource.kubernetes.io/delete-protection`` finalizer, then ``status.allocation``
(on ``/status``), each a JSON merge patch of only what changes, guarded by the
resourceVersion it read (optimistic concurrency: a 409 surfaces as
``ApiConflictError`` and the caller re-reads and decides again). Never a PUT:
a PUT resends the spec, and the API server compares the spec's opaque
parameters with the bytes the user sent.

Two writes, not one: the API server's status strategy resets the metadata of a
``/status`` write to the stored one (``ResetObjectMetaForStatus``: finalizers,
labels, annotations, owners), and its main-resource strategy keeps the stored
status, so no request carries both (kubernetes ``pkg/registry/resource/resourceclaim/
strategy.go``); the scheduler's PreBind also sends two (an Update, then an
UpdateStatus). A claim that its pod owns (made from the pod's ResourceClaimTemplate)
is reserved for that pod in the allocation's write (:func:`owning_pod`): the
scheduler's PreBind skips a claim already reserved for the pod it binds
(``resourceclaim.IsReservedForPod``), so it writes nothing for it. A claim that
several pods name (``resourceClaimName``) is left to the scheduler to reserve, pod
by pod as it binds them, as on the native path: reserving it ahead for every
pending pod would hold it for pods that may never be scheduled. Either way the
scheduler's PostFilter still clears an allocation that no node can use, since it
does so when ``reservedFor`` is empty or holds only the pod it schedules.

The VRAM quota of the claim's namespace (its ``<driver name>/vram-quota``
annotation, :mod:`dra_driver.allocator.quota`) is handed to the allocator; a
malformed annotation fails that namespace's claims with an Event that names the
namespace, the annotation and the expected format, and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dra_driver.allocator import (
    Allocation,
    AllocationOutcome,
    AllocatorState,
    InvalidQuotaError,
    VramQuota,
    best_fit,
    parse_vram_quota,
    requested_size,
    why_node_unfit,
)
from dra_driver.base.quantity import Amount
from dra_driver.controller.claim_index import pod_uses
from dra_driver.core import claim_shape
from dra_driver.core.claim_shape import MalformedClaimError

JsonObj = dict[str, Any]

CONTROLLER_CLASS = "share.gpu.fractional.dev"
FINALIZER = "resource.kubernetes.io/delete-protection"
REJECTED_ANNOTATION = "share.gpu.fractional.dev/rejected-nodes"
"""Comma-separated nodes where the scheduler could not run the claim's pod."""
GRANT_KIND = "GpuShareGrant"


# --- decisions -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ignore:
    """Not ours, or nothing to do."""

    reason: str


@dataclass(frozen=True)
class Wait:
    """Ours but not ready (no unscheduled pod yet); an Event only when ``event``."""

    reason: str
    event: bool = False
    cause: str = ""
    """With ``event``: why nothing was allocated, as a metrics label (the allocator's
    :data:`~dra_driver.allocator.Failure`, or ``invalid-quota``)."""


@dataclass(frozen=True)
class Refuse:
    """Ours but never to be allocated as written (e.g. a forged grant): Warning Event."""

    reason: str
    cause: str = "refused"


@dataclass(frozen=True)
class PodConsumer:
    """A pod as an entry of ``status.reservedFor`` (the API server requires resource,
    name and uid; the core group is the empty ``apiGroup``, left out as the scheduler
    leaves it out)."""

    name: str
    uid: str

    def to_json(self) -> JsonObj:
        return {"resource": "pods", "name": self.name, "uid": self.uid}


@dataclass(frozen=True)
class Allocate:
    allocation: Allocation
    node: str | None
    reserve_for: PodConsumer | None = None
    """The pod the allocation's write also reserves the claim for: the one pod that owns
    it (:func:`owning_pod`); None for a claim other pods may share (the scheduler
    reserves it for each pod it binds)."""


@dataclass(frozen=True)
class RecordRejected:
    """The scheduler cleared our allocation on ``node``: remember it, allocate elsewhere."""

    node: str


@dataclass(frozen=True)
class Deallocate:
    """Allocated, never reserved, no live pod: clear the allocation and our finalizer."""

    clear_status: bool = True


Decision = Ignore | Wait | Refuse | Allocate | RecordRejected | Deallocate


@dataclass
class ClusterView:
    """What :func:`decide` may read besides the claim, pods and nodes."""

    driver_name: str
    state: AllocatorState
    """The allocator's state of the slices, classes and allocated claims (the
    informer's, with our assumed writes laid over), kept by the caller across claims
    (:mod:`~dra_driver.controller.ledger_cache`): asked without recording, so the
    caller records what it goes on to write."""
    written: Mapping[str, str] = field(default_factory=dict)
    """Claim UID -> node of allocations this controller wrote and has not taken back."""
    share_id: Callable[[], str] | None = None
    namespaces: Mapping[str, JsonObj] = field(default_factory=dict)
    """Namespace objects by name (their VRAM quota annotation)."""


def is_ours(claim: Mapping[str, Any]) -> bool:
    """A request of the claim names the controller-managed class. A claim whose requests
    cannot be read counts as ours: :func:`decide` refuses it with an Event that names
    the field (the change handlers call this for every claim and must not fail)."""
    try:
        return CONTROLLER_CLASS in claim_shape.requested_classes(claim)
    except MalformedClaimError:
        return True


def forged_grant(claim: Mapping[str, Any], driver_name: str) -> bool:
    for config in claim_shape.device_configs(claim):
        opaque = config.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if opaque.get("driver") == driver_name and params.get("kind") == GRANT_KIND:
            return True
    return False


def owning_pod(claim: Mapping[str, Any], pods: Iterable[JsonObj]) -> PodConsumer | None:
    """The pod among ``pods`` that controls ``claim``: the claim's ownerReference with
    ``controller: true`` names it (kind Pod, its uid). The controller manager makes
    such a claim from that pod's ResourceClaimTemplate, and the scheduler and the
    kubelet let no other pod use it (``resourceclaim.IsForPod``), so reserving it for
    that pod together with its allocation is what the scheduler's PreBind would write
    next, one write earlier."""
    owner = next(
        (
            o
            for o in claim_shape.owner_references(claim)
            if o.get("controller") is True and o.get("kind") == "Pod"
        ),
        None,
    )
    if owner is None:
        return None
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("uid") == owner.get("uid"):  # as metav1.IsControlledBy compares
            return PodConsumer(str(meta["name"]), str(meta["uid"]))
    return None


def pod_is_live(pod: Mapping[str, Any]) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def rejected_nodes(claim: Mapping[str, Any]) -> list[str]:
    raw = claim_shape.metadata_annotations(claim).get(REJECTED_ANNOTATION, "")
    return [n for n in str(raw).split(",") if n]


def placement_key(
    uid: str,
    claim: JsonObj | None,
    driver_name: str,
    size: Callable[[JsonObj], tuple[int, Amount]] | None = None,
) -> tuple[Any, ...]:
    """Where a claim goes in :func:`placement_order`; its first three items are its size
    (:func:`size_rank`): ``size(claim)``, by default :func:`requested_size`."""
    if claim is None or not is_ours(claim):
        return (0,)
    try:
        if claim_shape.is_allocated(claim) or claim_shape.is_deleting(claim):
            return (0,)
        created = claim_shape.creation_timestamp(claim)
    except MalformedClaimError:  # decide() says what is wrong
        return (0,)
    try:
        whole, memory = requested_size(claim, driver_name) if size is None else size(claim)
    except (MalformedClaimError, KeyError, TypeError, ValueError):  # as above
        whole, memory = 0, Fraction(0)
    return (1, -whole, -memory, created, uid)


def size_rank(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """The part of a :func:`placement_key` that claims of the same size share."""
    return key[:3]


def placement_order(batch: Sequence[tuple[str, JsonObj | None]], driver_name: str) -> list[str]:
    """The order the worker starts claims in (claim UID, the claim or None): its heap
    of :func:`placement_key` yields them so.

    Claims that wait for no allocation come first, in queue order: a deallocation
    frees memory for the rest, and the others are quick. Then the claims to allocate,
    largest first (:func:`~dra_driver.allocator.requested_size`: more whole devices,
    then more memory); ties: created earlier, then by UID. Best fit on a burst placed
    largest first packs tighter than in arrival order (``hack/bench/packing.py``).
    """
    return [
        uid
        for uid, _ in sorted(batch, key=lambda item: placement_key(item[0], item[1], driver_name))
    ]


# --- decide (pure) ---------------------------------------------------------------------


def decide(
    claim: JsonObj,
    pods: Iterable[JsonObj],
    nodes: Mapping[str, JsonObj],
    view: ClusterView,
) -> Decision:
    """The one next step for ``claim``; ``nodes`` by name. Deterministic given
    ``view.share_id``. A claim that does not have the schema's shape is refused with
    a Warning Event naming the field, and the controller goes on with the others."""
    try:
        return _decide(claim, pods, nodes, view)
    except MalformedClaimError as err:
        return Refuse(f"not allocated: {err}")


def _decide(  # noqa: PLR0911 (one return per decision)
    claim: JsonObj,
    pods: Iterable[JsonObj],
    nodes: Mapping[str, JsonObj],
    view: ClusterView,
) -> Decision:
    if not is_ours(claim):
        return Ignore("not a claim of the controller-managed class")
    uid = claim_shape.uid(claim)
    allocated = claim_shape.is_allocated(claim)
    reserved = claim_shape.is_reserved(claim)
    finalizers = claim_shape.finalizers(claim)
    if claim_shape.is_deleting(claim):
        if not allocated and FINALIZER in finalizers:
            return Deallocate(clear_status=False)
        return Ignore("being deleted")
    users = [p for p in pods if pod_uses(p, claim) and pod_is_live(p)]
    if allocated:
        if not reserved and not users:
            return Deallocate()
        return Ignore("allocated")
    if uid in view.written:
        return RecordRejected(view.written[uid])
    if forged_grant(claim, view.driver_name):
        return Refuse(
            f"the claim's config carries a {GRANT_KIND}; grants are written only by the "
            "controller, so this claim is not allocated (remove that config entry)"
        )
    pending = [p for p in users if not (p.get("spec") or {}).get("nodeName")]
    if not pending:
        return Wait("no unscheduled pod references the claim yet")
    try:
        namespace = view.namespaces.get(claim_shape.namespace(claim))
        quota = parse_vram_quota(namespace, view.driver_name)
    except InvalidQuotaError as err:
        return Wait(f"claim not allocated: {err}", event=True, cause="invalid-quota")
    rejected = set(rejected_nodes(claim))
    excluded: dict[str, str] = {}

    def node_filter(name: str) -> bool:
        node = nodes.get(name)
        why = (
            "no such Node"
            if node is None
            else "rejected by the scheduler"
            if name in rejected
            else next((w for p in pending if (w := why_node_unfit(node, p))), None)
        )
        if why is not None:
            excluded[name] = why
        return why is None

    outcome = _allocate(claim, view, node_filter, quota)
    if outcome.allocation is None:
        why = outcome.reason or "nothing fits"
        if excluded:
            why += (
                " (nodes left out: "
                + "; ".join(f"{name}: {reason}" for name, reason in sorted(excluded.items()))
                + ")"
            )
        return Wait(why, event=True, cause=outcome.failure or "unfit")
    return Allocate(
        outcome.allocation, outcome.allocation.node_name, reserve_for=owning_pod(claim, pending)
    )


def _allocate(
    claim: JsonObj,
    view: ClusterView,
    node_filter: Callable[[str], bool],
    quota: VramQuota | None,
) -> AllocationOutcome:
    """The allocator's answer for ``claim`` from the caller's state, not recorded."""
    ids = {"share_id": view.share_id} if view.share_id is not None else {}
    return view.state.allocate(
        claim, node_filter=node_filter, policy=best_fit, record=False, quota=quota, **ids
    )


# --- writing (pure builders) -----------------------------------------------------------


def _guarded(claim: JsonObj, **metadata: Any) -> JsonObj:
    """The metadata of a patch: ``metadata`` plus the resourceVersion the claim was read at,
    so the write is refused (409) if anyone changed the claim since."""
    version = claim_shape.resource_version(claim)
    return {**({"resourceVersion": str(version)} if version else {}), **metadata}


def finalizer_patch(claim: JsonObj) -> JsonObj | None:
    """A merge patch adding our finalizer; ``None`` when it is already there.

    A patch, never a PUT of the claim: a PUT resends the spec, whose opaque
    parameters the API server compares byte for byte with what the user sent.
    """
    finalizers = claim_shape.finalizers(claim)
    if FINALIZER in finalizers:
        return None
    return {"metadata": _guarded(claim, finalizers=[*finalizers, FINALIZER])}


def finalizer_removal_patch(claim: JsonObj) -> JsonObj | None:
    finalizers = claim_shape.finalizers(claim)
    if FINALIZER not in finalizers:
        return None
    return {"metadata": _guarded(claim, finalizers=[f for f in finalizers if f != FINALIZER])}


def rejected_patch(claim: JsonObj, node: str) -> JsonObj:
    nodes = rejected_nodes(claim)
    if node not in nodes:
        nodes.append(node)
    return {"metadata": _guarded(claim, annotations={REJECTED_ANNOTATION: ",".join(nodes)})}


def allocation_patch(
    claim: JsonObj,
    allocation: Allocation,
    timestamp: str,
    *,
    keep_shares: bool,
    reserve_for: PodConsumer | None = None,
) -> JsonObj:
    """A merge patch of ``/status`` writing ``status.allocation`` and, with
    ``reserve_for``, ``status.reservedFor`` = that pod, in one request, as the
    scheduler's PreBind writes its allocation and reservation together. The claim is
    unallocated when this is built, so it has no reservation a merge patch's list
    would replace (the API server refuses ``reservedFor`` without an allocation), and
    the resourceVersion guard refuses the write if that changed meanwhile."""
    body = allocation.to_status(timestamp, keep_shares=keep_shares)
    status: JsonObj = {"allocation": body}
    if reserve_for is not None:
        status["reservedFor"] = [reserve_for.to_json()]
    return {"metadata": _guarded(claim), "status": status}


def deallocation_patch(claim: JsonObj) -> JsonObj:
    """A merge patch of ``/status`` clearing the allocation and what depends on it."""
    cleared = {"allocation": None, "devices": None, "reservedFor": None}
    return {"metadata": _guarded(claim), "status": cleared}


def describe_allocation(allocation: Allocation) -> str:
    parts = []
    for r in allocation.results:
        amount = ", ".join(f"{k} {v}" for k, v in r.to_json().get("consumedCapacity", {}).items())
        parts.append(f"{r.request} -> {r.pool}/{r.device}" + (f" ({amount})" if amount else ""))
    where = f"node {allocation.node_name}" if allocation.node_name else "no node constraint"
    return f"allocated on {where}: " + "; ".join(parts)
