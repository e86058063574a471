"""Where each field of a ResourceClaim (``resource.k8s.io/v1``, as JSON) is, written once.

The node (:mod:`dra_driver.core.allocation`), the allocator and the controller read
claims through these functions, so that a claim's shape is known in one place. They
read the JSON as it is, without copying it into records: the controller keeps every
claim of the cluster and reads them on its hot path (``hack/bench/controller.py``).

Each function is strict about the shape of what it reads: a part that is there with
the wrong JSON type (``status`` a string, ``metadata.finalizers`` an object) raises
:class:`MalformedClaimError`, which names the claim and the field, instead of an
``AttributeError`` from deep inside a caller. A part that is absent reads as empty.
The identity (:func:`ref`) alone is lenient: it names the claim in those errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.base.errors import ClaimError
from dra_driver.base.ids import ClaimRef, ClaimUID

_EMPTY: Mapping[str, Any] = {}


class MalformedClaimError(ClaimError):
    """A field of a ResourceClaim's JSON has the wrong shape; names the claim and the field."""

    def __init__(self, claim: Mapping[str, Any], field: str, problem: str) -> None:
        super().__init__(
            ref(claim),
            f"malformed field {field}: {problem} (the claim does not follow the "
            "resource.k8s.io/v1 ResourceClaim schema; recreate it with that field fixed)",
        )
        self.field = field
        self.problem = problem


def _shape_error(
    claim: Mapping[str, Any], field: str, want: str, value: Any
) -> MalformedClaimError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return MalformedClaimError(claim, field, f"expected {want}, got {type(value).__name__} {shown}")


def _object(
    claim: Mapping[str, Any], parent: Mapping[str, Any], key: str, field: str
) -> Mapping[str, Any]:
    value = parent.get(key)
    if type(value) is dict:  # decoded JSON: the fast path (an ABC check costs more)
        return value
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise _shape_error(claim, field, "an object", value)
    return value


def _list(
    claim: Mapping[str, Any], parent: Mapping[str, Any], key: str, field: str
) -> Sequence[Any]:
    value = parent.get(key)
    if type(value) is list:
        return value
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise _shape_error(claim, field, "a list", value)
    return value


def _objects(
    claim: Mapping[str, Any], parent: Mapping[str, Any], key: str, field: str
) -> Sequence[Mapping[str, Any]]:
    items = _list(claim, parent, key, field)
    for i, item in enumerate(items):
        if type(item) is not dict and not isinstance(item, Mapping):
            raise _shape_error(claim, f"{field}[{i}]", "an object", item)
    return items


# The three parts are read on the controller's hot path (every claim, every change): the
# decoded-JSON case is answered here, without a further call.


def _metadata(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    value = claim.get("metadata")
    return value if type(value) is dict else _object(claim, claim, "metadata", "metadata")


def _status(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    value = claim.get("status")
    return value if type(value) is dict else _object(claim, claim, "status", "status")


def _spec_devices(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = claim.get("spec")
    if type(spec) is not dict:
        spec = _object(claim, claim, "spec", "spec")
    devices = spec.get("devices")
    return devices if type(devices) is dict else _object(claim, spec, "devices", "spec.devices")


# --- identity (metadata) ---------------------------------------------------------------


def ref(claim: Mapping[str, Any]) -> ClaimRef:
    """Namespace, name and UID; empty strings where absent or unreadable (lenient: this
    is what names the claim in every error)."""
    meta = claim.get("metadata") if isinstance(claim, Mapping) else None
    if not isinstance(meta, Mapping):
        meta = _EMPTY
    return ClaimRef(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=ClaimUID(str(meta.get("uid", ""))),
    )


def namespace(claim: Mapping[str, Any]) -> str:
    """``metadata.namespace``; empty when absent."""
    return str(_metadata(claim).get("namespace", ""))


def name(claim: Mapping[str, Any]) -> str:
    return str(_metadata(claim).get("name", ""))


def uid(claim: Mapping[str, Any]) -> str:
    """``metadata.uid``; empty when absent."""
    return str(_metadata(claim).get("uid", ""))


def key(obj: Mapping[str, Any]) -> str:
    """What the controller's caches know an object by (a claim, and every other kind they
    hold: the same ``metadata``): its UID, or ``namespace/name`` before it has one (an
    object built by a test)."""
    meta = _metadata(obj)
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def resource_version(obj: Mapping[str, Any]) -> int:
    """``metadata.resourceVersion`` as the integer the API server writes (etcd's revision),
    to order two copies of an object as client-go's assume cache does; 0 when absent,
    empty or not an integer (a version that cannot be ordered: never newer than any)."""
    version = _metadata(obj).get("resourceVersion")
    if not version:
        return 0
    try:
        return int(version)
    except (TypeError, ValueError):
        return 0


def creation_timestamp(claim: Mapping[str, Any]) -> str:
    return str(_metadata(claim).get("creationTimestamp") or "")


def is_deleting(claim: Mapping[str, Any]) -> bool:
    """``metadata.deletionTimestamp`` is set: the claim goes once its finalizers do."""
    return bool(_metadata(claim).get("deletionTimestamp"))


def finalizers(claim: Mapping[str, Any]) -> list[str]:
    """``metadata.finalizers``, a new list."""
    items = _list(claim, _metadata(claim), "finalizers", "metadata.finalizers")
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise _shape_error(claim, f"metadata.finalizers[{i}]", "a string", item)
    return list(items)


def metadata_annotations(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    """``metadata.annotations`` as stored (values are strings in the API)."""
    return _object(claim, _metadata(claim), "annotations", "metadata.annotations")


def owner_references(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """``metadata.ownerReferences`` (a template's claim names its pod here)."""
    return _objects(claim, _metadata(claim), "ownerReferences", "metadata.ownerReferences")


# --- status ----------------------------------------------------------------------------


def allocation(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.allocation``; ``None`` when the claim is not allocated."""
    status = _status(claim)
    found = status.get("allocation")
    if type(found) is not dict:
        found = _object(claim, status, "allocation", "status.allocation")
    return found or None


def is_allocated(claim: Mapping[str, Any]) -> bool:
    return allocation(claim) is not None


def allocation_devices(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    """``status.allocation.devices`` (empty when the claim is not allocated)."""
    found = allocation(claim)
    if found is None:
        return _EMPTY
    return _object(claim, found, "devices", "status.allocation.devices")


def allocation_results(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """``status.allocation.devices.results``: one entry per device given."""
    field = "status.allocation.devices.results"
    return _objects(claim, allocation_devices(claim), "results", field)


def allocation_configs(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """``status.allocation.devices.config``: the opaque configs copied at allocation
    (class and claim), and the controller's grants."""
    field = "status.allocation.devices.config"
    return _objects(claim, allocation_devices(claim), "config", field)


def node_selector(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    """``status.allocation.nodeSelector`` (empty when unallocated or not node-local)."""
    found = allocation(claim)
    if found is None:
        return _EMPTY
    return _object(claim, found, "nodeSelector", "status.allocation.nodeSelector")


def reserved_for(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """``status.reservedFor``: the consumers (pods) the scheduler reserved the claim for."""
    return _objects(claim, _status(claim), "reservedFor", "status.reservedFor")


def is_reserved(claim: Mapping[str, Any]) -> bool:
    return bool(reserved_for(claim))


def device_statuses(claim: Mapping[str, Any]) -> Sequence[Any]:
    """``status.devices``: what the drivers wrote about the devices they prepared (the
    entries as stored; each driver reads its own)."""
    return _list(claim, _status(claim), "devices", "status.devices")


# --- spec ------------------------------------------------------------------------------


def device_requests(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """``spec.devices.requests``, each an object (its inside is the allocator's to read)."""
    return _objects(claim, _spec_devices(claim), "requests", "spec.devices.requests")


def device_configs(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """``spec.devices.config``: the configs the user wrote."""
    return _objects(claim, _spec_devices(claim), "config", "spec.devices.config")


def device_constraints(claim: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return _objects(claim, _spec_devices(claim), "constraints", "spec.devices.constraints")


def requested_classes(claim: Mapping[str, Any]) -> list[str]:
    """The device class of each request's ``exactly`` and of each ``firstAvailable``
    alternative, in order (a request may name several). On the controller's hot path
    (every claim, every change): the field's name is spelled out only for an error."""
    classes: list[str] = []
    for i, request in enumerate(device_requests(claim)):
        exact = request.get("exactly")
        if type(exact) is dict or isinstance(exact, Mapping):
            if "deviceClassName" in exact:
                classes.append(str(exact["deviceClassName"]))
        elif exact is not None:
            raise _shape_error(claim, f"spec.devices.requests[{i}].exactly", "an object", exact)
        alternatives = request.get("firstAvailable")
        if alternatives is None:
            continue
        field = f"spec.devices.requests[{i}].firstAvailable"
        if not isinstance(alternatives, list | tuple):
            raise _shape_error(claim, field, "a list", alternatives)
        for j, alternative in enumerate(alternatives):
            if type(alternative) is not dict and not isinstance(alternative, Mapping):
                raise _shape_error(claim, f"{field}[{j}]", "an object", alternative)
            if "deviceClassName" in alternative:
                classes.append(str(alternative["deviceClassName"]))
    return classes
