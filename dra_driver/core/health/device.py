"""The health of one published device (pure): the record every health consumer reads.

:class:`~dra_driver.core.health.model.HealthModel` produces a :class:`DeviceHealth` per
published device; the kubelet's health stream, the claim-status reporting and
the ResourceSlice taints (:mod:`dra_driver.core.health.taints`) read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from dra_driver.base.ids import DeviceName, GpuUUID, MigUUID


class Status(enum.StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


@dataclass(frozen=True)
class DeviceHealth:
    """The health of one published device, as listeners, the kubelet and taints see it."""

    device_name: DeviceName
    gpu_uuid: GpuUUID
    status: Status
    reason: str = ""
    """A label value naming the worst problem (``xid-79``, ``gpu-lost``); empty when healthy."""
    message: str = ""
    """Every problem of the device and its GPU, worst first, each saying where it is."""
    since: float = 0.0
    """Unix seconds since the device has had this status and reason."""
    fatal: bool = False
    """The worst problem needs a GPU reset (or a reboot)."""
    mig_uuid: MigUUID | None = None
    """The MIG instance behind the device, when it exists now."""

    def same_state(self, other: DeviceHealth) -> bool:
        """Equal but for ``since``: whether a listener has anything new to hear."""
        return replace(self, since=0.0) == replace(other, since=0.0)
