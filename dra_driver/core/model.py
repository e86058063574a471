"""The driver's own view of the objects it works with.

These are frozen dataclasses built at the adapters (``k8s/convert.py`` for
ResourceClaims, ``gpu/`` for inventory), so the pure core never sees the
untyped official client's models or raw JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.core.ids import ClaimRef, DeviceName, GpuUUID, PoolName


@dataclass(frozen=True)
class DeviceResult:
    """One entry of ``status.allocation.devices.results``."""

    request: str
    """The request name; ``main/sub`` for a firstAvailable sub-request."""
    driver: str
    pool: PoolName
    device: DeviceName
    share_id: str | None = None
    """Set when the device was allocated as a share (consumable capacity)."""
    admin_access: bool = False
    consumed_capacity: Mapping[str, str] = field(default_factory=dict)
    """Capacity name → quantity string, as the allocator wrote it."""

    @property
    def main_request(self) -> str:
        """The request name the kubelet matches containers against (sub-request stripped)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True)
class OpaqueConfig:
    """One entry of ``status.allocation.devices.config``."""

    source: str
    """``FromClass`` or ``FromClaim``."""
    requests: tuple[str, ...]
    """Requests it applies to; empty means all."""
    driver: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True)
class ResourceClaim:
    """A ResourceClaim as the node plugin needs it."""

    ref: ClaimRef
    allocated: bool
    results: tuple[DeviceResult, ...] = ()
    configs: tuple[OpaqueConfig, ...] = ()
    node_names: frozenset[str] = frozenset()
    """Node names the allocation's nodeSelector pins it to (matchFields
    metadata.name); empty when the selector names no node."""


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as discovered by a :class:`GpuBackend`."""

    index: int
    uuid: GpuUUID
    product_name: str
    memory_bytes: int
    minor: int
    """Minor number of ``/dev/nvidia<minor>``."""

    @property
    def device_name(self) -> DeviceName:
        """Name of the device we publish for this GPU in the ResourceSlice."""
        return DeviceName(f"gpu-{self.index}")

    @property
    def device_node(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class Inventory:
    """Everything discovered on one node."""

    gpus: tuple[GpuInfo, ...]

    def gpu_by_device(self, name: str) -> GpuInfo | None:
        for gpu in self.gpus:
            if gpu.device_name == name:
                return gpu
        return None
