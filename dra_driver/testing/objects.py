"""Builders of realistic resource.k8s.io/v1 objects as the API server returns them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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


def resource_claim(
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    node: str | None = "node-a",
    devices: Sequence[Allocated] = (),
    driver: str = "gpu.fractional.dev",
    device_class: str = "gpu.fractional.dev",
    allocated: bool = True,
) -> dict[str, Any]:
    """A ResourceClaim; allocated (with a node-pinned nodeSelector) when ``devices`` are given."""
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
            results.append(result)
        allocation: dict[str, Any] = {"devices": {"results": results}}
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
