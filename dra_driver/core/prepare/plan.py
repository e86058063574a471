"""What a claim gets on this node: ``plan_prepare`` is pure and deterministic.

The kubelet may call NodePrepareResources for one claim many times (after a
kubelet restart, after a partial failure); the same claim, inventory and node
must always give the same plan, so a repeat writes the same CDI spec and
returns the same device ids. Nothing here reads clocks, files or the API.

Each allocated device becomes one variant of :data:`~.devices.PlannedDevice`:
the whole GPU (:class:`~.devices.Exclusive`, a result without a ``shareID``),
an MPS share (:class:`~.devices.MpsShare`) with the memory and SM limits
granted by the allocation (``consumedCapacity`` on the native path, the
controller's ``GpuShareGrant`` otherwise) and lowered by the claim's
``GpuConfig``, a time-sliced share (:class:`~.devices.TimeSliced`, no limits), a
MIG device (:class:`~.devices.MigInstance`: an existing instance, or a placement
to create at prepare), an MPS share of a MIG instance
(:class:`~.devices.MpsInMig`), or admin access (:class:`~.devices.Admin`). The
sharing strategy is the GPU's node setting, never the claim's. The plan also
guards the node (:mod:`.node_guards`): an exclusive device already prepared for
another claim, or MPS shares whose memory would not fit the GPU, fail the claim.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.base.errors import (
    AllocationError,
    ClaimNotAllocatedError,
    ClaimNotOnNodeError,
    InvalidConfigError,
)
from dra_driver.base.ids import DeviceName, PoolName
from dra_driver.core.cdi import (
    CdiDevice,
    CdiSpec,
    ContainerEdits,
    DeviceNode,
    fake_device_node,
    merge_edits,
)
from dra_driver.core.model import DeviceResult, GpuInfo, Inventory, ResourceClaim
from dra_driver.core.prepare.configs import effective_config, limits_for, trusted_grant
from dra_driver.core.prepare.devices import (
    Admin,
    CommonFields,
    Exclusive,
    HeldDevice,
    MigInstance,
    Mode,
    MpsInMig,
    MpsLimits,
    MpsShare,
    PlannedDevice,
    PreparePlan,
    TimeSliced,
    limits_of,
)
from dra_driver.core.prepare.dmem_hooks import DmemHookSettings, with_dmem_hooks
from dra_driver.core.prepare.mig_planning import (
    mig_plan,
    mig_shared,
    share_mig_plan,
    usable_memory,
)
from dra_driver.core.prepare.node_guards import check_conflicts, check_fits, check_own_results
from dra_driver.core.published import MigTarget, mig_targets
from dra_driver.core.settings import NodeSettings, Sharing

NVIDIA_MAJOR = 195
"""Character-device major of /dev/nvidia<N> and /dev/nvidiactl (fixed by the driver)."""
NVIDIACTL_MINOR = 255

_MODE_STRENGTH = (Mode.ADMIN, Mode.TIME_SLICED, Mode.MPS, Mode.MIG, Mode.EXCLUSIVE)


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


def plan_prepare(
    claim: ResourceClaim,
    inventory: Inventory,
    ctx: NodeContext,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]] | None = None,
) -> PreparePlan:
    """Compute what ``claim`` gets on this node, or raise a ClaimError saying why not."""
    results = _our_results(claim, ctx)
    # One planned device per (device, shareID): two requests that landed on the
    # same device (or share) are one device with both request names.
    groups: dict[tuple[DeviceName, str | None], list[DeviceResult]] = {}
    for result in results:
        groups.setdefault((result.device, result.share_id), []).append(result)

    check_own_results(claim, groups)

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
        name = cdi_device_name(claim.ref.uid, device, share_id)
        at: CommonFields = (
            tuple(sorted({r.main_request for r in group})),
            ctx.pool_name,
            device,
            share_id,
            gpu.uuid,
            (f"{ctx.cdi_kind}={name}",),
        )
        planned_device, soft = _plan_device(
            at, claim, group=group, gpu=gpu, target=target, ctx=ctx, in_use=in_use or {}
        )
        planned.append(planned_device)
        soft_limits.append(soft)
        cdi_devices.append(CdiDevice(name=name, edits=_gpu_edits(gpu, ctx.fake_device_nodes)))
    if ctx.dmem is not None:
        cdi_devices = with_dmem_hooks(cdi_devices, planned, soft_limits, ctx.dmem)
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


def _plan_device(
    at: CommonFields,
    claim: ResourceClaim,
    *,
    group: Sequence[DeviceResult],
    gpu: GpuInfo,
    target: MigTarget | None,
    ctx: NodeContext,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]],
) -> tuple[PlannedDevice, int | None]:
    """The device ``group`` (results of one device and shareID) gives, checked against
    what the node holds; and its soft memory limit (an MPS share's, or None)."""
    usable = usable_memory(gpu, target, ctx.settings)
    planned, soft = _choose(
        at, claim, group=group, gpu=gpu, target=target, usable=usable, ctx=ctx, in_use=in_use
    )
    check_conflicts(claim, planned, in_use)
    if (share := limits_of(planned)) is not None:
        check_fits(
            claim, device=at[2], usable=usable, limits=share, settings=ctx.settings, in_use=in_use
        )
    return planned, soft


def _choose(
    at: CommonFields,
    claim: ResourceClaim,
    *,
    group: Sequence[DeviceResult],
    gpu: GpuInfo,
    target: MigTarget | None,
    usable: int,
    ctx: NodeContext,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]],
) -> tuple[PlannedDevice, int | None]:
    """The variant ``group`` gives (and an MPS share's soft memory limit)."""
    device, share_id = at[2], at[3]
    # The strongest use wins when two results name one device.
    mode = max((_mode(r, gpu, target, ctx, claim) for r in group), key=_MODE_STRENGTH.index)
    if mode is Mode.MPS:
        limits, soft = _limits(claim, group, usable, ctx)
        if not _takes_all(claim, group, limits, usable, ctx):
            if target is not None:
                mig = share_mig_plan(target, device, claim.ref.uid, in_use)
                return MpsInMig(*at, limits=limits, mig=mig), soft
            grant = _grant_share_id(claim, group, ctx) if share_id is None else None
            return MpsShare(*at, limits=limits, grant_share_id=grant), soft
        # No other share can fit beside it (the scheduler gives a claim that asks no
        # amount the request policy's default: all the memory): the whole GPU (or
        # MIG instance), no MPS client with a limit that changes nothing.
    match mode:
        case Mode.ADMIN:
            return Admin(*at, mig=mig_plan(target) if target is not None else None), None
        case Mode.TIME_SLICED:
            grant = _grant_share_id(claim, group, ctx) if share_id is None else None
            return TimeSliced(*at, grant_share_id=grant), None
        case _ if target is not None:
            return MigInstance(*at, mig=mig_plan(target)), None
        case _:
            return Exclusive(*at), None


def _takes_all(
    claim: ResourceClaim,
    group: Sequence[DeviceResult],
    limits: MpsLimits,
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
        if result.share_id and mig_shared(gpu, target, ctx.settings):
            return Mode.MPS
        return Mode.MIG
    if not result.share_id and not _has_grant(result, claim, ctx):
        return Mode.EXCLUSIVE
    sharing = ctx.settings.for_gpu(gpu.index, gpu.uuid).sharing
    if sharing is Sharing.MPS:
        return Mode.MPS
    if sharing is Sharing.TIMESLICING:
        return Mode.TIME_SLICED
    raise AllocationError(
        claim.ref,
        f"the allocation holds a share of {gpu.device_name}, but this node does not share "
        f"it (sharing={sharing.value}); delete the claim so it is allocated again",
    )


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
) -> tuple[MpsLimits, int | None]:
    """The share's limits: what the allocation granted, lowered by the claim's config;
    and the soft memory limit its config asks for (``mps.memorySoftLimit``), or None.

    The soft limit is kept out of :class:`MpsLimits` (which the checkpoint
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
    return MpsLimits(memory_bytes=memory, compute_percent=percent), soft


def _gpu_edits(gpu: GpuInfo, fake: bool) -> ContainerEdits:
    if fake:
        return ContainerEdits(device_nodes=(fake_device_node(gpu.device_node),))
    return ContainerEdits(
        device_nodes=(DeviceNode(gpu.device_node, major=NVIDIA_MAJOR, minor=gpu.minor),),
    )
