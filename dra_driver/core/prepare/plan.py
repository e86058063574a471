"""What a claim gets on this node: ``plan_prepare`` is pure and deterministic.

The kubelet may call NodePrepareResources for one claim many times (after a
kubelet restart, after a partial failure); the same claim, inventory and node
must always give the same plan, so a repeat writes the same CDI spec and
returns the same device ids. Nothing here reads clocks, files or the API.

Each allocated device gets a mode: the whole GPU (a result without a
``shareID``), an MPS share with the memory and SM limits granted by the
allocation (``consumedCapacity`` on the native path, the controller's
``GpuShareGrant`` otherwise) and lowered by the claim's ``GpuConfig``, a
time-sliced share (no limits), a MIG device (an existing instance, or a
placement to create at prepare), or admin access. The sharing strategy is the
GPU's node setting, never the claim's. The plan also guards the node: an
exclusive device already prepared for another claim, or MPS shares whose
memory would not fit the GPU, fail the claim.

The plan's CDI spec holds what every container of the claim needs that the
plan can know: the GPU's device node and the node's common edits (driver
libraries, control nodes), and, for an MPS share of a GPU with cgroup v2
``dmem`` regions (:class:`DmemHookSettings`, detected at start), the
``createContainer`` hook that sets each container's device-memory limit (and
the soft limit the claim's ``mps.memorySoftLimit`` asks for).
Edits that only exist once a side effect has run (an MPS namespace's pipe
directory, a new MIG instance's capability nodes) are added by the engine when
it applies the plan.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.base.errors import (
    AllocationError,
    ClaimNotAllocatedError,
    ClaimNotOnNodeError,
    InvalidConfigError,
    OvercommitError,
)
from dra_driver.base.ids import ClaimUID, DeviceName, GpuUUID, PoolName
from dra_driver.base.quantity import format_bytes
from dra_driver.core.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    Hook,
    fake_device_node,
    merge_edits,
)
from dra_driver.core.model import DeviceResult, GpuInfo, Inventory, ResourceClaim
from dra_driver.core.prepare.configs import effective_config, limits_for, trusted_grant
from dra_driver.core.published import MigTarget, mig_targets
from dra_driver.core.settings import NodeSettings, Sharing
from dra_driver.core.slices import MIB, mig_share_policy

NVIDIA_MAJOR = 195
"""Character-device major of /dev/nvidia<N> and /dev/nvidiactl (fixed by the driver)."""
NVIDIACTL_MINOR = 255


class Mode(enum.StrEnum):
    """How a device is handed to a claim."""

    EXCLUSIVE = "exclusive"
    """The whole GPU, held by this claim alone."""
    SHARED = "shared"
    """A time-sliced share: the GPU's nodes, no limits."""
    MPS = "mps"
    """An MPS share: memory and SM limits held by the MPS daemon. With ``mig`` set, a
    share of a MIG instance: a client of the daemon for that instance."""
    MIG = "mig"
    """A MIG device: hardware isolation, held by this claim alone."""
    ADMIN = "admin"
    """adminAccess: monitoring access that holds nothing."""


_MODE_STRENGTH = (Mode.ADMIN, Mode.SHARED, Mode.MPS, Mode.MIG, Mode.EXCLUSIVE)
_HOLDS_ALONE = (Mode.EXCLUSIVE, Mode.MIG)


@dataclass(frozen=True)
class DmemHookSettings:
    """Kernel-enforced GPU-memory limits for MPS shares: cgroup v2 ``dmem``.

    Where the node's kernel has the ``dmem`` controller and the GPU's driver
    registers a region for it, each container of an MPS share gets a CDI
    ``createContainer`` hook (``dra_driver/dmemhook/dmem-hook.sh``, installed on
    the host) that sets the share's memory limit as the container's hard limit
    (``dmem.max``; its cgroup does not exist at prepare time) and, when the
    claim's config asks for one (``mps.memorySoftLimit``), its soft limit
    (``dmem.min``), through ``nvidia-smi memory-limits`` where the driver offers
    it. The limits are per container: two containers of one pod that use one
    claim may each use them. A GPU without regions gets no hook, and a
    soft limit asked for a share of it has no effect (silently: the field's
    documentation says so, and detection logs the node's dmem state once).
    """

    hook_path: str
    """The installed script, a path on the host."""
    regions: Mapping[GpuUUID, tuple[str, ...]]
    """dmem regions per GPU UUID (detection at start); a GPU absent here gets no hook."""
    strict: bool = False
    """A failing hook fails the container's start (``--strict``); otherwise the
    container starts with the MPS daemon's limit only and the hook logs why."""
    log_path: str | None = None
    """Where the hook appends its failures on the host."""
    timeout_s: int = 10


@dataclass(frozen=True)
class NodeContext:
    """Who we are on this node, and what every claim's container gets."""

    driver_name: str
    node_name: str
    pool_name: PoolName
    cdi_kind: str
    settings: NodeSettings = field(default_factory=NodeSettings)
    common_edits: ContainerEdits = field(default_factory=ContainerEdits)
    """The driver's user-space libraries, control nodes and hooks (toolkit spec or
    driver-root discovery); empty when unknown."""
    fake_device_nodes: bool = False
    """Fake backend: GPU nodes are harmless stand-ins (no GPU on the host)."""
    dmem: DmemHookSettings | None = None
    """cgroup v2 dmem limits for MPS shares; None: the node has none (or they are off)."""


@dataclass(frozen=True)
class ShareLimits:
    memory_bytes: int
    compute_percent: int
    """0: no SM cap."""


@dataclass(frozen=True)
class MigPlan:
    profile_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    mig_uuid: str | None = None
    """Set when the instance exists; None: the engine creates it at prepare."""
    gi_id: int | None = None
    ci_id: int | None = None
    created: bool = False
    """We created the instance at prepare (and destroy it at unprepare)."""


@dataclass(frozen=True)
class PlannedDevice:
    request_names: tuple[str, ...]
    pool_name: PoolName
    device_name: DeviceName
    share_id: str | None
    gpu_uuid: GpuUUID
    mode: Mode
    cdi_device_ids: tuple[str, ...]
    limits: ShareLimits | None = None
    """MPS shares only."""
    mig: MigPlan | None = None
    """MIG devices only."""
    grant_share_id: str | None = None
    """A share without ``shareID`` (1.34/1.35 API servers drop it): the shareID of
    the controller's ``GpuShareGrant`` for it, its stable identity on the node."""

    @property
    def share_key(self) -> str | None:
        """What names this share on the node (its MPS namespace at the mps-agent):
        the shareID, else the grant's."""
        return self.share_id or self.grant_share_id


@dataclass(frozen=True)
class PreparePlan:
    claim_uid: ClaimUID
    devices: tuple[PlannedDevice, ...]
    cdi_spec: CdiSpec


@dataclass(frozen=True)
class DeviceUse:
    """A device held by an already-prepared claim (from the checkpoint)."""

    claim_uid: ClaimUID
    mode: Mode
    memory_bytes: int = 0
    """An MPS share's memory limit (for the overcommit guard)."""
    mig: MigPlan | None = None
    """The MIG instance an MPS share inside MIG is a client of (a later share of an
    instance made on demand joins it instead of making another)."""


def cdi_device_name(claim_uid: str, device: str, share_id: str | None) -> str:
    """CDI device names derive from the claim UID, never reused across claims."""
    return f"{claim_uid}-{device}" if share_id is None else f"{claim_uid}-{device}-{share_id}"


def _our_results(claim: ResourceClaim, ctx: NodeContext) -> list[DeviceResult]:
    if not claim.allocated:
        raise ClaimNotAllocatedError(
            claim.ref, "it is not allocated (status.allocation is empty); nothing to prepare"
        )
    if claim.node_names and ctx.node_name not in claim.node_names:
        raise ClaimNotOnNodeError(
            claim.ref,
            f"it is allocated to node {', '.join(sorted(claim.node_names))}, "
            f"not to this node {ctx.node_name}",
        )
    mine = [r for r in claim.results if r.driver == ctx.driver_name]
    if not mine:
        raise ClaimNotOnNodeError(
            claim.ref, f"its allocation has no results for driver {ctx.driver_name}"
        )
    here = [r for r in mine if r.pool == ctx.pool_name]
    if not here:
        pools = ", ".join(sorted({r.pool for r in mine}))
        raise ClaimNotOnNodeError(
            claim.ref,
            f"its devices are in pool {pools}, not in this node's pool {ctx.pool_name}",
        )
    return here


def _check_conflicts(
    claim: ResourceClaim,
    device: DeviceName,
    mode: Mode,
    in_use: Mapping[DeviceName, Sequence[DeviceUse]],
) -> None:
    """The node is the last line of defence against a device given out twice."""
    if mode is Mode.ADMIN:
        return
    for use in in_use.get(device, ()):
        if use.claim_uid == claim.ref.uid or use.mode is Mode.ADMIN:
            continue
        if mode in _HOLDS_ALONE or use.mode in _HOLDS_ALONE:
            raise AllocationError(
                claim.ref,
                f"device {device} is already prepared for claim {use.claim_uid} "
                f"({use.mode.value}); refusing to give it out twice",
            )


def _check_own_results(
    claim: ResourceClaim, groups: Mapping[tuple[DeviceName, str | None], Sequence[DeviceResult]]
) -> None:
    """A device held exclusively cannot also be one of the claim's shares."""
    uses: dict[DeviceName, int] = {}
    exclusive: set[DeviceName] = set()
    for (device, _), group in groups.items():
        uses[device] = uses.get(device, 0) + 1
        if any(not r.share_id and not r.admin_access for r in group):
            exclusive.add(device)
    for device in sorted(exclusive):
        if uses[device] > 1:
            raise AllocationError(
                claim.ref,
                f"the allocation holds device {device} both exclusively and as a share; "
                "delete the claim so it is allocated again",
            )


def plan_prepare(
    claim: ResourceClaim,
    inventory: Inventory,
    ctx: NodeContext,
    in_use: Mapping[DeviceName, Sequence[DeviceUse]] | None = None,
) -> PreparePlan:
    """Compute what ``claim`` gets on this node, or raise a ClaimError saying why not."""
    results = _our_results(claim, ctx)
    # One planned device per (device, shareID): two requests that landed on the
    # same device (or share) are one device with both request names.
    groups: dict[tuple[DeviceName, str | None], list[DeviceResult]] = {}
    for result in results:
        groups.setdefault((result.device, result.share_id), []).append(result)

    _check_own_results(claim, groups)

    planned: list[PlannedDevice] = []
    cdi_devices: list[CdiDevice] = []
    soft_limits: list[int | None] = []  # per planned device: mps.memorySoftLimit (dmem hook)
    migs = mig_targets(inventory)
    for (device, share_id), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
    ):
        target = migs.get(device)
        gpu = target.gpu if target is not None else inventory.gpu_by_device(device)
        if gpu is None or (target is None and gpu.mig_enabled):
            known = ", ".join([n for n in _whole_gpus(inventory)] + sorted(migs)) or "none"
            raise AllocationError(
                claim.ref,
                f"device {device} is not on this node (devices here: {known}); "
                "the allocation is stale: delete the claim so it is allocated again",
            )
        # The strongest use wins when two results name one device.
        mode = max((_mode(r, gpu, target, ctx, claim) for r in group), key=_MODE_STRENGTH.index)
        usable = _usable(gpu, target, ctx.settings)
        limits, soft = _limits(claim, group, usable, ctx) if mode is Mode.MPS else (None, None)
        if limits is not None and _takes_all(claim, group, limits, usable, ctx):
            # No other share can fit beside it (the scheduler gives a claim that asks no
            # amount the request policy's default: all the memory): the whole GPU (or
            # MIG instance), no MPS client with a limit that changes nothing.
            mode, limits, soft = (Mode.EXCLUSIVE if target is None else Mode.MIG), None, None
        _check_conflicts(claim, device, mode, in_use or {})
        if limits is not None:
            _check_fits(
                claim,
                device=device,
                usable=usable,
                limits=limits,
                settings=ctx.settings,
                in_use=in_use or {},
            )
        name = cdi_device_name(claim.ref.uid, device, share_id)
        soft_limits.append(soft)
        cdi_devices.append(CdiDevice(name=name, edits=_gpu_edits(gpu, ctx.fake_device_nodes)))
        planned.append(
            PlannedDevice(
                request_names=tuple(sorted({r.main_request for r in group})),
                pool_name=ctx.pool_name,
                device_name=device,
                share_id=share_id,
                gpu_uuid=gpu.uuid,
                mode=mode,
                cdi_device_ids=(f"{ctx.cdi_kind}={name}",),
                limits=limits,
                mig=_mig_plan(target, device, mode, claim, in_use or {})
                if target is not None
                else None,
                grant_share_id=(
                    _grant_share_id(claim, group, ctx)
                    if share_id is None and mode in (Mode.MPS, Mode.SHARED)
                    else None
                ),
            )
        )
    if ctx.dmem is not None:
        cdi_devices = _with_dmem_hooks(cdi_devices, planned, soft_limits, ctx.dmem)
    spec = CdiSpec(
        kind=ctx.cdi_kind,
        devices=tuple(cdi_devices),
        common_edits=(
            ctx.common_edits
            if ctx.fake_device_nodes
            else merge_edits(
                ContainerEdits(
                    device_nodes=(
                        DeviceNode("/dev/nvidiactl", major=NVIDIA_MAJOR, minor=NVIDIACTL_MINOR),
                    )
                ),
                ctx.common_edits,
            )
        ),
    )
    return PreparePlan(claim_uid=claim.ref.uid, devices=tuple(planned), cdi_spec=spec)


def _takes_all(
    claim: ResourceClaim,
    group: Sequence[DeviceResult],
    limits: ShareLimits,
    usable: int,
    ctx: NodeContext,
) -> bool:
    """A share granted all of the device's usable memory (a GPU's, or a MIG instance's;
    less than one step left: no other share fits) and no SM cap. Only what the
    allocation says counts: a share that records no memory (no consumedCapacity, no
    grant) stays a share."""
    granted = any(
        "memory" in r.consumed_capacity
        or trusted_grant(r, claim.configs, ctx.driver_name) is not None
        for r in group
    )
    left = usable - limits.memory_bytes
    return granted and left < ctx.settings.memory_step_bytes and limits.compute_percent in (0, 100)


def _usable(gpu: GpuInfo, target: MigTarget | None, settings: NodeSettings) -> int:
    """What MPS shares of the device divide: a GPU's memory less the reserve, or a MIG
    instance's own memory (what its slices publish, :func:`mig_share_policy`)."""
    if target is None:
        return gpu.memory_bytes - settings.memory_reserve_bytes
    existing = target.existing
    if existing is not None and existing.memory_mib:
        return existing.memory_mib * MIB
    profile = next((p for p in gpu.mig_profiles if p.id == target.profile_id), None)
    return profile.memory_mib * MIB if profile is not None else 0


def _whole_gpus(inventory: Inventory) -> list[str]:
    return [g.device_name for g in inventory.gpus if not g.mig_enabled]


def _mode(
    result: DeviceResult,
    gpu: GpuInfo,
    target: MigTarget | None,
    ctx: NodeContext,
    claim: ResourceClaim,
) -> Mode:
    if result.admin_access:
        return Mode.ADMIN
    if target is not None:
        # A share of a MIG instance is an MPS client of the instance's daemon when
        # the GPU shares its instances (and the instance can be shared at all).
        if result.share_id and _mig_shared(gpu, target, ctx.settings):
            return Mode.MPS
        return Mode.MIG
    if not result.share_id and not _has_grant(result, claim, ctx):
        return Mode.EXCLUSIVE
    sharing = ctx.settings.for_gpu(gpu.index, gpu.uuid).sharing
    if sharing is Sharing.MPS:
        return Mode.MPS
    if sharing is Sharing.TIMESLICING:
        return Mode.SHARED
    raise AllocationError(
        claim.ref,
        f"the allocation holds a share of {gpu.device_name}, but this node does not share "
        f"it (sharing={sharing.value}); delete the claim so it is allocated again",
    )


def _mig_shared(gpu: GpuInfo, target: MigTarget, settings: NodeSettings) -> bool:
    if settings.for_gpu(gpu.index, gpu.uuid).mig_sharing is not Sharing.MPS:
        return False
    profile = next((p for p in gpu.mig_profiles if p.id == target.profile_id), None)
    memory_mib = _usable(gpu, target, settings) // MIB
    return mig_share_policy(gpu, profile, memory_mib, settings) is not None


def _grant_share_id(
    claim: ResourceClaim, group: Sequence[DeviceResult], ctx: NodeContext
) -> str | None:
    """The lowest shareID of the grants of ``group`` (results without shareID)."""
    ids = [
        grant.share_id
        for result in group
        if (grant := trusted_grant(result, claim.configs, ctx.driver_name)) is not None
    ]
    return min(ids) if ids else None


def _has_grant(result: DeviceResult, claim: ResourceClaim, ctx: NodeContext) -> bool:
    """A share without shareID: the controller's grant, on clusters whose API drops it."""
    try:
        return trusted_grant(result, claim.configs, ctx.driver_name) is not None
    except InvalidConfigError as err:
        raise AllocationError(claim.ref, f"request {result.request}: {err}") from err


def _limits(
    claim: ResourceClaim, group: Sequence[DeviceResult], usable: int, ctx: NodeContext
) -> tuple[ShareLimits, int | None]:
    """The share's limits: what the allocation granted, lowered by the claim's config;
    and the soft memory limit its config asks for (``mps.memorySoftLimit``), or None.

    The soft limit is kept out of :class:`ShareLimits` (which the checkpoint
    records): only the dmem hook uses it, and the hook's arguments are in the
    CDI spec the checkpoint keeps.
    """
    memory, percent = usable, 0
    softs: list[int] = []
    for result in group:
        try:
            effective = effective_config(result, claim.configs, ctx.driver_name)
            limits = limits_for(result, effective, usable)
        except InvalidConfigError as err:
            raise AllocationError(claim.ref, f"request {result.request}: {err}") from err
        memory = min(memory, limits.memory_bytes)
        if limits.compute_percent:
            percent = min(percent or 100, limits.compute_percent)
        if limits.soft_memory_bytes is not None:
            softs.append(limits.soft_memory_bytes)
    # Each result's soft limit fits its own hard limit (apply_overrides); two
    # results of one share take the smallest of each, so clip the soft to the hard.
    soft = min([*softs, memory]) if softs else None
    return ShareLimits(memory_bytes=memory, compute_percent=percent), soft


def _check_fits(
    claim: ResourceClaim,
    *,
    device: DeviceName,
    usable: int,
    limits: ShareLimits,
    settings: NodeSettings,
    in_use: Mapping[DeviceName, Sequence[DeviceUse]],
) -> None:
    """MPS shares prepared on one device (a GPU or a MIG instance) must fit its usable
    memory (overcommit guard)."""
    others = [
        u for u in in_use.get(device, ()) if u.mode is Mode.MPS and u.claim_uid != claim.ref.uid
    ]
    overhead = settings.mps_context_overhead_bytes
    prepared = sum(u.memory_bytes + overhead for u in others)
    if prepared + limits.memory_bytes + overhead > usable:
        raise OvercommitError(
            claim.ref,
            f"{device} cannot hold this share: {len(others)} share(s) already prepared there "
            f"hold {format_bytes(prepared)} (with {format_bytes(overhead)} overhead each), "
            f"this one asks {format_bytes(limits.memory_bytes)} + {format_bytes(overhead)}, "
            f"and {format_bytes(usable)} are usable; nothing was changed",
        )


def mps_memory_on(devices: Sequence[PlannedDevice], gpu_uuid: GpuUUID) -> int:
    """A claim's MPS memory on one GPU: the sum of its shares there.

    All of a claim's shares of one GPU are one MPS namespace (the engine asks
    the agent for this sum), and its containers get this as their dmem limit.
    """
    return sum(
        d.limits.memory_bytes
        for d in devices
        if d.mode is Mode.MPS and d.gpu_uuid == gpu_uuid and d.limits is not None
    )


def dmem_hook(
    settings: DmemHookSettings,
    gpu_uuid: GpuUUID,
    regions: Sequence[str],
    memory_bytes: int,
    soft_memory_bytes: int | None = None,
) -> Hook:
    """The ``createContainer`` hook that sets a container's dmem limits on one GPU.

    ``memory_bytes`` is the hard limit (``dmem.max``); ``soft_memory_bytes``,
    when given, the soft one (``dmem.min``): NVML defines a cgroup's soft limit
    as the memory "guaranteed before allocations may fail due to memory
    pressure" (``nvmlSetMemoryLimits_v1_t``). The hook sets both with
    ``nvidia-smi memory-limits -i <gpu_uuid>`` where the node's driver offers
    it, else by writing ``regions``' lines into the files (the script's header
    says why). The plan passes the claim's ``mps.memorySoftLimit``; without
    one the arguments are those of a hard limit alone.
    """
    args = ["dmem-hook.sh"]
    if settings.strict:
        args.append("--strict")
    if settings.log_path:
        args += ["--log", settings.log_path]
    args += ["--gpu", gpu_uuid, "--max", str(memory_bytes)]
    if soft_memory_bytes is not None:
        args += ["--min", str(soft_memory_bytes)]
    return Hook(
        hook_name="createContainer",
        path=settings.hook_path,
        args=(*args, "--", *regions),
        timeout=settings.timeout_s,
    )


def mps_soft_memory_on(
    devices: Sequence[PlannedDevice], soft_limits: Sequence[int | None], gpu_uuid: GpuUUID
) -> int | None:
    """A claim's soft memory limit on one GPU: the sum of its shares' there (None: none asked).

    Summed like :func:`mps_memory_on`'s hard limits (``count > 1`` on one GPU
    is one namespace and one cgroup limit for the claim's containers); a share
    without a soft limit adds nothing, so the sum stays at most the hard sum.
    """
    asked = [
        soft
        for device, soft in zip(devices, soft_limits, strict=True)
        if device.mode is Mode.MPS and device.gpu_uuid == gpu_uuid and soft is not None
    ]
    return sum(asked) if asked else None


def _with_dmem_hooks(
    cdi_devices: Sequence[CdiDevice],
    planned: Sequence[PlannedDevice],
    soft_limits: Sequence[int | None],
    dmem: DmemHookSettings,
) -> list[CdiDevice]:
    """Each MPS share of a GPU with dmem regions gets the hook with the claim's memory
    there (and its soft limit, when asked). A GPU without regions gets none, so a soft
    limit asked there has no effect; nothing is logged per claim."""
    out = []
    for cdi, device in zip(cdi_devices, planned, strict=True):
        regions = dmem.regions.get(device.gpu_uuid, ())
        if device.mode is not Mode.MPS or device.mig is not None or not regions:
            # (dmem accounting is for GPUs without MIG: dra-facts 10.1.)
            out.append(cdi)
            continue
        # count > 1 on one GPU: the claim's hard limits there are summed, and so
        # are its soft limits (one namespace, one dmem limit per container).
        hook = dmem_hook(
            dmem,
            device.gpu_uuid,
            regions,
            mps_memory_on(planned, device.gpu_uuid),
            mps_soft_memory_on(planned, soft_limits, device.gpu_uuid),
        )
        out.append(CdiDevice(cdi.name, merge_edits(cdi.edits, ContainerEdits(hooks=(hook,)))))
    return out


def _mig_plan(
    target: MigTarget,
    device: DeviceName,
    mode: Mode,
    claim: ResourceClaim,
    in_use: Mapping[DeviceName, Sequence[DeviceUse]],
) -> MigPlan:
    """The instance to use: the one that exists, else (an MPS share) the one another
    prepared claim's share of this placement already uses, else one to create."""
    existing = target.existing
    if existing is None and mode is Mode.MPS:
        joined = sorted(
            (u.claim_uid, u.mig)
            for u in in_use.get(device, ())
            if u.mode is Mode.MPS
            and u.claim_uid != claim.ref.uid
            and u.mig is not None
            and u.mig.mig_uuid is not None
        )
        if joined:
            # Not ours to destroy: the claim that made it (or inherits it) does.
            return dataclasses.replace(joined[0][1], created=False)
    return MigPlan(
        profile_id=target.profile_id,
        profile_name=target.profile_name,
        placement_start=target.placement.start,
        placement_size=target.placement.size,
        mig_uuid=existing.uuid if existing is not None else None,
        gi_id=existing.gi_id if existing is not None else None,
        ci_id=existing.ci_id if existing is not None else None,
    )


def _gpu_edits(gpu: GpuInfo, fake: bool) -> ContainerEdits:
    if fake:
        return ContainerEdits(device_nodes=(fake_device_node(gpu.device_node),))
    return ContainerEdits(
        device_nodes=(DeviceNode(gpu.device_node, major=NVIDIA_MAJOR, minor=gpu.minor),),
    )
