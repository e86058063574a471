"""What gpu-check runs and with which limits (the ``dra-driver gpu-check`` flags)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_driver.app.gpu_check.decide import GIB
from dra_driver.mpsagent.commands import UNSHARE_PRIVATE_MOUNT


@dataclass(frozen=True)
class CheckConfig:
    control: str = "nvidia-cuda-mps-control"
    client: tuple[str, ...] = ("python3", "-m", "dra_driver.gpu.cuda_client")
    """The CUDA client's argv; ``--below N --above M`` are appended."""
    protocol: str = "auto"
    memory_limit_bytes: int = GIB
    active_thread_percentage: int = 50
    step_timeout_s: float = 30.0
    work_dir: str = "/tmp"
    """Where the temporary pipe and log directories go (short: socket paths)."""
    cgroup_root: str = "/sys/fs/cgroup"
    nvidia_smi: str = "nvidia-smi"
    mig: bool = True
    unshare: tuple[str, ...] = UNSHARE_PRIVATE_MOUNT
    """What gives the ``client-own-shm`` client a mount namespace of its own (root:
    plain ``unshare --mount``; tests add ``--user --map-root-user``)."""
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
