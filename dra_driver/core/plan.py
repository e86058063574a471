"""What a claim gets on this node: ``plan_prepare`` is pure and deterministic.

The kubelet may call NodePrepareResources for one claim many times (after a
kubelet restart, after a partial failure); the same claim, inventory and node
must always give the same plan, so a repeat writes the same CDI spec and
returns the same device ids. Nothing here reads clocks, files or the API.

This foundation enforces one mode, an exclusive whole GPU: the GPU's device
node plus the control node. Results that carry a ``shareID`` (consumable
capacity) or ``adminAccess`` are given the same device access, recorded with
their mode, without per-share limits; the enforcement issue adds MPS, MIG and
time-slicing plans.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_driver.core.cdi import CdiDevice, CdiSpec, ContainerEdits, DeviceNode
from dra_driver.core.errors import (
    AllocationError,
    ClaimNotAllocatedError,
    ClaimNotOnNodeError,
)
from dra_driver.core.ids import ClaimUID, DeviceName, GpuUUID, PoolName
from dra_driver.core.model import DeviceResult, GpuInfo, Inventory, ResourceClaim

NVIDIA_MAJOR = 195
"""Character-device major of /dev/nvidia<N> and /dev/nvidiactl (fixed by the driver)."""
NVIDIACTL_MINOR = 255


class Mode(enum.StrEnum):
    """How a device is handed to a claim."""

    EXCLUSIVE = "exclusive"
    """The whole GPU, held by this claim alone."""
    SHARED = "shared"
    """A share (result with shareID); limits arrive with the enforcement issue."""
    ADMIN = "admin"
    """adminAccess: monitoring access that holds nothing."""


_MODE_STRENGTH = (Mode.ADMIN, Mode.SHARED, Mode.EXCLUSIVE)


@dataclass(frozen=True)
class NodeContext:
    """Who we are on this node."""

    driver_name: str
    node_name: str
    pool_name: PoolName
    cdi_kind: str


@dataclass(frozen=True)
class PlannedDevice:
    request_names: tuple[str, ...]
    pool_name: PoolName
    device_name: DeviceName
    share_id: str | None
    gpu_uuid: GpuUUID
    mode: Mode
    cdi_device_ids: tuple[str, ...]


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


def _mode(result: DeviceResult) -> Mode:
    if result.admin_access:
        return Mode.ADMIN
    return Mode.SHARED if result.share_id else Mode.EXCLUSIVE


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
        if mode is Mode.EXCLUSIVE or use.mode is Mode.EXCLUSIVE:
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
        if any(_mode(r) is Mode.EXCLUSIVE for r in group):
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
    for (device, share_id), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
    ):
        gpu = inventory.gpu_by_device(device)
        if gpu is None:
            known = ", ".join(g.device_name for g in inventory.gpus) or "none"
            raise AllocationError(
                claim.ref,
                f"device {device} is not on this node (devices here: {known}); "
                "the allocation is stale: delete the claim so it is allocated again",
            )
        # The strongest use wins when two results name one device.
        mode = max((_mode(r) for r in group), key=_MODE_STRENGTH.index)
        _check_conflicts(claim, device, mode, in_use or {})
        name = cdi_device_name(claim.ref.uid, device, share_id)
        cdi_devices.append(CdiDevice(name=name, edits=_gpu_edits(gpu)))
        planned.append(
            PlannedDevice(
                request_names=tuple(sorted({r.main_request for r in group})),
                pool_name=ctx.pool_name,
                device_name=device,
                share_id=share_id,
                gpu_uuid=gpu.uuid,
                mode=mode,
                cdi_device_ids=(f"{ctx.cdi_kind}={name}",),
            )
        )
    spec = CdiSpec(
        kind=ctx.cdi_kind,
        devices=tuple(cdi_devices),
        common_edits=ContainerEdits(
            device_nodes=(DeviceNode("/dev/nvidiactl", major=NVIDIA_MAJOR, minor=NVIDIACTL_MINOR),)
        ),
    )
    return PreparePlan(claim_uid=claim.ref.uid, devices=tuple(planned), cdi_spec=spec)


def _gpu_edits(gpu: GpuInfo) -> ContainerEdits:
    return ContainerEdits(
        device_nodes=(DeviceNode(gpu.device_node, major=NVIDIA_MAJOR, minor=gpu.minor),),
    )
