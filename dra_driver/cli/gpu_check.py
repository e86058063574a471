"""``dra-driver gpu-check``: this driver's NVIDIA calls, tried once on a node's real GPUs."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from dra_driver.base.errors import ConfigError
from dra_driver.cli.flags import add_flag, common_flags, parse_non_negative, parse_seconds


def gpu_check_parser(sub: Any) -> None:
    """``dra-driver gpu-check``."""
    check = sub.add_parser(
        "gpu-check",
        help="try NVML, MIG, MPS, a CUDA client and dmem once on this node's GPUs "
        "(needs a GPU and root; undoes what it made)",
    )
    add_flag(check, "--mps-control", "nvidia-cuda-mps-control to run",
             default="nvidia-cuda-mps-control")  # fmt: skip
    add_flag(
        check,
        "--cuda-client",
        "the CUDA client's command line (--below/--above are appended)",
        default=f"{shlex.quote(sys.executable)} -m dra_driver.gpu.cuda_client",
    )
    add_flag(check, "--mps-protocol", "MPS protocol: auto (v3 from driver 615), v3, legacy",
             default="auto", choices=["auto", "v3", "legacy"])  # fmt: skip
    add_flag(check, "--memory-limit-mib", "the share's memory limit, MiB", default="1024")
    add_flag(check, "--sm-percent", "the share's active-thread percentage", default="50")
    add_flag(check, "--step-timeout", "seconds each command may take", default="30")
    add_flag(check, "--work-dir", "where the temporary MPS directories go", default="/tmp")
    add_flag(check, "--cgroup-root", "the cgroup v2 root", default="/sys/fs/cgroup")
    add_flag(check, "--nvidia-smi", "nvidia-smi to run (dmem limits)", default="nvidia-smi")
    add_flag(check, "--mig", "the MIG step (never toggles MIG mode): on or off", default="on",
             choices=["on", "off"])  # fmt: skip
    common_flags(check)


def cmd_gpu_check(args: argparse.Namespace) -> int:
    from dra_driver.app.gpu_check import MIB, CheckConfig, check_gpus

    memory_mib = parse_non_negative(args.memory_limit_mib, "--memory-limit-mib", int, "MiB")
    percent = parse_non_negative(args.sm_percent, "--sm-percent", int, "a percentage")
    if not 1 <= percent <= 100 or memory_mib < 1:
        raise ConfigError(
            f"gpu-check: --sm-percent must be 1 to 100 (got {percent}) and "
            f"--memory-limit-mib at least 1 (got {memory_mib})"
        )
    config = CheckConfig(
        control=args.mps_control,
        client=tuple(shlex.split(args.cuda_client)),
        protocol=args.mps_protocol,
        memory_limit_bytes=memory_mib * MIB,
        active_thread_percentage=percent,
        step_timeout_s=parse_seconds(args.step_timeout, "--step-timeout"),
        work_dir=args.work_dir,
        cgroup_root=args.cgroup_root,
        nvidia_smi=args.nvidia_smi,
        mig=args.mig == "on",
    )
    return check_gpus(config)
