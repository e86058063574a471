"""The driver's own view of the objects it works with.

These are frozen dataclasses built from the API's JSON (``core/allocation.py`` for
ResourceClaims) and at the adapters (``gpu/`` for inventory), so the rest of the
core never sees the untyped official client's models or raw JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.base.ids import ClaimRef, DeviceName, GpuUUID, MigUUID, PoolName


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
    annotations: Mapping[str, str] = field(default_factory=dict)
    """``metadata.annotations`` (the disruption guard's opt-in)."""


@dataclass(frozen=True)
class MigPlacement:
    """Where a GPU instance sits, in memory-slice units (NVML placement)."""

    start: int
    size: int

    def overlaps(self, other: MigPlacement) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile as NVML reports it (``nvmlDeviceGetGpuInstanceProfileInfo``)."""

    id: int
    """NVML's profile id (``info.id``), as ``nvidia-smi mig -lgip`` prints it."""
    name: str
    """e.g. ``1g.10gb`` or ``1g.10gb+me``."""
    compute_slices: int
    """``info.sliceCount``: compute slices (of 7 on A100/Hopper)."""
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[MigPlacement, ...]
    """Every placement NVML reports possible on an empty GPU."""

    @property
    def memory_slices(self) -> int:
        """Memory slices one instance takes (the placements' size)."""
        return self.placements[0].size if self.placements else 0


@dataclass(frozen=True)
class MigDevice:
    """A MIG device that exists on the GPU now (created before we started, or by us)."""

    uuid: MigUUID
    gi_id: int
    ci_id: int
    profile_id: int
    profile_name: str
    placement: MigPlacement
    memory_mib: int


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as discovered by a :class:`GpuBackend`.

    Versions are as NVML reports them ("580.65.06", "9.0"); the slice builder
    normalises them to semver.
    """

    index: int
    uuid: GpuUUID
    product_name: str
    memory_bytes: int
    minor: int
    """Minor number of ``/dev/nvidia<minor>``."""
    architecture: str = ""
    """Lower case: ``ampere``, ``hopper``, ``ada``, ``blackwell``."""
    cuda_compute_capability: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""
    pci_bus_id: str = ""
    """Domain:bus:device.function, lower case, e.g. ``0000:3b:00.0``."""
    mig_capable: bool = False
    mig_enabled: bool = False
    """MIG mode now in effect."""
    mig_pending: bool = False
    """MIG mode after the next GPU reset (differs from ``mig_enabled`` until then)."""
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_devices: tuple[MigDevice, ...] = ()

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


@dataclass(frozen=True)
class HealthEvent:
    """Something the GPU reported about its health (an NVML XID event)."""

    gpu_uuid: GpuUUID
    xid: int
    message: str = ""
    mig_uuid: MigUUID | None = None
    """Set when NVML attributes the event to one MIG device."""
