"""gpu-check's decisions (pure): which GPU and MIG placement to try, how big the
client's allocations are, and whether its result passes."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_driver.core.model import GpuInfo, MigPlacement, MigProfile

GIB = 1 << 30
MIB = 1 << 20
CHECK_SHARE_ID = "gpucheck"
CUDA_SUCCESS = 0
CUDA_ERROR_MEMORY_ALLOCATION = 2


class Outcome(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class MigChoice:
    gpu: GpuInfo
    profile: MigProfile
    placement: MigPlacement


def pick_mig(gpus: Sequence[GpuInfo]) -> MigChoice | str:
    """The first GPU in MIG mode, its smallest profile at a free placement; else why not."""
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return "no GPU is in MIG mode (the check never toggles MIG mode)"
    for gpu in enabled:
        taken = [d.placement for d in gpu.mig_devices]
        profiles = sorted(
            (p for p in gpu.mig_profiles if "+" not in p.name and p.placements),
            key=lambda p: (p.memory_slices, p.compute_slices, p.id),
        )
        for profile in profiles:
            for placement in profile.placements:
                if not any(placement.overlaps(t) for t in taken):
                    return MigChoice(gpu, profile, placement)
    return "every GPU in MIG mode is full: no free placement for any profile"


def pick_mps_gpu(gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """A GPU not in MIG mode (v3 namespaces are documented for such GPUs only)."""
    return next((g for g in gpus if not g.mig_enabled), None)


def client_sizes(limit_bytes: int) -> tuple[int, int]:
    """Below: half the limit (room for the client's own context); above: 1.5 times."""
    return limit_bytes // 2, limit_bytes + limit_bytes // 2


def judge_client(stdout: str, limit_bytes: int) -> tuple[Outcome, str]:
    """The client's JSON line: the allocation below must work, the one above fail."""
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else {"error": "it printed no result"}
    except ValueError:
        result = {"error": f"its result is not JSON: {lines[-1]!r}"}
    below, above = result.get("below"), result.get("above")
    checks = (
        ("error" in result, f"the client could not run: {result.get('error')}"),
        (
            result.get("set_device") != CUDA_SUCCESS,
            f"cudaSetDevice(0) returned {result.get('set_device')}",
        ),
        (
            below != CUDA_SUCCESS,
            f"allocating below the {limit_bytes}-byte limit failed ({below})",
        ),
        (
            above == CUDA_SUCCESS,
            f"allocating above the {limit_bytes}-byte limit worked",
        ),
        (
            above != CUDA_ERROR_MEMORY_ALLOCATION,
            f"above the limit: {above}, not cudaErrorMemoryAllocation (2)",
        ),
    )
    problem = next((why for wrong, why in checks if wrong), None)
    if problem is not None:
        return Outcome.FAIL, problem
    seen = f"SMs {result.get('sms')}, cudaMemGetInfo total {result.get('total')}"
    return Outcome.PASS, f"below worked, above failed with cudaErrorMemoryAllocation; {seen}"


def gpu_line(gpu: GpuInfo) -> str:
    mig = "MIG on" if gpu.mig_enabled else ("MIG capable, off" if gpu.mig_capable else "no MIG")
    return (
        f"GPU {gpu.index} {gpu.uuid} {gpu.product_name}, {gpu.memory_bytes // MIB} MiB, "
        f"PCI {gpu.pci_bus_id}, driver {gpu.driver_version}, CUDA {gpu.cuda_driver_version}, "
        f"{mig}, {len(gpu.mig_devices)} MIG device(s)"
    )


def client_env(base: Mapping[str, str], gpu: GpuInfo) -> dict[str, str]:
    """The client's environment: no MPS settings of ours leaking in, only its GPU."""
    env = {k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")}
    env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    return env


# -- the tenant's view (a v3 share's container: only its namespace's directory) -----

OTHER_SHARE_ID = "gpucheck_other"
"""The second namespace the check makes, whose limits the tenant tries to change."""
OTHER_PERCENTAGE = 10
"""The second namespace's SM percentage; the tenant asks for 100."""


@dataclass(frozen=True)
class TenantFinding:
    """What a process with only one namespace's directory could do, and the evidence."""

    action: str
    could: bool
    evidence: str


def tenant_env(
    base: Mapping[str, str], gpu: GpuInfo, namespace_dir: str, logs: str
) -> dict[str, str]:
    """A tenant container's view: its namespace's directory as the pipe directory.

    ``CUDA_MPS_PROTOCOL_VERSION=3`` as a tenant may set it (the worst case: the
    tool speaks v3 whatever it finds); ``CUDA_MPS_LOG_DIRECTORY`` only keeps what
    the control tool may write inside the check's temporary directory.
    """
    env = client_env(base, gpu)
    env["CUDA_MPS_PIPE_DIRECTORY"] = namespace_dir
    env["CUDA_MPS_PROTOCOL_VERSION"] = "3"
    env["CUDA_MPS_LOG_DIRECTORY"] = logs
    return env


def judge_tenant_listing(action: str, returncode: int, stdout: str, expected: str) -> TenantFinding:
    """A listing the tenant ran: it could when it exited 0 and named ``expected``
    (the check's server or namespace), i.e. it reached the daemon's state."""
    could = returncode == 0 and expected in stdout
    seen = (
        f"exit status {returncode}, {'names' if expected in stdout else 'does not name'} {expected}"
    )
    return TenantFinding(action, could, seen)


def judge_tenant_set(
    before: tuple[int | None, float | None] | None,
    after: tuple[int | None, float | None] | None,
    wanted: tuple[int, float],
    returncode: int,
) -> TenantFinding:
    """``namespace set`` of the other namespace: it could when the daemon's listing
    (read with the daemon's own pipe directory) shows the values the tenant sent
    where they were not before. The exit status alone is not trusted."""
    action = "set another namespace's limits"
    changed = after == wanted and before != wanted
    evidence = f"exit status {returncode}; the other namespace's (memory, SM %) {before} -> {after}"
    return TenantFinding(action, changed, evidence)


def judge_tenant_quit(returncode: int, daemon_exited: bool) -> TenantFinding:
    """``-q`` from the tenant's directory: it could when the daemon exited."""
    state = "exited" if daemon_exited else "still runs"
    return TenantFinding(
        "quit the daemon", daemon_exited, f"exit status {returncode}; the daemon {state}"
    )


def judge_tenant(findings: list[TenantFinding]) -> tuple[Outcome, list[str]]:
    """FAIL, with a SECURITY banner, when the tenant could do any of them; else PASS."""
    could = [f for f in findings if f.could]
    lines = [f"tenant {'CAN' if f.could else 'cannot'} {f.action}: {f.evidence}" for f in findings]
    if could:
        banner = (
            "!! SECURITY: a process that has only its own namespace's directory (as a v3 "
            "share's container has) can " + ", ".join(f.action for f in could) + " !!"
        )
        return Outcome.FAIL, [banner, *lines, banner]
    return Outcome.PASS, lines


# -- compute mode on a GPU in MIG mode ------------------------------------------------


def judge_compute_mode(
    what: str, before: str | None, after: str | None, said: str
) -> tuple[bool, str]:
    """Whether ``nvidia-smi -c EXCLUSIVE_PROCESS`` took on ``what``, judged by the mode
    read back (nvidia-smi may refuse and still exit 0: "Treating as warning and
    moving on", NVIDIA/DCGM#82); ``said``: its first output line."""
    took = after == "EXCLUSIVE_PROCESS"
    verdict = "accepted" if took else "refused"
    return took, f"{what}: {verdict} (mode {before} -> {after}; it said: {said or 'nothing'})"
