"""``dra-driver cleanup``: undo on one node what the driver left there (uninstall).

Run on the node (or in a pod with the plugin's host mounts) after the driver's
claims are gone and before or after ``helm uninstall``. It:

* destroys the MIG instances the plugin created for claims (the checkpoint
  says which; instances an administrator made are never touched);
* releases the claims' MPS shares through the mps-agent when it still runs
  (the agent stops a GPU's daemon after its last share and restores the
  GPU's compute mode);
* removes our transient CDI specs and temp files from the CDI root and the
  checkpoint;
* deletes this node's ResourceSlices of our driver when an API is given.

Whatever a step cannot do is reported, and the next steps still run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

from dra_driver.base.errors import DriverError
from dra_driver.core.ports import GpuBackend
from dra_driver.core.prepare import mig_of, owned_shares
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.state.checkpoint import CheckpointClaim, decode

log = logging.getLogger(__name__)


@dataclass
class CleanupReport:
    mig_destroyed: list[str] = field(default_factory=list)
    shares_released: list[str] = field(default_factory=list)
    cdi_specs_removed: list[str] = field(default_factory=list)
    slices_deleted: tuple[str, ...] = ()
    problems: list[str] = field(default_factory=list)


def _read_claims(checkpoint_path: str, report: CleanupReport) -> list[CheckpointClaim]:
    try:
        with open(checkpoint_path, "rb") as handle:
            # Whatever boot wrote it: the MIG UUIDs and shares are what matter.
            return list(decode(handle.read(), checkpoint_path).claims.values())
    except FileNotFoundError:
        return []
    except (OSError, DriverError) as err:
        report.problems.append(f"checkpoint {checkpoint_path}: {err}")
        return []


async def _destroy_mig_devices(
    claims: list[CheckpointClaim], backend: GpuBackend, report: CleanupReport
) -> None:
    try:
        inventory = await backend.inventory()
        existing = {d.uuid for g in inventory.gpus for d in g.mig_devices}
    except DriverError as err:
        report.problems.append(f"GPU discovery: {err}")
        return
    for device in (d for claim in claims for d in claim.devices):
        mig = mig_of(device)
        ids = mig.instance if mig is not None and mig.created else None
        if ids is None or ids.uuid not in existing:
            continue  # not ours, or already gone
        try:
            await backend.destroy_mig_device(device.gpu_uuid, ids.gi_id)
            report.mig_destroyed.append(ids.uuid)
        except DriverError as err:
            report.problems.append(f"MIG device {ids.uuid}: {err}")


async def _release_shares(
    claims: list[CheckpointClaim], mps_socket: str, report: CleanupReport
) -> None:
    agent = MpsAgentClient(mps_socket)
    for gpu, share in (key for claim in claims for key in owned_shares(claim.devices)):
        try:
            if await agent.release_share(gpu, share):
                report.shares_released.append(share)
        except DriverError as err:
            report.problems.append(f"MPS share {share}: {err}")


def _remove_files(checkpoint_path: str, cdi: CdiStore, report: CleanupReport) -> None:
    for path in [*cdi.list_claim_uids().values(), *cdi.stale_temp_files()]:
        if cdi.remove(path):
            report.cdi_specs_removed.append(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(checkpoint_path)


async def cleanup_node(
    *,
    checkpoint_path: str,
    cdi: CdiStore,
    backend: GpuBackend,
    mps_socket: str | None,
    publisher: SlicePublisher | None,
) -> CleanupReport:
    report = CleanupReport()
    claims = await asyncio.to_thread(_read_claims, checkpoint_path, report)
    await _destroy_mig_devices(claims, backend, report)
    if mps_socket is not None:
        agent_there: bool = await asyncio.to_thread(os.path.exists, mps_socket)
        if agent_there:
            await _release_shares(claims, mps_socket, report)
    await asyncio.to_thread(_remove_files, checkpoint_path, cdi, report)
    if publisher is not None:
        try:
            report.slices_deleted = await publisher.unpublish()
        except DriverError as err:
            report.problems.append(f"ResourceSlices: {err}")
    for problem in report.problems:
        log.error("cleanup: %s", problem)
    return report
