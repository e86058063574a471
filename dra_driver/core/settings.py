"""What shapes the slices besides the hardware: node settings and cluster capabilities."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

MIB = 1024 * 1024


class Sharing(enum.StrEnum):
    """How a GPU is shared; a node setting, never a claim's choice.

    A GPU without MIG may use any of them; a MIG-enabled GPU's instances are
    ``exclusive`` (the default) or ``mps`` (each instance an MPS-shared device,
    :attr:`GpuSettings.mig_sharing`).
    """

    MPS = "mps"
    TIMESLICING = "timeslicing"
    EXCLUSIVE = "exclusive"


class Allocator(enum.StrEnum):
    """Who allocates a GPU's devices: the kube-scheduler, or our controller."""

    SCHEDULER = "scheduler"
    CONTROLLER = "controller"


class Tenancy(enum.StrEnum):
    """Whose claims may share an MPS daemon that cannot keep its clients apart.

    A legacy MPS daemon (and the daemon of a MIG instance, always legacy) is reached
    by every client through its ``control`` socket, and serves them one ``/dev/shm``:
    any client can quit the daemon, change its limits, terminate or list other
    clients, and read other clients' shared memory (docs/nvidia-interfaces.md,
    ``mps-control-socket``). An MPS v3 daemon keeps each claim in its own namespace
    directory, so this setting does not apply to it.
    """

    NAMESPACE = "namespace"
    """Such a daemon serves the claims of one Kubernetes namespace at a time (default)."""
    COOPERATIVE = "cooperative"
    """Claims of any namespace share it: every tenant can stop, slow, resize or read
    the others' MPS work (opt-in, per GPU)."""


@dataclass(frozen=True)
class GpuSettings:
    sharing: Sharing = Sharing.MPS
    """How the GPU is shared while MIG is off."""
    allocator: Allocator = Allocator.SCHEDULER
    tenancy: Tenancy = Tenancy.NAMESPACE
    """Who may share the GPU's daemon, or its MIG instances' daemons, where that
    daemon speaks legacy MPS (:class:`Tenancy`)."""
    mig_sharing: Sharing = Sharing.EXCLUSIVE
    """How the GPU's MIG instances are shared while MIG is on: ``exclusive`` (one
    claim per instance) or ``mps`` (claims share an instance as MPS clients of a
    daemon for that instance). Set only by an explicit per-GPU ``sharing`` in the
    node config, so a node-wide ``sharing: mps`` leaves MIG instances exclusive."""


@dataclass(frozen=True)
class NodeSettings:
    """Per-node configuration (flags, or a file the chart fills)."""

    default: GpuSettings = field(default_factory=GpuSettings)
    per_gpu: Mapping[str, GpuSettings] = field(default_factory=dict)
    """Overrides keyed by GPU index (``"0"``) or UUID."""
    memory_reserve_bytes: int = 0
    """Device memory kept back from shares on each GPU (driver, MPS server)."""
    memory_step_bytes: int = 256 * MIB
    """Granularity of memory shares: ``validRange.min`` and ``step``."""
    max_clients: int = 48
    """Shares per GPU (the ``clients`` capacity); MPS allows 48 clients per server."""
    mps_context_overhead_bytes: int = 0
    """Device memory each MPS client's context takes beyond its limit (overcommit guard)."""
    legacy_mps: bool = False
    """The node's MPS daemons for whole GPUs speak legacy MPS (the mps-agent's protocol,
    resolved as the agent resolves it); a MIG instance's daemon always does."""

    def daemon_keeps_tenants_apart(self, *, mig: bool) -> bool:
        """Whether an MPS daemon of a whole GPU (``mig`` False) or of a MIG instance gives
        each claim its own namespace directory (MPS v3), rather than its ``control``
        socket and ``/dev/shm`` to every client (legacy MPS, always inside MIG)."""
        return not mig and not self.legacy_mps

    def shares_one_namespace(self, gpu: GpuSettings, *, mig: bool) -> bool:
        """Whether the MPS shares of this GPU (``mig``: of its MIG instances) must all be
        claims of one Kubernetes namespace: a daemon that cannot keep tenants apart and
        no ``tenancy: cooperative`` opt-in."""
        return not self.daemon_keeps_tenants_apart(mig=mig) and gpu.tenancy is Tenancy.NAMESPACE

    def for_gpu(self, index: int, uuid: str) -> GpuSettings:
        return self.per_gpu.get(uuid) or self.per_gpu.get(str(index)) or self.default


@dataclass(frozen=True)
class Capabilities:
    """What the cluster's API server keeps (feature gates), learnt by a dry-run probe."""

    consumable_capacity: bool = False
    """allowMultipleAllocations, requestPolicy (DRAConsumableCapacity)."""
    partitionable_devices: bool = False
    """sharedCounters, consumesCounters (DRAPartitionableDevices)."""
    device_taints: bool = False
    """Device taints (DRADeviceTaints)."""
    counters_in_own_slice: bool = True
    """1.35+: a slice holds devices or sharedCounters, never both."""

    @classmethod
    def for_version(cls, minor: int) -> Capabilities:
        """The defaults of Kubernetes 1.<minor> (what ``--kube-version`` stands for)."""
        return cls(
            consumable_capacity=minor >= 36,
            partitionable_devices=minor >= 36,
            device_taints=minor >= 36,
            counters_in_own_slice=minor >= 35,
        )
