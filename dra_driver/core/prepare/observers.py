"""What the prepare/unprepare engine tells the rest of the plugin after each claim.

The engine (``plugin/driver.py``) stays free of metrics, Events and claim
status writes: it hands one :class:`ClaimOperation` per claim and call to every
registered :class:`DriverObserver` once the kubelet's answer is decided.
Observers run on the event loop and must not block; slow work (an API write)
is scheduled as a task. An observer that raises is logged and ignored: telling
is never a reason to fail a claim.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from dra_driver.base.errors import (
    AllocationError,
    ApiError,
    CdiWriteError,
    CheckpointError,
    ClaimNotAllocatedError,
    ClaimNotFoundError,
    ClaimNotOnNodeError,
    ClaimReplacedError,
    DriverError,
    InvalidConfigError,
    InventoryError,
    MigPlacementBusyError,
    MpsAgentError,
    OvercommitError,
)
from dra_driver.base.ids import ClaimRef
from dra_driver.core.model import ResourceClaim
from dra_driver.core.prepare.devices import PlannedDevice

# The name it logged under before core/ was split into packages: log lines say it, so
# it stays (a move changes no output).
log = logging.getLogger("dra_driver.core.observers")

Operation = Literal["prepare", "unprepare"]

# Most specific first: the first class that matches names the reason.
_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (ClaimNotFoundError, "ClaimNotFound"),
    (ClaimReplacedError, "ClaimReplaced"),
    (ClaimNotAllocatedError, "ClaimNotAllocated"),
    (ClaimNotOnNodeError, "ClaimNotOnNode"),
    (OvercommitError, "Overcommit"),
    (AllocationError, "AllocationUnservable"),
    (InvalidConfigError, "InvalidConfig"),
    (MigPlacementBusyError, "MigPlacementBusy"),
    (InventoryError, "GpuError"),
    (ApiError, "ApiError"),
    (CheckpointError, "CheckpointError"),
    (CdiWriteError, "CdiWriteFailed"),
    (MpsAgentError, "MpsAgentError"),
)


def error_reason(err: BaseException) -> str:
    """A short CamelCase reason for ``err`` (metric label, Event reason)."""
    for kind, reason in _REASONS:
        if isinstance(err, kind):
            return reason
    if isinstance(err, DriverError):
        return "DriverError"
    return "InternalError"


@dataclass(frozen=True)
class ClaimOperation:
    """One claim's prepare or unprepare, as answered to the kubelet."""

    operation: Operation
    ref: ClaimRef
    seconds: float
    """From the kubelet's call reaching the engine to the answer."""
    devices: tuple[PlannedDevice, ...] = ()
    """Prepare: what was prepared (also when it had been prepared before)."""
    error: str | None = None
    reason: str = ""
    """Empty on success, else a short CamelCase reason (see :func:`error_reason`)."""
    claim: ResourceClaim | None = None
    """Prepare: the claim as read from the API, when it could be read."""
    repeated: bool = False
    """Prepare: the claim was already prepared; nothing was done this time."""

    @property
    def ok(self) -> bool:
        return self.error is None


class DriverObserver(Protocol):
    def claim_done(self, op: ClaimOperation) -> None:
        """Called on the event loop once per claim and call; must not block."""
        ...


def notify(observers: Iterable[DriverObserver], op: ClaimOperation) -> None:
    for observer in observers:
        try:
            observer.claim_done(op)
        except Exception:
            log.exception("observer %r failed on %s of %s", observer, op.operation, op.ref)
