"""Distinct identifier types, so a claim UID is never passed where a device name goes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NewType

ClaimUID = NewType("ClaimUID", str)
"""metadata.uid of a ResourceClaim."""

DeviceName = NewType("DeviceName", str)
"""A device's name within its pool, e.g. ``gpu-0``."""

PoolName = NewType("PoolName", str)
"""A ResourceSlice pool name; for our node-local pools, the node name."""

GpuUUID = NewType("GpuUUID", str)
"""NVML's GPU UUID, e.g. ``GPU-5ed1b7c8-...``."""

MigUUID = NewType("MigUUID", str)
"""A MIG device's UUID, e.g. ``MIG-2d7f...``."""


@dataclass(frozen=True, order=True)
class ClaimRef:
    """What the kubelet sends for a claim: namespace, name and UID."""

    namespace: str
    name: str
    uid: ClaimUID

    def __str__(self) -> str:
        # The one log format for a claim across the project: ns/name:uid.
        return f"{self.namespace}/{self.name}:{self.uid}"
