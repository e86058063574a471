"""Per-namespace VRAM quota of the controller path (pure).

A Namespace annotated ``<driver name>/vram-quota`` (``gpu.fractional.dev/vram-quota:
40Gi``) caps the GPU memory that the claims of that namespace hold on
controller-managed devices. The value is a memory quantity in bytes (``40Gi``,
``500G``, ``0``); no annotation means no cap.

What a namespace is charged (``AllocatorState.memory_held``): every allocated claim of the
namespace that the allocator is shown, result by result on the driver's
controller-managed devices: a share its consumed memory, a whole device (a result
without shareID) the device's memory, an ``adminAccess`` result nothing. The
controller shows the allocator every allocated claim it knows: those on the watch,
its own writes not yet seen there (its in-flight records), and claims being deleted
until their allocation is gone. A claim is refused when its memory (as it would be
consumed, after the request policy's rounding) added to what the namespace holds
exceeds the quota; the reason names the namespace, the quota, the memory used and
the memory asked.

Controller path only. The kube-scheduler allocates the claims of the native path
(the shared classes on 1.36+ clusters) itself and knows nothing of this
annotation, so those claims are neither capped nor charged: they land on
scheduler-managed GPUs, which the controller never allocates. A quota that must
hold for every claim of a namespace needs every claim of it on the controller
path (the controller-managed class); Kubernetes' own ResourceQuota can count
claims and devices per device class, but not GPU memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.base.errors import DriverError
from dra_driver.base.quantity import format_bytes, parse_quantity

QUOTA_SUFFIX = "vram-quota"
EXPECTED_FORMAT = "a memory quantity in bytes such as 40Gi, 81920Mi or 500G (0 allows nothing)"


class InvalidQuotaError(DriverError):
    """A Namespace's VRAM quota annotation is not a memory quantity; the message names
    the namespace, the annotation and the expected format."""

    def __init__(self, namespace: str, annotation: str, value: object, cause: str) -> None:
        super().__init__(
            f"namespace {namespace}: annotation {annotation}={value!r} is not a valid VRAM"
            f" quota ({cause}); expected {EXPECTED_FORMAT}, or remove the annotation"
        )
        self.namespace = namespace
        self.annotation = annotation


def quota_annotation(driver_name: str) -> str:
    """The Namespace annotation that holds the quota: ``<driver name>/vram-quota``."""
    return f"{driver_name}/{QUOTA_SUFFIX}"


@dataclass(frozen=True)
class VramQuota:
    """The VRAM cap of one namespace (input to the allocator)."""

    namespace: str
    limit: int
    """Bytes the namespace's claims may hold on controller-managed devices."""
    annotation: str
    """Where the quota came from (named in refusals)."""

    def refusal(self, used: int, asked: int) -> str:
        return (
            f"namespace {self.namespace}: VRAM quota {format_bytes(self.limit)}"
            f" (annotation {self.annotation}) exceeded: {format_bytes(used)} in use,"
            f" {format_bytes(asked)} asked, {format_bytes(max(self.limit - used, 0))} left"
        )


def parse_vram_quota(namespace: Mapping[str, Any] | None, driver_name: str) -> VramQuota | None:
    """The quota a Namespace object carries; ``None`` without the annotation (or without
    the Namespace). Raises :class:`InvalidQuotaError` for a malformed value."""
    if not namespace:
        return None
    meta = namespace.get("metadata") or {}
    name = str(meta.get("name", ""))
    annotation = quota_annotation(driver_name)
    raw = (meta.get("annotations") or {}).get(annotation)
    if raw is None:
        return None
    try:
        value = parse_quantity(raw)
    except ValueError as err:
        raise InvalidQuotaError(name, annotation, raw, str(err)) from err
    if value < 0:
        raise InvalidQuotaError(name, annotation, raw, "it is negative")
    if value.denominator != 1:
        raise InvalidQuotaError(name, annotation, raw, "it is not a whole number of bytes")
    return VramQuota(namespace=name, limit=int(value), annotation=annotation)
