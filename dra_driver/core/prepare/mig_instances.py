"""Which MIG instances a half-done prepare may have left (pure).

After a crash the engine destroys, for each device of a rolled-back claim,
the instance the claim made (``created``), or the instance now found at a
placement that was planned free (the prepare died after making it, before
recording it). An instance that existed before the claim is never listed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.model import Inventory
from dra_driver.core.prepare.devices import MigInstance, MpsInMig, PlannedDevice


@dataclass(frozen=True)
class LeftoverMig:
    """A MIG instance to destroy: GPU instance ``gi_id`` on ``gpu_uuid``."""

    gpu_uuid: GpuUUID
    gi_id: int
    found: MigUUID | None = None
    """Set when it was found at a planned placement (not recorded as ``created``)."""


def leftover_mig_instances(
    devices: Sequence[PlannedDevice], inventory: Inventory
) -> tuple[LeftoverMig, ...]:
    """The instances of ``devices`` (one claim's) to destroy, in device order."""
    out: list[LeftoverMig] = []
    for device in devices:
        if not isinstance(device, MigInstance | MpsInMig):
            continue  # (an admin's MIG device is never made for it)
        plan = device.mig
        if plan.created and plan.instance is not None:
            out.append(LeftoverMig(device.gpu_uuid, plan.instance.gi_id))
            continue
        if plan.instance is not None:
            continue  # an instance that existed before: not ours
        for gpu in inventory.gpus:
            for found in gpu.mig_devices if gpu.uuid == device.gpu_uuid else ():
                if (found.profile_id, found.placement.start) == (
                    plan.profile_id,
                    plan.placement_start,
                ):
                    out.append(LeftoverMig(gpu.uuid, found.gi_id, found.uuid))
    return tuple(out)
