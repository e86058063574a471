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
