"""Raw ResourceClaim JSON (resource.k8s.io/v1) → :mod:`dra_driver.core.model`.

Pure: takes the dict the API server returns (or a test writes) and builds our
frozen model. Lenient about fields it does not use, strict about the shape of
the ones it does: a malformed allocation becomes a :class:`ClaimError` for
that claim, never an exception that escapes the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_driver.base.errors import ClaimError
from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName, PoolName
from dra_driver.core.model import DeviceResult, OpaqueConfig, ResourceClaim


def claim_ref_from_dict(obj: Mapping[str, Any]) -> ClaimRef:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        meta = {}
    return ClaimRef(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=ClaimUID(str(meta.get("uid", ""))),
    )


def claim_from_dict(obj: Mapping[str, Any]) -> ResourceClaim:
    """Convert a ResourceClaim object (as JSON) to :class:`ResourceClaim`."""
    ref = claim_ref_from_dict(obj)
    annotations = _annotations(obj)
    try:
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            return ResourceClaim(ref=ref, allocated=False, annotations=annotations)
        devices = allocation.get("devices") or {}
        results = tuple(_result(r) for r in devices.get("results") or ())
        configs = tuple(_config(c) for c in devices.get("config") or ())
        node_names = _node_names(allocation.get("nodeSelector"))
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ClaimError(ref, f"malformed status.allocation: {err!r}") from err
    return ResourceClaim(
        ref=ref,
        allocated=True,
        results=results,
        configs=configs,
        node_names=node_names,
        annotations=annotations,
    )


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata")
    raw = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def _result(raw: Mapping[str, Any]) -> DeviceResult:
    for key in ("request", "driver", "pool", "device"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ValueError(f"allocation result without a {key!r}: {dict(raw)}")
    consumed = raw.get("consumedCapacity") or {}
    return DeviceResult(
        request=raw["request"],
        driver=raw["driver"],
        pool=PoolName(raw["pool"]),
        device=DeviceName(raw["device"]),
        share_id=_optional_str(raw.get("shareID"), "shareID"),
        admin_access=bool(raw.get("adminAccess") or False),
        consumed_capacity={str(k): str(v) for k, v in consumed.items()},
    )


def _optional_str(value: Any, key: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, not {value!r}")
    return value


def _config(raw: Mapping[str, Any]) -> OpaqueConfig:
    opaque = raw.get("opaque") or {}
    return OpaqueConfig(
        source=str(raw.get("source", "")),
        requests=tuple(str(r) for r in raw.get("requests") or ()),
        driver=str(opaque.get("driver", "")),
        parameters=dict(opaque.get("parameters") or {}),
    )


def _node_names(selector: Mapping[str, Any] | None) -> frozenset[str]:
    """Node names a node-local allocation is pinned to.

    The scheduler pins node-local allocations with a matchFields term on
    ``metadata.name``; other selector shapes (labels) name no node here.
    """
    names: set[str] = set()
    for term in (selector or {}).get("nodeSelectorTerms") or ():
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                names.update(str(v) for v in field.get("values") or ())
    return frozenset(names)
