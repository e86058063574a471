"""gpu-check from start to end (I/O): ``discover``, then each step in turn."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable

from dra_driver.app.gpu_check.config import CheckConfig
from dra_driver.app.gpu_check.decide import Outcome, gpu_line, pick_mps_gpu
from dra_driver.app.gpu_check.dmem_step import dmem_step
from dra_driver.app.gpu_check.mig_step import mig_step
from dra_driver.app.gpu_check.mps_step import mps_steps
from dra_driver.app.gpu_check.transcript import Runner, Transcript, run_command
from dra_driver.core.ports import GpuBackend
from dra_driver.gpu.nvml import NvmlGpuBackend


async def run_check(
    backend: GpuBackend,
    config: CheckConfig,
    transcript: Transcript,
    run: Runner = run_command,
    start: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
) -> Transcript:
    """Every step in turn; returns the transcript (``failed`` says whether one failed)."""
    transcript.step("discover")
    try:
        inventory = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
    except Exception as err:  # the check reports every failure, whatever its kind
        transcript.outcome("discover", Outcome.FAIL, f"NVML inventory failed: {err}")
        return transcript
    for gpu in inventory.gpus:
        transcript.say(gpu_line(gpu))
    if not inventory.gpus:
        transcript.outcome("discover", Outcome.FAIL, "NVML lists no GPU")
        return transcript
    transcript.outcome("discover", Outcome.PASS, f"{len(inventory.gpus)} GPU(s)")
    if config.mig:
        await mig_step(backend, config, transcript, run)
    mps_gpu = pick_mps_gpu(inventory.gpus)
    if mps_gpu is None:
        for name in ("mps", "client", "client-own-shm", "tenant", "dmem"):
            transcript.outcome(name, Outcome.SKIP, "every GPU is in MIG mode")
        return transcript
    mps_steps(mps_gpu, config, transcript, run, start)
    dmem_step(mps_gpu, config, transcript, run)
    return transcript


def check_gpus(config: CheckConfig) -> int:
    """The check on this node's GPUs through NVML; 1 when a step failed, else 0."""

    async def checked() -> Transcript:
        backend = NvmlGpuBackend()
        try:
            return await run_check(backend, config, Transcript())
        finally:
            await backend.close()

    transcript = asyncio.run(checked())
    failed = [name for name, o in transcript.outcomes.items() if o is Outcome.FAIL]
    transcript.say(f"== result: {'FAIL: ' + ', '.join(failed) if failed else 'PASS'}")
    return 1 if failed else 0
