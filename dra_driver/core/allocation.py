"""The one reader of a ResourceClaim's ``status.allocation`` (raw JSON, pure).

* :func:`claim_from_dict` builds the node's :class:`~dra_driver.core.model.ResourceClaim`:
  the results (``request``, ``driver``, ``pool``, ``device``, ``shareID``,
  ``adminAccess``, ``consumedCapacity``), the opaque configs and the node the
  allocation is pinned to. Lenient about fields it does not use, strict about
  the shape of the ones it does: a malformed allocation becomes a
  :class:`ClaimError` for that claim, never an exception that escapes the request.
* :func:`share_grant_for` is the ``GpuShareGrant`` fallback the controller's
  allocator reads a share by on clusters whose API drops ``shareID`` and
  ``consumedCapacity`` (1.34, 1.35); it reads results into its own exact numbers
  (:func:`dra_driver.allocator.model.allocated_results`).

Where each part of the claim is, and its shape, is :mod:`dra_driver.core.claim_shape`'s;
this module reads the inside of each result and config.

Which configs the node trusts for a result (and so whether a result without
``shareID`` is a share) is :func:`dra_driver.core.prepare.effective_config`'s
rule, applied to the configs read here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.api.decode import decode_config
from dra_driver.api.types import GpuShareGrant
from dra_driver.base.errors import ClaimError, DriverError
from dra_driver.base.ids import DeviceName, PoolName
from dra_driver.core import claim_shape
from dra_driver.core.claim_shape import MalformedClaimError
from dra_driver.core.model import DeviceResult, OpaqueConfig, ResourceClaim


def claim_from_dict(obj: Mapping[str, Any]) -> ResourceClaim:
    """Convert a ResourceClaim object (as JSON) to :class:`ResourceClaim`."""
    ref = claim_shape.ref(obj)
    annotations = {str(k): str(v) for k, v in claim_shape.metadata_annotations(obj).items()}
    try:
        if not claim_shape.is_allocated(obj):
            return ResourceClaim(ref=ref, allocated=False, annotations=annotations)
        results = tuple(_result(r) for r in claim_shape.allocation_results(obj))
        configs = tuple(_config(c) for c in claim_shape.allocation_configs(obj))
        node_names = _node_names(claim_shape.node_selector(obj))
    except MalformedClaimError as err:  # the node's error for it, the field named
        raise ClaimError(ref, f"malformed status.allocation: {err.field}: {err.problem}") from err
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


def share_grant_for(
    configs: Sequence[Mapping[str, Any]], result: Mapping[str, Any]
) -> GpuShareGrant | None:
    """The controller's grant for raw result ``result`` (a share the API dropped the
    ``shareID`` of): a ``GpuShareGrant`` entry of ``configs`` (the allocation's raw
    ``devices.config``) from ``FromClaim``, of the result's driver, for a request of
    the same main request (or for all), decoding cleanly, for the same device; the
    first such entry. The controller's reading; the node trusts grants by
    :func:`dra_driver.core.prepare.effective_config`'s stricter rules."""
    for config in configs:
        opaque = config.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if (
            config.get("source") != "FromClaim"
            or opaque.get("driver") != result.get("driver")
            or params.get("kind") != "GpuShareGrant"
        ):
            continue
        requests = config.get("requests") or ()
        if requests and str(result.get("request", "")).split("/")[0] not in {
            str(q).split("/")[0] for q in requests
        }:
            continue
        try:
            grant = decode_config(params, str(result.get("driver")))
        except DriverError:
            continue
        if isinstance(grant, GpuShareGrant) and grant.device == result.get("device"):
            return grant
    return None
