"""gpu-check's ``mig`` step (I/O): one MIG device of the smallest profile created at a
free placement, seen in a new inventory, destroyed, and seen gone."""

from __future__ import annotations

import asyncio

from dra_driver.app.gpu_check.config import CheckConfig
from dra_driver.app.gpu_check.decide import Outcome, pick_mig
from dra_driver.app.gpu_check.transcript import Transcript
from dra_driver.base.ids import GpuUUID
from dra_driver.core.model import Inventory
from dra_driver.core.ports import GpuBackend


async def mig_step(backend: GpuBackend, config: CheckConfig, transcript: Transcript) -> None:
    transcript.step("mig")
    before = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
    choice = pick_mig(before.gpus)
    if isinstance(choice, str):
        transcript.outcome("mig", Outcome.SKIP, choice)
        return
    gpu, profile = choice.gpu, choice.profile
    where = f"{choice.placement.start}+{choice.placement.size}"
    transcript.say(
        f"create: GPU {gpu.uuid}, GPU-instance profile {profile.id} ({profile.name}) at "
        f"placement {where}, compute instance over all of it"
    )
    try:
        made = await asyncio.wait_for(
            backend.create_mig_device(gpu.uuid, profile.id, choice.placement),
            config.step_timeout_s,
        )
    except Exception as err:  # reported, never raised: the check goes on
        transcript.outcome("mig", Outcome.FAIL, f"creating the MIG device failed: {err}")
        return
    transcript.say(f"made {made.uuid} (GI {made.gi_id}, CI {made.ci_id}, {made.memory_mib} MiB)")
    outcome, why = Outcome.PASS, "created, listed, destroyed, gone"
    try:
        listed = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
        if made.uuid not in _mig_uuids(listed, gpu.uuid):
            outcome, why = Outcome.FAIL, f"{made.uuid} is not in the next inventory"
    finally:
        try:
            await asyncio.wait_for(
                backend.destroy_mig_device(gpu.uuid, made.gi_id), config.step_timeout_s
            )
            transcript.say(f"destroyed GPU instance {made.gi_id}")
            after = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
            if made.uuid in _mig_uuids(after, gpu.uuid):
                outcome, why = Outcome.FAIL, f"{made.uuid} is still listed after destroy"
        except Exception as err:  # reported: the operator must clean up by hand
            outcome, why = Outcome.FAIL, f"destroying GPU instance {made.gi_id} failed: {err}"
    transcript.outcome("mig", outcome, why)


def _mig_uuids(inventory: Inventory, gpu_uuid: GpuUUID) -> set[str]:
    return {d.uuid for g in inventory.gpus if g.uuid == gpu_uuid for d in g.mig_devices}
