"""The devices a node publishes, by name, and what each name stands for (pure).

Both the ResourceSlices (:mod:`dra_driver.core.slices`) and the device health
(:mod:`dra_driver.core.health`) name devices this way, and the prepare plan
(:mod:`dra_driver.core.prepare`) finds the MIG instance or placement a name
stands for; so the names live here, below all three.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dra_driver.base.ids import DeviceName
from dra_driver.core.model import GpuInfo, Inventory, MigDevice, MigPlacement, MigProfile


def free_placements(gpu: GpuInfo) -> list[tuple[MigProfile, MigPlacement]]:
    """Placements that overlap no MIG instance that exists now."""
    taken = [existing.placement for existing in gpu.mig_devices]
    return [
        (profile, placement)
        for profile in gpu.mig_profiles
        for placement in profile.placements
        if not any(placement.overlaps(other) for other in taken)
    ]


@dataclass(frozen=True)
class MigTarget:
    """What a published MIG device name stands for."""

    gpu: GpuInfo
    profile_id: int
    profile_name: str
    placement: MigPlacement
    existing: MigDevice | None
    """The instance, when it exists now; None for a placement to create at prepare."""


def mig_targets(inventory: Inventory) -> dict[DeviceName, MigTarget]:
    """Every MIG device name this node can publish: existing instances and free placements."""
    targets: dict[DeviceName, MigTarget] = {}
    for gpu in sorted(inventory.gpus, key=lambda g: g.index):
        if not gpu.mig_enabled:
            continue
        for d in gpu.mig_devices:
            name = DeviceName(mig_device_name(gpu, d.profile_name, d.profile_id, d.placement.start))
            targets[name] = MigTarget(gpu, d.profile_id, d.profile_name, d.placement, d)
        for profile, placement in free_placements(gpu):
            name = DeviceName(mig_device_name(gpu, profile.name, profile.id, placement.start))
            targets[name] = MigTarget(gpu, profile.id, profile.name, placement, None)
    return targets


def device_names(inventory: Inventory) -> list[DeviceName]:
    """Every device name this node can publish, whatever the cluster keeps.

    Whole GPUs without MIG, then the MIG targets. The health stream reports these.
    """
    whole = [gpu.device_name for gpu in sorted(inventory.gpus, key=lambda g: g.index)]
    mig_gpus = {gpu.device_name for gpu in inventory.gpus if gpu.mig_enabled}
    return [n for n in whole if n not in mig_gpus] + list(mig_targets(inventory))


def mig_device_name(gpu: GpuInfo, profile_name: str, profile_id: int, start: int) -> str:
    """``gpu-<index>-mig-<profile, alphanumerics only>-<profile id>-<start>``, a DNS label."""
    compact = re.sub(r"[^a-z0-9]", "", profile_name.lower())
    return f"gpu-{gpu.index}-mig-{compact}-{profile_id}-{start}"
