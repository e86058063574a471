"""``dra-driver gpu-check``: what this driver asks of NVIDIA, tried once on a real GPU.

Nothing of this project has run on a GPU, so every NVIDIA-facing action rests on
the docs (docs/nvidia-interfaces.md). This check makes each of those calls once,
with the real NVML and MPS binaries, and prints a transcript (each command, its
output, PASS/FAIL/SKIP) that can go into that document:

1. ``discover``: the NVML inventory the plugin publishes (GPUs, MIG mode, profiles);
2. ``mig``: where a GPU is already in MIG mode (it never toggles MIG mode), one MIG
   device of its smallest profile created at a free placement, seen in a new
   inventory, destroyed, and seen gone; while it exists, ``mig-compute-mode``:
   whether ``nvidia-smi -c EXCLUSIVE_PROCESS`` takes on the GPU and on the MIG
   device (read back, put back);
3. ``mps``: on a GPU without MIG (after ``control-help``, the tool's ``-h``), an
   MPS control daemon as the mps-agent starts it
   (v3 where the driver is 615 or newer, else legacy) in a temporary pipe
   directory, and one share's limits (a namespace with a memory and SM limit in
   v3; the daemon defaults and client caps in legacy), sent as the agent sends
   them (:mod:`dra_driver.mpsagent.commands`);
4. ``client``: a tiny CUDA client (:mod:`dra_driver.gpu.cuda_client`) in that
   share allocates below and above the memory limit: below must work, above fail;
   v3 also ``client-own-shm`` (the client with a /dev/shm of its own) and
   ``tenant`` (:mod:`.tenant_step`: what a process with only its namespace's
   directory can do through it; a security finding fails the check);
5. ``dmem``: where the kernel has the dmem controller and a region for the GPU
   and the root cgroup already delegates ``+dmem``, a child cgroup with a hard
   limit (``nvidia-smi memory-limits`` where offered) and the client inside it.

It changes nothing it does not undo: the daemon is stopped and its directory
removed, the MIG device destroyed, a compute mode it changed put back, the
cgroup's limits reset and the cgroup removed, whatever failed. Each command has a
timeout (``step_timeout_s``).

What each step sends is in docs/nvidia-interfaces.md (rows ``nvml-*``,
``mps-*``, ``dmem-set-nvidia-smi``, ``cuda-client``, ``check-dmem-cgroup``), with
how to run the check and where its transcripts go.

The steps' decisions are pure (:mod:`.decide`: :func:`pick_mig`, :func:`pick_mps_gpu`,
:func:`client_sizes`, :func:`judge_client`); the steps do the I/O (:mod:`.mig_step`,
:mod:`.mps_step`, :mod:`.dmem_step`, in turn from :func:`run_check` in :mod:`.check`)
through an injected backend and command runner (:mod:`.transcript`), so tests
drive it with the fake NVML, the packaged fake ``nvidia-cuda-mps-control`` and a
fake client.
"""

from dra_driver.app.gpu_check.check import check_gpus, run_check
from dra_driver.app.gpu_check.config import CheckConfig
from dra_driver.app.gpu_check.decide import (
    CHECK_SHARE_ID,
    GIB,
    MIB,
    MigChoice,
    Outcome,
    client_sizes,
    judge_client,
    pick_mig,
    pick_mps_gpu,
)
from dra_driver.app.gpu_check.transcript import Ran, Runner, Transcript, run_command

__all__ = [
    "CHECK_SHARE_ID",
    "GIB",
    "MIB",
    "CheckConfig",
    "MigChoice",
    "Outcome",
    "Ran",
    "Runner",
    "Transcript",
    "check_gpus",
    "client_sizes",
    "judge_client",
    "pick_mig",
    "pick_mps_gpu",
    "run_check",
    "run_command",
]
