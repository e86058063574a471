"""gpu-check's ``mig`` and ``mig-compute-mode`` steps (I/O): one MIG device of the
smallest profile created at a free placement, seen in a new inventory, destroyed,
and seen gone; while it exists, ``nvidia-smi -c EXCLUSIVE_PROCESS`` tried on the
GPU in MIG mode and on that MIG device, each put back as it was."""

from __future__ import annotations

import asyncio

from dra_driver.app.gpu_check.config import CheckConfig
from dra_driver.app.gpu_check.decide import Outcome, judge_compute_mode, pick_mig
from dra_driver.app.gpu_check.transcript import Runner, Transcript, run_command
from dra_driver.base.ids import GpuUUID
from dra_driver.core.model import Inventory
from dra_driver.core.ports import GpuBackend
from dra_driver.mpsagent.compute_mode import ComputeModeError, parse_mode


async def mig_step(
    backend: GpuBackend, config: CheckConfig, transcript: Transcript, run: Runner = run_command
) -> None:
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
        await asyncio.to_thread(mig_compute_mode, gpu.uuid, made.uuid, config, transcript, run)
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


# docs/nvidia-interfaces.md: check-mig-compute-mode, mps-mig-compute-mode
def mig_compute_mode(
    gpu_uuid: str, mig_uuid: str, config: CheckConfig, transcript: Transcript, run: Runner
) -> None:
    """Can EXCLUSIVE_PROCESS be set where MPS runs inside MIG? On the GPU in MIG mode
    (a public transcript, NVIDIA/DCGM#82, shows nvidia-smi refusing it there) and on
    the MIG device (NVML's reference: with MIG on, the compute mode is a MIG
    device's; whether ``nvidia-smi -i MIG-<uuid> -c`` reaches it is undocumented).
    Judged by the mode read back; each is put back to the mode it had."""
    transcript.step("mig-compute-mode")
    smi = config.nvidia_smi
    results: list[str] = []
    broken: list[str] = []
    for what, uuid in (("the GPU in MIG mode", gpu_uuid), ("its MIG device", mig_uuid)):
        before = _mode(smi, uuid, config, transcript, run)
        ran = run((smi, "-i", uuid, "-c", "EXCLUSIVE_PROCESS"), config.base_env, None,
                  config.step_timeout_s)  # fmt: skip
        transcript.command(ran)
        after = _mode(smi, uuid, config, transcript, run)
        said = next((ln.strip() for ln in (ran.stdout + ran.stderr).splitlines() if ln.strip()), "")
        took, line = judge_compute_mode(what, before, after, said)
        results.append(line)
        if after is None:
            broken.append(f"the compute mode of {uuid} could not be read back")
        if took and before != "EXCLUSIVE_PROCESS":
            back = before or "DEFAULT"
            undo = run((smi, "-i", uuid, "-c", back), config.base_env, None, config.step_timeout_s)
            transcript.command(undo)
            if _mode(smi, uuid, config, transcript, run) != back:
                broken.append(
                    f"{uuid} is left in EXCLUSIVE_PROCESS: run nvidia-smi -i {uuid} -c {back}"
                )
    if broken:
        transcript.outcome("mig-compute-mode", Outcome.FAIL, "; ".join(results + broken))
    else:
        transcript.outcome("mig-compute-mode", Outcome.PASS, "; ".join(results))


def _mode(
    smi: str, uuid: str, config: CheckConfig, transcript: Transcript, run: Runner
) -> str | None:
    argv = (smi, "-i", uuid, "--query-gpu=compute_mode", "--format=csv,noheader")
    ran = run(argv, config.base_env, None, config.step_timeout_s)
    transcript.command(ran)
    lines = [ln for ln in ran.stdout.splitlines() if ln.strip()]
    if ran.returncode != 0 or len(lines) != 1:
        return None
    try:
        return parse_mode(lines[0])
    except ComputeModeError:
        return None
