"""The opaque configuration API ``<driver name>/v1alpha1`` as frozen dataclasses.

Three kinds, one tagged union (:data:`ApiObject`), dispatched with ``match``:

``GpuConfig``
    Per-claim (or per-class) adjustments a user may write in a DeviceClass's or
    a claim's ``config[].opaque.parameters``. Every section is optional; an
    absent section, and an absent field inside one, mean "what the allocation
    granted" (``None`` here), so configs merge field by field (class, then
    claim; :mod:`dra_driver.core.prepare.configs`). A section only takes effect on a GPU
    whose *node-set* sharing strategy matches it (``mps`` on MPS-shared GPUs,
    ``timeSlicing`` on time-sliced ones): the strategy is the GPU's, published as
    the ``sharing`` attribute, never a claim's, so there is no field to choose it.

    * ``mps: {computePercent: 1..100, memoryLimit: quantity > 0,
      memorySoftLimit: quantity > 0}``: ``computePercent`` and ``memoryLimit``
      may only *lower* the granted compute percent / memory
      (:func:`~dra_driver.core.prepare.apply_overrides`); ``memorySoftLimit``
      asks for a soft device-memory limit no larger than the share's memory
      (see :class:`MpsConfig`).
    * ``timeSlicing: {interval: Default|Short|Medium|Long}``.
    * ``mig: {}``: reserved for MIG options; it has no fields yet, so any field
      in it is rejected. Accepted so that classes can carry it forward-compatibly.

``GpuShare``
    ``{memory: quantity > 0 (required), computePercent: 0..100 (default 0)}``:
    what a user asks for on clusters whose API drops ``capacity.requests``. Only
    the controller reads it; the node plugin never takes limits from it.

``GpuShareGrant``
    ``{device, shareID (UUID), memory, computePercent}``: what the controller
    granted, written by the controller into ``status.allocation.devices.config``
    with ``source: FromClaim``. The only source of limits on the controller path.

Quantities are held as whole bytes; ``computePercent`` 0 means "no SM cap".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

DEFAULT_DRIVER_NAME = "gpu.fractional.dev"
"""The driver name (and API group) unless configured otherwise."""

API_VERSION = "v1alpha1"
"""The version part of ``apiVersion``: ``<driver name>/v1alpha1``."""


def api_version(driver_name: str = DEFAULT_DRIVER_NAME) -> str:
    """The ``apiVersion`` our opaque configs carry for ``driver_name``."""
    return f"{driver_name}/{API_VERSION}"


class Kind(enum.StrEnum):
    """The kinds of ``<driver name>/v1alpha1``."""

    GPU_CONFIG = "GpuConfig"
    GPU_SHARE = "GpuShare"
    GPU_SHARE_GRANT = "GpuShareGrant"


class TimeSliceInterval(enum.StrEnum):
    """Time-slice length for a time-sliced GPU (``nvidia-smi compute-policy`` levels)."""

    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


@dataclass(frozen=True)
class MpsConfig:
    """``GpuConfig.mps``: lowers the share's MPS limits; ``None`` keeps the grant."""

    compute_percent: int | None = None
    """``computePercent``: active thread percentage, 1..100."""
    memory_limit_bytes: int | None = None
    """``memoryLimit``: pinned device-memory limit in bytes, > 0."""
    memory_soft_limit_bytes: int | None = None
    """``memorySoftLimit``: soft device-memory limit in bytes, > 0; ``None``: none.

    The device memory each container of the share is guaranteed before its
    allocations may fail under memory pressure (NVML's ``softLimit``); the hard
    limit stays the share's memory. It must not exceed the share's memory, the
    hard limit: what the allocation granted, after any ``memoryLimit``; more
    fails the claim with a message naming both values.

    Only the cgroup v2 ``dmem`` hook enforces it (the container's ``dmem.min``),
    so it has an effect only on an MPS-shared GPU for which the node found a
    ``dmem`` region (Linux 6.14+, an NVIDIA driver that registers one);
    elsewhere it is accepted and does nothing, and nothing is logged per claim.
    The kernel honours a leaf's ``dmem.min`` only where every ancestor (the
    pod's, ``kubepods``') reserves as much ("MPS v3 Memory Partitioning",
    "Ancestor reservation propagation"). ``nvidia-smi memory-limits``, which the
    hook uses where the driver offers it, raises the ancestors by the leaf's
    share; that reservation stays on them after the container's cgroup is
    removed (NVIDIA: zero the soft limit first; the hook has no step then).
    The hook's fallback, a direct write, raises none, so there the soft limit
    protects nothing unless the ancestors already reserve as much (the hook
    warns). Not verified on a dmem-capable node.
    """


@dataclass(frozen=True)
class TimeSlicingConfig:
    """``GpuConfig.timeSlicing``; ``None`` means the node's default interval."""

    interval: TimeSliceInterval | None = None


@dataclass(frozen=True)
class MigConfig:
    """``GpuConfig.mig``: reserved; no options yet (any field is rejected)."""


@dataclass(frozen=True)
class GpuConfig:
    """Kind ``GpuConfig``; absent sections (``None``) mean "as granted"."""

    mps: MpsConfig | None = None
    time_slicing: TimeSlicingConfig | None = None
    mig: MigConfig | None = None


@dataclass(frozen=True)
class GpuShare:
    """Kind ``GpuShare``: a share request for the controller (never trusted for limits)."""

    memory_bytes: int
    compute_percent: int = 0
    """0..100; 0 (the default) asks for no SM cap."""


@dataclass(frozen=True)
class GpuShareGrant:
    """Kind ``GpuShareGrant``: what the controller granted one allocation result."""

    device: str
    """The result's device name (``gpu-0``)."""
    share_id: str
    """``shareID``: a UUID; equals the result's ``shareID`` where the API keeps it."""
    memory_bytes: int
    compute_percent: int
    """0..100; 0 means no SM cap."""


ApiObject: TypeAlias = GpuConfig | GpuShare | GpuShareGrant
"""One decoded opaque config: a tagged union, one class per kind."""


class LimitsOrigin(enum.StrEnum):
    """Where granted limits came from."""

    CONSUMED_CAPACITY = "consumedCapacity"
    """The native path: the scheduler's ``consumedCapacity``."""
    GRANT = "GpuShareGrant"
    """The controller path: the controller's grant."""
    WHOLE_GPU = "wholeGpu"
    """Neither: an exclusive allocation of the whole GPU."""


@dataclass(frozen=True)
class Limits:
    """Memory and compute a result may use on its GPU."""

    memory_bytes: int
    compute_percent: int
    """0..100; 0 means no SM cap (as 100); see :attr:`effective_compute_percent`."""
    device: str = ""
    """The device the limits are for; used in messages."""
    origin: LimitsOrigin = LimitsOrigin.WHOLE_GPU
    soft_memory_bytes: int | None = None
    """The soft memory limit a config asked for (``mps.memorySoftLimit``), at most
    :attr:`memory_bytes`; ``None``: none."""

    @property
    def effective_compute_percent(self) -> int:
        """The cap as a percentage: 0 ("no SM cap") reads as 100."""
        return self.compute_percent or 100
