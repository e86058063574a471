"""The driver's error hierarchy.

Every error the driver raises on purpose derives from :class:`DriverError`;
library errors (``kubernetes.client.ApiException``, OS errors, NVML errors) are
translated at their adapter with ``raise ... from err``::

    DriverError
    ├── ClaimError                 one claim cannot be prepared; reported in the
    │   │                          response map for that claim, never the call
    │   ├── ClaimNotFoundError     the ResourceClaim is gone
    │   ├── ClaimReplacedError     same namespace/name, different UID
    │   ├── ClaimNotAllocatedError status.allocation is empty
    │   ├── ClaimNotOnNodeError    allocated, but not to this node's pool
    │   └── AllocationError        the allocation names something we cannot serve
    │       └── OvercommitError    an MPS share does not fit beside those prepared
    ├── ApiError                   the Kubernetes API failed (adapter boundary)
    │   ├── ApiNotFoundError
    │   ├── ApiConflictError
    │   └── ApiUnavailableError    transport errors, 5xx, 429: worth a retry
    ├── CheckpointError
    │   └── CheckpointCorruptError the file fails its checksum or schema
    ├── CdiWriteError              a claim's CDI spec file could not be written
    ├── InventoryError             GPU discovery or MIG management failed, or was
    │   │                          misconfigured
    │   └── MigPlacementBusyError  a MIG instance cannot go where asked: the placement
    │                              overlaps an existing instance (or the GPU lacks room)
    ├── LeadershipLostError        the controller lost its Lease: it exits, to be restarted
    ├── ConfigError                a flag or file given to the driver is invalid
    └── InvalidConfigError         an opaque config (gpu.fractional.dev/v1alpha1) is
                                   invalid, or asks more than the allocation granted
"""

from __future__ import annotations

from dra_driver.base.ids import ClaimRef


class DriverError(Exception):
    """Base of every error the driver raises on purpose."""


class ClaimError(DriverError):
    """A failure confined to one claim; the message names the claim and the cause."""

    def __init__(self, claim: ClaimRef, cause: str) -> None:
        super().__init__(f"claim {claim}: {cause}")
        self.claim = claim
        self.cause = cause


class ClaimNotFoundError(ClaimError):
    """The ResourceClaim no longer exists in the API."""


class ClaimReplacedError(ClaimError):
    """A claim with the same namespace/name exists but with another UID."""


class ClaimNotAllocatedError(ClaimError):
    """The claim has no status.allocation."""


class ClaimNotOnNodeError(ClaimError):
    """The claim is allocated, but none of its results are ours on this node."""


class AllocationError(ClaimError):
    """The allocation names a device or shape this node cannot serve."""


class OvercommitError(AllocationError):
    """The MPS shares already prepared on the GPU leave no room for this one."""


class ApiError(DriverError):
    """A Kubernetes API call failed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ApiNotFoundError(ApiError):
    """HTTP 404."""


class ApiConflictError(ApiError):
    """HTTP 409: resourceVersion conflict or already exists."""


class ApiUnavailableError(ApiError):
    """Transport failure, HTTP 429 or 5xx: the call may succeed if retried."""


class CheckpointError(DriverError):
    """The checkpoint could not be read or written."""


class CheckpointCorruptError(CheckpointError):
    """The checkpoint file exists but fails its checksum or schema check."""


class CdiWriteError(DriverError):
    """A claim's CDI spec file could not be written under ``--cdi-root``."""


class InventoryError(DriverError):
    """GPU discovery or MIG management failed, or its configuration is invalid."""


class MigPlacementBusyError(InventoryError):
    """A GPU instance cannot be created at the asked placement.

    The placement overlaps a GPU instance that exists already (one created
    before we started, or one a claim owns), or the GPU has no room left for
    that profile. The message names the placement and, where known, the
    instance in the way. Not transient on its own: the instance in the way
    must be destroyed first.
    """


class MpsAgentError(DriverError):
    """The mps-agent answered with an error; ``kind`` is the protocol's error kind.

    Defined here so that the core names it (its reason, ``MpsAgentError``)
    without importing the agent's client (:mod:`dra_driver.mpsagent.client`
    raises it, and its subclass ``MpsAgentUnavailableError``).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ConfigError(DriverError):
    """A flag, environment variable or file given to the driver is invalid."""


class InvalidConfigError(DriverError):
    """An opaque device config is malformed, or asks more than the allocation granted.

    Raised by ``dra_driver.api``; the message names the field path
    (``mps.computePercent``) and what is allowed. ``field`` holds that path
    (empty when the problem is the object as a whole).
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class LeadershipLostError(DriverError):
    """The controller led and lost its Lease (renewals failed past the renew deadline,
    or another holder has it): it must stop allocating and exit, to be restarted."""
