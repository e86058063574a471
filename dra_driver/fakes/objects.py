"""Builders of realistic resource.k8s.io/v1 objects as the API server returns them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.base.ids import ClaimRef, ClaimUID


@dataclass(frozen=True)
class Allocated:
    """One allocation result to put in a claim."""

    device: str
    request: str = "gpu"
    pool: str | None = None
    """Defaults to the claim's node."""
    share_id: str | None = None
    admin_access: bool = False
    driver: str | None = None
    consumed_capacity: Mapping[str, str] | None = None


def share(
    device: str,
    *,
    memory: str = "1Gi",
    compute_percent: int = 0,
    share_id: str | None = None,
    request: str = "gpu",
) -> Allocated:
    """A consumable-capacity share as the scheduler writes it: a fresh shareID and
    ``consumedCapacity`` for every capacity the device has."""
    return Allocated(
        device,
        request=request,
        share_id=share_id or str(uuid.uuid4()),
        consumed_capacity={
            "memory": memory,
            "computePercent": str(compute_percent),
            "clients": "1",
        },
    )


def resource_claim(
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    node: str | None = "node-a",
    devices: Sequence[Allocated] = (Allocated("gpu-0"),),
    driver: str = "gpu.fractional.dev",
    device_class: str = "gpu.fractional.dev",
    allocated: bool = True,
    configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim as the API server stores it once the scheduler allocated it.

    With ``allocated`` it carries ``status.allocation``: one result per
    :class:`Allocated`, a nodeSelector pinning it to ``node`` (matchFields on
    ``metadata.name``, as for node-local pools), a ``reservedFor`` pod, and each
    of ``configs`` as opaque ``FromClaim`` parameters for ``driver`` (also in
    the spec, where the user wrote them).
    """
    requests = sorted({d.request.split("/", 1)[0] for d in devices} or {"gpu"})
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": uid or str(uuid.uuid4()),
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": device_class}} for r in requests
                ]
            }
        },
        "status": {},
    }
    opaque = [
        {"requests": requests, "opaque": {"driver": driver, "parameters": dict(params)}}
        for params in configs
    ]
    if opaque:
        obj["spec"]["devices"]["config"] = opaque
    if allocated and devices:
        results = []
        for d in devices:
            result: dict[str, Any] = {
                "request": d.request,
                "driver": d.driver or driver,
                "pool": d.pool or node or "",
                "device": d.device,
            }
            if d.share_id:
                result["shareID"] = d.share_id
            if d.admin_access:
                result["adminAccess"] = True
            if d.consumed_capacity:
                result["consumedCapacity"] = dict(d.consumed_capacity)
            results.append(result)
        allocation: dict[str, Any] = {"devices": {"results": results}}
        if opaque:
            allocation["devices"]["config"] = [{"source": "FromClaim", **c} for c in opaque]
        if node:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        obj["status"]["allocation"] = allocation
        obj["status"]["reservedFor"] = [
            {"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}
        ]
    return obj


def node_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A minimal core/v1 Node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
    }


def claim_ref(obj: Mapping[str, Any]) -> ClaimRef:
    """The reference the kubelet sends for a claim object."""
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], ClaimUID(meta["uid"]))
