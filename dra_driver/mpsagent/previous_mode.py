"""The GPU's compute mode around its MPS daemon (I/O): recorded, set, given back.

Before a daemon first sets EXCLUSIVE_PROCESS, the GPU's mode is recorded in
``<gpu dir>/compute-mode.previous`` (:attr:`.daemon_files.DaemonDirs.previous_mode`);
when the daemon stops, that mode is restored and the file removed. A restarted
daemon or agent finds the file and keeps the first mode.

A daemon for a MIG instance (``MIG-<uuid>``) leaves compute modes alone: the
mode belongs to the parent GPU, whose other instances are not ours, and
NVIDIA's MPS-on-MIG steps select the instance by ``CUDA_VISIBLE_DEVICES`` only
(to be confirmed on a real GPU).
"""

from __future__ import annotations

import logging

from dra_driver.mpsagent.compute_mode import ComputeMode, ComputeModeError, Mode, parse_mode
from dra_driver.mpsagent.layout import is_mig_uuid
from dra_driver.state.files import atomic_write, remove_if_exists

log = logging.getLogger(__name__)


def recorded_mode(path: str) -> Mode | None:
    """The mode recorded at ``path``; None when there is none (or it is unreadable)."""
    try:
        with open(path) as f:
            return parse_mode(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ComputeModeError) as err:
        log.warning("ignoring %s: %s", path, err)
        return None


async def enter_exclusive_process(compute_mode: ComputeMode, gpu_uuid: str, record: str) -> None:
    """Record the GPU's compute mode at ``record`` (first start only), then set
    EXCLUSIVE_PROCESS; recorded before it is changed, so a crash in between
    leaves the right mode. Raises :class:`ComputeModeError` when the set fails.

    A MIG instance's daemon runs in the mode the instance has: nvidia-smi refuses a
    compute mode on a GPU in MIG mode, and setting one on a MIG device is not
    documented (docs/nvidia-interfaces.md ``mps-mig-compute-mode``); said in the log,
    since it lets a client without the instance's pipe directory take the instance."""
    if is_mig_uuid(gpu_uuid):
        log.warning(
            "MPS daemon for MIG instance %s runs without EXCLUSIVE_PROCESS (not settable "
            "with MIG on): a container of a claim on this instance whose MPS pipe "
            "directory is missing or wrong runs as a plain CUDA process with the whole "
            "instance, outside every share's limits",
            gpu_uuid,
        )
        return
    if recorded_mode(record) is None:
        try:
            previous = await compute_mode.get_mode(gpu_uuid)
        except ComputeModeError as err:
            previous = "DEFAULT"
            log.warning(
                "cannot read GPU %s's compute mode (%s); DEFAULT will be restored after "
                "its last MPS share",
                gpu_uuid,
                err,
            )
        atomic_write(record, f"{previous}\n".encode())
        log.info("GPU %s compute mode before MPS: %s", gpu_uuid, previous)
    await compute_mode.set_mode(gpu_uuid, "EXCLUSIVE_PROCESS")


async def restore_previous_mode(compute_mode: ComputeMode, gpu_uuid: str, record: str) -> None:
    """Give the GPU back the mode it had before MPS (DEFAULT if none was recorded)."""
    if is_mig_uuid(gpu_uuid):
        return
    mode = recorded_mode(record) or "DEFAULT"
    try:
        await compute_mode.set_mode(gpu_uuid, mode)
    except ComputeModeError as err:
        # The record stays: the next stop tries again with the same mode.
        log.error("cannot restore GPU %s compute mode to %s: %s", gpu_uuid, mode, err)
        return
    remove_if_exists(record)
