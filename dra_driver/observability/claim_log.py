"""One structured log line per claim operation, on the ``dra_driver.claims`` logger.

Each prepare or unprepare the kubelet asks for gives exactly one line: INFO
when it succeeded, WARNING when it failed. The message reads on its own in
``--log-format text``; with ``--log-format json`` the line also carries::

    {"claim": "ns/name:uid", "operation": "prepare", "outcome": "ok",
     "reason": "", "seconds": 0.012,
     "devices": [{"device": "gpu-0", "gpu_uuid": "GPU-...", "mode": "mps",
                  "share_id": "...", "memory_bytes": 10737418240,
                  "compute_percent": 25}],
     "error": "..."}            # only when it failed

so a log pipeline can follow one claim without parsing messages. The logger
has its own name so that these lines can be routed or silenced apart from the
engine's diagnostics.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from dra_driver.base.quantity import format_bytes
from dra_driver.core.prepare import ClaimOperation, PlannedDevice, limits_of, mig_of

LOGGER = "dra_driver.claims"

Outcome = Literal["ok", "repeated", "error"]


def outcome(op: ClaimOperation) -> Outcome:
    """``ok``; ``repeated`` (already prepared, the recorded result returned); ``error``."""
    if not op.ok:
        return "error"
    return "repeated" if op.repeated else "ok"


def device_fields(device: PlannedDevice) -> dict[str, Any]:
    """A prepared device as JSON-ready fields; absent values are left out."""
    fields: dict[str, Any] = {
        "device": device.device_name,
        "gpu_uuid": device.gpu_uuid,
        "mode": device.mode.value,
    }
    if device.share_id:
        fields["share_id"] = device.share_id
    if (limits := limits_of(device)) is not None:
        fields["memory_bytes"] = limits.memory_bytes
        if limits.compute_percent:
            fields["compute_percent"] = limits.compute_percent
    if (mig := mig_of(device)) is not None:
        fields["mig_profile"] = mig.profile_name
        if mig.mig_uuid:
            fields["mig_uuid"] = mig.mig_uuid
    return fields


def claim_fields(op: ClaimOperation) -> dict[str, Any]:
    """The structured fields of ``op``'s log line."""
    fields: dict[str, Any] = {
        "claim": str(op.ref),
        "operation": op.operation,
        "outcome": outcome(op),
        "reason": op.reason,
        "seconds": round(op.seconds, 6),
        "devices": [device_fields(d) for d in op.devices],
    }
    if op.error is not None:
        fields["error"] = op.error
    return fields


def _describe(device: PlannedDevice) -> str:
    details = [device.mode.value]
    if (mig := mig_of(device)) is not None:
        details.append(mig.profile_name)
    if (limits := limits_of(device)) is not None:
        details.append(format_bytes(limits.memory_bytes))
        if limits.compute_percent:
            details.append(f"{limits.compute_percent}% SMs")
    return f"{device.device_name} ({', '.join(details)})"


def message(op: ClaimOperation) -> str:
    """The human-readable line, e.g. ``prepare ns/a:1 ok in 0.012s: gpu-0 (mps, 10Gi)``."""
    if not op.ok:
        return f"{op.operation} {op.ref} failed ({op.reason}) in {op.seconds:.3f}s: {op.error}"
    text = f"{op.operation} {op.ref} {outcome(op)} in {op.seconds:.3f}s"
    if op.devices:
        text += ": " + ", ".join(_describe(d) for d in op.devices)
    return text


class ClaimLog:
    """A :class:`~dra_driver.core.prepare.DriverObserver` that logs each claim's outcome."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger if logger is not None else logging.getLogger(LOGGER)

    def claim_done(self, op: ClaimOperation) -> None:
        level = logging.INFO if op.ok else logging.WARNING
        if not self.logger.isEnabledFor(level):
            return  # the line and its fields cost more than the check, per claim
        self.logger.log(level, "%s", message(op), extra={"fields": claim_fields(op)})
