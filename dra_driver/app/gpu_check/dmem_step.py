"""gpu-check's ``dmem`` step (I/O): where the kernel has the dmem controller and a
region for the GPU and the root cgroup already delegates ``+dmem``, a child cgroup
with a hard limit (``nvidia-smi memory-limits``) and the CUDA client inside it."""

from __future__ import annotations

import os

from dra_driver.app.gpu_check.config import CheckConfig
from dra_driver.app.gpu_check.decide import MIB, Outcome, client_env, client_sizes, judge_client
from dra_driver.app.gpu_check.transcript import Runner, Transcript
from dra_driver.core.model import GpuInfo
from dra_driver.gpu.dmem import detect_dmem


# docs/nvidia-interfaces.md: check-dmem-cgroup, dmem-set-nvidia-smi
def dmem_step(gpu: GpuInfo, config: CheckConfig, transcript: Transcript, run: Runner) -> None:
    transcript.step("dmem")
    found = detect_dmem([gpu], config.cgroup_root)
    for note in found.notes:
        transcript.say(note)
    regions = found.regions.get(gpu.uuid)
    if not regions:
        transcript.outcome("dmem", Outcome.SKIP, "no dmem region for this GPU")
        return
    subtree = os.path.join(config.cgroup_root, "cgroup.subtree_control")
    try:
        with open(subtree) as f:
            delegated = "dmem" in f.read().split()
    except OSError as err:
        transcript.outcome("dmem", Outcome.SKIP, f"cannot read {subtree}: {err}")
        return
    if not delegated:
        transcript.outcome(
            "dmem", Outcome.SKIP, f"{subtree} has no dmem (the check does not change it)"
        )
        return
    cgroup = os.path.join(config.cgroup_root, f"fgd-gpu-check-{os.getpid()}")
    os.mkdir(cgroup)
    limit_mib = config.memory_limit_bytes // MIB
    smi = (config.nvidia_smi, "memory-limits", "-i", gpu.uuid, "-n", cgroup)
    try:
        ran = run((*smi, "--soft-limit", "0", "--hard-limit", str(limit_mib)), config.base_env,
                  None, config.step_timeout_s)  # fmt: skip
        transcript.command(ran)
        if ran.returncode != 0:
            transcript.outcome("dmem", Outcome.FAIL, "nvidia-smi memory-limits refused")
            return
        env = client_env(config.base_env, gpu)
        below, above = client_sizes(config.memory_limit_bytes)
        into = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        argv = ("sh", "-c", into, cgroup, *config.client, "--below", str(below),
                "--above", str(above))  # fmt: skip
        ran = run(argv, env, None, config.step_timeout_s)
        transcript.command(ran)
        outcome, why = judge_client(ran.stdout, config.memory_limit_bytes)
        transcript.outcome("dmem", outcome, why)
    finally:
        reset = run((*smi, "--soft-limit", "0", "--hard-limit", "max"), config.base_env, None,
                    config.step_timeout_s)  # fmt: skip
        transcript.command(reset)
        try:
            os.rmdir(cgroup)
        except OSError as err:
            transcript.say(f"could not remove {cgroup}: {err}; remove it by hand")
