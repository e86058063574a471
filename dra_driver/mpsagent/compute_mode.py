"""The GPU compute mode MPS needs, behind a small port.

MPS wants its GPU in EXCLUSIVE_PROCESS mode while the daemon runs, so that only
the MPS server holds a context on it; when the last share goes, the GPU goes
back to DEFAULT (time-slicing and exclusive claims need that).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal, Protocol

log = logging.getLogger(__name__)

Mode = Literal["EXCLUSIVE_PROCESS", "DEFAULT"]


class ComputeModeError(RuntimeError):
    pass


class ComputeMode(Protocol):
    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        """Set ``gpu_uuid``'s compute mode; raise :class:`ComputeModeError` on failure."""
        ...


class FakeComputeMode:
    """In memory, for tests and ``--backend fake``: records every change."""

    def __init__(self) -> None:
        self.modes: dict[str, Mode] = {}
        self.history: list[tuple[str, Mode]] = []

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        self.modes[gpu_uuid] = mode
        self.history.append((gpu_uuid, mode))


class NvidiaSmiComputeMode:
    """``nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS|DEFAULT``.

    gpu-unverified: the form is nvidia-smi's documented ``-i``/``-c`` options and
    has not been run by this project on a GPU yet. Needs root on the host's GPU.
    """

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout: float = 30.0) -> None:
        self.nvidia_smi = nvidia_smi
        self.timeout = timeout

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        argv = [self.nvidia_smi, "-i", gpu_uuid, "-c", mode]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
        except OSError as err:
            raise ComputeModeError(f"cannot run {self.nvidia_smi}: {err}") from err
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError as err:
            proc.kill()
            await proc.wait()
            raise ComputeModeError(f"{' '.join(argv)} timed out") from err
        if proc.returncode != 0:
            raise ComputeModeError(
                f"{' '.join(argv)} failed ({proc.returncode}): {out.decode(errors='replace')}"
            )
        log.info("GPU %s compute mode set to %s", gpu_uuid, mode)
