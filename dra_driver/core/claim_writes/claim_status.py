"""The ``status.devices`` entries this driver reports on a prepared claim (pure).

One entry per prepared device (per share: two shares of one GPU are two
entries), keyed as the API keys the list: ``driver``, ``pool``, ``device`` and,
for a share, ``shareID`` (the key must match the allocation result's). Each
entry carries:

* ``conditions``: ``Ready`` (True once prepared; the convention the API names)
  and ``DeviceHealthy`` (True, False or Unknown, from the health monitor;
  Unknown until it has reported on the device);
* ``data``: what the node enforces for the claim, as a small versioned object
  (``<driver>/v1alpha1``, kind ``DeviceStatus``): the mode, the GPU, the memory
  limit and SM percentage of an MPS share, the MIG device and profile, the share
  id and the CDI device ids.

Nothing here reads a clock: timestamps come in as arguments, so one device's
``lastTransitionTime`` stays put when its entry is written again.
:func:`check_entry` applies the API server's validation rules for an entry; the
builder's output always passes it.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.api.types import API_VERSION
from dra_driver.base.names import dns_label
from dra_driver.base.quantity import format_bytes
from dra_driver.core.prepare.devices import (
    Admin,
    Exclusive,
    MigInstance,
    MpsInMig,
    MpsLimits,
    MpsShare,
    PlannedDevice,
    TimeSliced,
    limits_of,
    mig_of,
)

READY = "Ready"
DEVICE_HEALTHY = "DeviceHealthy"
DATA_KIND = "DeviceStatus"

DATA_LIMIT_BYTES = 10 * 1024
"""``data`` (a RawExtension) may hold at most 10 KiB."""
CONDITIONS_LIMIT = 8
MESSAGE_LIMIT = 1024
"""Ours; the API allows 32768 characters in a condition message."""
REASON_LIMIT = 1024
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_STAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_CONDITION_STATUSES = ("True", "False", "Unknown")

DeviceKey = tuple[str, str, str, str]
"""(driver, pool, device, shareID or "")"""


class HealthStatus(enum.StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"

    @classmethod
    def parse(cls, text: str) -> HealthStatus:
        """``Healthy``/``Unhealthy``/``Unknown`` (any case); anything else is Unknown."""
        for status in cls:
            if status.value.lower() == text.strip().lower():
                return status
        return cls.UNKNOWN


@dataclass(frozen=True)
class HealthSnapshot:
    """A device's health as last reported, and since when."""

    status: HealthStatus
    reason: str
    """CamelCase, e.g. ``XidError``; made valid by :func:`condition_reason`."""
    message: str = ""
    since: str = ""
    """RFC 3339 time the status began (the condition's lastTransitionTime)."""


def condition_reason(text: str, default: str) -> str:
    """``text`` as a valid condition reason (CamelCase letters, digits, ``_,:``)."""
    words = re.split(r"[^A-Za-z0-9_,:]+", text.strip())
    joined = "".join(w[:1].upper() + w[1:] for w in words if w).lstrip("0123456789_,:")
    joined = joined.rstrip(",:")[:REASON_LIMIT]
    return joined if _REASON.match(joined) else default


def condition(
    type_: str,
    status: str,
    reason: str,
    message: str,
    *,
    since: str,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """A ``metav1.Condition``."""
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "lastTransitionTime": since,
    }
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    return cond


def ready_message(device: PlannedDevice) -> str:
    """What the claim got on this device, in words."""
    gpu = device.gpu_uuid
    match device:
        case MpsShare(limits=limits):
            return f"an MPS share of GPU {gpu}: {_limits_words(limits)}"
        case MpsInMig(limits=limits, mig=mig):
            name = mig.mig_uuid or "(created at prepare)"
            return (
                f"an MPS share of MIG device {name}, profile {mig.profile_name}, "
                f"on GPU {gpu}: {_limits_words(limits)}"
            )
        case MigInstance(mig=mig):
            name = mig.mig_uuid or "(created at prepare)"
            return f"MIG device {name}, profile {mig.profile_name}, on GPU {gpu}"
        case TimeSliced():
            return f"a time-sliced share of GPU {gpu} (no memory or SM limits)"
        case Admin():
            return f"admin access to GPU {gpu} (monitoring; holds nothing)"
        case Exclusive():
            return f"the whole GPU {gpu}, held by this claim alone"


def _limits_words(limits: MpsLimits) -> str:
    sms = f"{limits.compute_percent}% of the SMs" if limits.compute_percent else "no SM cap"
    return f"memory limit {format_bytes(limits.memory_bytes)}, {sms}"


def device_data(device: PlannedDevice, driver_name: str) -> dict[str, Any]:
    """The entry's ``data``: what is enforced for the claim on this device."""
    data: dict[str, Any] = {
        "apiVersion": f"{driver_name}/{API_VERSION}",
        "kind": DATA_KIND,
        "mode": device.mode.value,
        "gpuUUID": device.gpu_uuid,
    }
    if device.share_id:
        data["shareID"] = device.share_id
    if (limits := limits_of(device)) is not None:
        data["memoryLimit"] = format_bytes(limits.memory_bytes)
        data["memoryLimitBytes"] = limits.memory_bytes
        data["computePercent"] = limits.compute_percent
    if (plan := mig_of(device)) is not None:
        mig: dict[str, Any] = {
            "profile": plan.profile_name,
            "profileID": plan.profile_id,
            "placement": {
                "start": plan.placement_start,
                "size": plan.placement_size,
            },
        }
        if plan.mig_uuid:
            mig["uuid"] = plan.mig_uuid
        data["mig"] = mig
    data["requests"] = list(device.request_names)
    data["cdiDeviceIDs"] = list(device.cdi_device_ids)
    if _json_size(data) > DATA_LIMIT_BYTES:
        # Only the lists can grow (32 requests, many CDI ids): drop them first.
        del data["requests"], data["cdiDeviceIDs"]
    return data


def health_condition(health: HealthSnapshot | None, since: str) -> dict[str, Any]:
    """The ``DeviceHealthy`` condition; ``since`` is used when ``health`` has no time."""
    if health is None:
        return condition(
            DEVICE_HEALTHY,
            "Unknown",
            "NotReported",
            "no health report for this device yet",
            since=since,
        )
    status = {
        HealthStatus.HEALTHY: "True",
        HealthStatus.UNHEALTHY: "False",
        HealthStatus.UNKNOWN: "Unknown",
    }[health.status]
    return condition(
        DEVICE_HEALTHY,
        status,
        condition_reason(health.reason, health.status.value),
        health.message or f"the device is {health.status.value.lower()}",
        since=health.since or since,
    )


def device_status_entry(
    device: PlannedDevice,
    *,
    driver_name: str,
    ready_since: str,
    health: HealthSnapshot | None = None,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """One ``status.devices`` entry for a prepared device."""
    entry: dict[str, Any] = {
        "driver": driver_name,
        "pool": device.pool_name,
        "device": device.device_name,
    }
    if device.share_id:
        entry["shareID"] = device.share_id
    entry["conditions"] = [
        condition(
            READY,
            "True",
            "Prepared",
            ready_message(device),
            since=ready_since,
            observed_generation=observed_generation,
        ),
        health_condition(health, ready_since),
    ]
    entry["data"] = device_data(device, driver_name)
    return entry


def claim_status_entries(
    devices: Sequence[PlannedDevice],
    *,
    driver_name: str,
    ready_since: str,
    health: Callable[[PlannedDevice], HealthSnapshot | None] = lambda _: None,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """Every entry for a claim's prepared devices, in the devices' order (one per key)."""
    entries: list[dict[str, Any]] = []
    seen: set[DeviceKey] = set()
    for device in devices:
        entry = device_status_entry(
            device,
            driver_name=driver_name,
            ready_since=ready_since,
            health=health(device),
            observed_generation=observed_generation,
        )
        key = entry_key(entry)
        if key not in seen:  # the plan already makes keys unique; never send a duplicate
            seen.add(key)
            entries.append(entry)
    return entries


def entry_key(entry: Mapping[str, Any]) -> DeviceKey:
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


def check_entry(entry: Mapping[str, Any]) -> list[str]:
    """What the API server would reject in one ``status.devices`` entry (empty: valid)."""
    problems: list[str] = []
    for key in ("driver", "pool", "device"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            problems.append(f"{key}: required")
    device = entry.get("device")
    if isinstance(device, str) and device and dns_label(device):
        problems.append(f"device: {device!r} is not a DNS label")
    if isinstance(entry.get("pool"), str) and len(entry["pool"]) > 253:
        problems.append("pool: longer than 253 characters")
    conditions = entry.get("conditions") or []
    if len(conditions) > CONDITIONS_LIMIT:
        problems.append(f"conditions: {len(conditions)} > {CONDITIONS_LIMIT}")
    types = [c.get("type") for c in conditions]
    if len(set(types)) != len(types):
        problems.append("conditions: duplicate type")
    for cond in conditions:
        problems.extend(f"condition {cond.get('type')!r}: {p}" for p in check_condition(cond))
    if "data" in entry and _json_size(entry["data"]) > DATA_LIMIT_BYTES:
        problems.append(f"data: more than {DATA_LIMIT_BYTES} bytes")
    return problems


def check_condition(cond: Mapping[str, Any]) -> list[str]:
    """The ``metav1.Condition`` rules (type, status, reason, message, time, generation)."""
    problems: list[str] = []
    if not cond.get("type") or len(str(cond["type"])) > 316:
        problems.append("type: required, at most 316 characters")
    if cond.get("status") not in _CONDITION_STATUSES:
        problems.append(f"status: {cond.get('status')!r} is not True, False or Unknown")
    reason = cond.get("reason")
    if not isinstance(reason, str) or len(reason) > REASON_LIMIT or not _REASON.match(reason):
        problems.append(f"reason: {reason!r} is not a CamelCase reason")
    if len(str(cond.get("message", ""))) > 32768:
        problems.append("message: longer than 32768 characters")
    if not _STAMP.match(str(cond.get("lastTransitionTime", ""))):
        problems.append("lastTransitionTime: required, RFC 3339")
    generation = cond.get("observedGeneration")
    if generation is not None and (not isinstance(generation, int) or generation < 0):
        problems.append("observedGeneration: must be a non-negative integer")
    return problems


def _json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())
