"""Builders for realistic ``resource.k8s.io/v1`` ResourceClaim JSON.

The shape follows what the API server stores after the scheduler allocated a
claim: ``spec.devices.requests[].exactly`` as the user wrote it, and
``status.allocation`` with device results, opaque configs and a nodeSelector
pinning the claim to one node (matchFields on ``metadata.name``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

DRIVER = "gpu.fractional.dev"
DEVICE_CLASS = "gpu.fractional.dev"
REQUEST = "gpu"


def make_claim(
    namespace: str = "default",
    name: str = "claim",
    uid: str | None = None,
    *,
    node: str = "node-1",
    devices: Sequence[str] = ("gpu-0",),
    driver: str = DRIVER,
    share_ids: Sequence[str | None] | None = None,
    allocated: bool = True,
    request: str = REQUEST,
    device_class: str = DEVICE_CLASS,
    consumed_capacity: Mapping[str, str] | None = None,
    configs: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ResourceClaim requesting ``len(devices)`` devices of ``device_class``.

    With ``allocated`` it carries ``status.allocation``: one result per entry
    of ``devices`` (pool = ``node``), ``share_ids[i]`` as that result's
    ``shareID`` when given, ``consumed_capacity`` on every result (and as the
    request's capacity), and ``configs`` as opaque ``FromClaim`` parameters
    for ``driver``. ``uid`` defaults to a fresh UUID.
    """
    if share_ids is not None and len(share_ids) != len(devices):
        raise ValueError("share_ids must have one entry per device")
    exactly: dict[str, Any] = {
        "deviceClassName": device_class,
        "allocationMode": "ExactCount",
        "count": len(devices),
    }
    if consumed_capacity:
        exactly["capacity"] = {"requests": dict(consumed_capacity)}
    opaque = [
        {"requests": [request], "opaque": {"driver": driver, "parameters": dict(params)}}
        for params in configs
    ]
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": request, "exactly": exactly}]}},
    }
    if opaque:
        claim["spec"]["devices"]["config"] = opaque
    if not allocated:
        return claim
    results = []
    for index, device in enumerate(devices):
        result: dict[str, Any] = {
            "request": request,
            "driver": driver,
            "pool": node,
            "device": device,
        }
        if share_ids is not None and share_ids[index]:
            result["shareID"] = share_ids[index]
        if consumed_capacity:
            result["consumedCapacity"] = dict(consumed_capacity)
        results.append(result)
    devices_status: dict[str, Any] = {"results": results}
    if opaque:
        devices_status["config"] = [{"source": "FromClaim", **c} for c in opaque]
    claim["status"] = {
        "allocation": {
            "devices": devices_status,
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    return claim


def make_node(name: str = "node-1", labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A minimal core/v1 Node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
    }
