"""The plan's MIG questions (pure): what a device's MPS shares divide, whether a MIG
instance is MPS-shared, and which instance a MIG device (or a share of one) uses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from dra_driver.base.ids import ClaimUID, DeviceName
from dra_driver.core.model import GpuInfo
from dra_driver.core.prepare.devices import HeldDevice, MigInstanceIds, MigPlan, MpsInMig
from dra_driver.core.published import MigTarget
from dra_driver.core.settings import NodeSettings, Sharing
from dra_driver.core.slices import MIB, mig_share_policy


def usable_memory(gpu: GpuInfo, target: MigTarget | None, settings: NodeSettings) -> int:
    """What MPS shares of the device divide: a GPU's memory less the reserve, or a MIG
    instance's own memory (what its slices publish, :func:`mig_share_policy`)."""
    if target is None:
        return gpu.memory_bytes - settings.memory_reserve_bytes
    existing = target.existing
    if existing is not None and existing.memory_mib:
        return existing.memory_mib * MIB
    profile = next((p for p in gpu.mig_profiles if p.id == target.profile_id), None)
    return profile.memory_mib * MIB if profile is not None else 0


def mig_shared(gpu: GpuInfo, target: MigTarget, settings: NodeSettings) -> bool:
    """Whether the GPU shares its MIG instances with MPS and this one can be shared at all."""
    if settings.for_gpu(gpu.index, gpu.uuid).mig_sharing is not Sharing.MPS:
        return False
    profile = next((p for p in gpu.mig_profiles if p.id == target.profile_id), None)
    memory_mib = usable_memory(gpu, target, settings) // MIB
    return mig_share_policy(gpu, profile, memory_mib, settings) is not None


def mig_plan(target: MigTarget) -> MigPlan:
    """The instance ``target`` names: the one that exists, else one to create at prepare."""
    existing = target.existing
    return MigPlan(
        profile_id=target.profile_id,
        profile_name=target.profile_name,
        placement_start=target.placement.start,
        placement_size=target.placement.size,
        instance=(
            MigInstanceIds(existing.uuid, existing.gi_id, existing.ci_id)
            if existing is not None
            else None
        ),
    )


def share_mig_plan(
    target: MigTarget,
    device: DeviceName,
    claim_uid: ClaimUID,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]],
) -> MigPlan:
    """The instance an MPS share of ``target`` uses: the one that exists, else the one
    another prepared claim's share of this placement already uses, else one to create."""
    if target.existing is None:
        joined = sorted(
            (
                (held.claim_uid, held.device.mig)
                for held in in_use.get(device, ())
                if isinstance(held.device, MpsInMig)
                and held.claim_uid != claim_uid
                and held.device.mig.instance is not None
            ),
            key=lambda pair: pair[0],
        )
        if joined:
            # Not ours to destroy: the claim that made it (or inherits it) does.
            return dataclasses.replace(joined[0][1], created=False)
    return mig_plan(target)
