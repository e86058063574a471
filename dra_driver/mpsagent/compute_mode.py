"""The GPU compute mode MPS needs, behind a small port.

MPS wants its GPU in EXCLUSIVE_PROCESS mode while the daemon runs, so that only
the MPS server holds a context on it. When the last share goes, the GPU goes
back to the mode it had before the daemon first started (usually DEFAULT, which
time-slicing and exclusive claims need; an administrator's PROHIBITED stays
PROHIBITED). :mod:`.previous_mode` reads that mode before the daemon changes it
and keeps it in the GPU's daemon directory, so an agent restart in between
still restores the right one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Literal, Protocol, get_args

log = logging.getLogger(__name__)

Mode = Literal["DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "EXCLUSIVE_THREAD"]
"""nvidia-smi's ``-c`` values. EXCLUSIVE_THREAD is deprecated; only read, to restore it."""
MODES: tuple[Mode, ...] = get_args(Mode)


class ComputeModeError(RuntimeError):
    pass


def parse_mode(text: str) -> Mode:
    """A mode as nvidia-smi prints it (``Default``, ``Exclusive_Process``) or as we store it.

    Raises :class:`ComputeModeError` for anything else.
    """
    word = text.strip().upper().replace(" ", "_")
    for mode in MODES:
        if word == mode:
            return mode
    raise ComputeModeError(f"unknown compute mode {text.strip()!r} (known: {', '.join(MODES)})")


class ComputeMode(Protocol):
    async def get_mode(self, gpu_uuid: str) -> Mode:
        """``gpu_uuid``'s compute mode now; raise :class:`ComputeModeError` on failure."""
        ...

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        """Set ``gpu_uuid``'s compute mode; raise :class:`ComputeModeError` on failure."""
        ...


class FakeComputeMode:
    """In memory, for tests and ``--backend fake``: records every change.

    ``initial``: modes the GPUs have before anything is set (DEFAULT otherwise).
    """

    def __init__(self, initial: dict[str, Mode] | None = None) -> None:
        self.modes: dict[str, Mode] = dict(initial or {})
        self.history: list[tuple[str, Mode]] = []

    async def get_mode(self, gpu_uuid: str) -> Mode:
        return self.modes.get(gpu_uuid, "DEFAULT")

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        self.modes[gpu_uuid] = mode
        self.history.append((gpu_uuid, mode))


class NvidiaSmiComputeMode:
    """``nvidia-smi -i <uuid> -c <MODE>`` and ``--query-gpu=compute_mode``.

    gpu-unverified: both forms are nvidia-smi's documented ``-i``/``-c`` and
    ``--query-gpu=compute_mode --format=csv,noheader`` options (the query prints
    ``Default``, ``Exclusive_Process``, ``Prohibited``); neither has been run by
    this project on a GPU yet. Setting needs root on the host's GPU.
    """

    def __init__(self, nvidia_smi: str = "nvidia-smi", timeout: float = 30.0) -> None:
        self.nvidia_smi = nvidia_smi
        self.timeout = timeout

    async def _run(self, *args: str) -> str:
        argv = [self.nvidia_smi, *args]
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
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise ComputeModeError(f"{' '.join(argv)} failed ({proc.returncode}): {text}")
        return text

    async def get_mode(self, gpu_uuid: str) -> Mode:
        out = await self._run("-i", gpu_uuid, "--query-gpu=compute_mode", "--format=csv,noheader")
        lines = [line for line in out.splitlines() if line.strip()]
        if len(lines) != 1:
            raise ComputeModeError(
                f"nvidia-smi printed {len(lines)} compute modes for GPU {gpu_uuid}: {out!r}"
            )
        return parse_mode(lines[0])

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        await self._run("-i", gpu_uuid, "-c", mode)
        log.info("GPU %s compute mode set to %s", gpu_uuid, mode)
