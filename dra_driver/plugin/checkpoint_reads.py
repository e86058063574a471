"""What the plugin's parts beside the engine read from its checkpoint.

The disruption guard wants the claims prepared now, the claim reporter the same
claims in full at start, and slice publishing the MIG instances the plugin made
for claims (published as the placements they came from). Each reads the file
the engine writes: it is replaced atomically, so a read needs no lock.

The decisions are pure functions of a :class:`~dra_driver.state.checkpoint.Checkpoint`
(and the inventory); :class:`CheckpointReads` applies them to the file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.model import Inventory
from dra_driver.core.prepare import mig_of
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, CheckpointStore, ClaimState

__all__ = ["CheckpointReads", "completed_claims", "created_mig_devices", "prepared_refs"]


def completed_claims(checkpoint: Checkpoint) -> list[CheckpointClaim]:
    """The claims ``checkpoint`` holds as prepared (PrepareCompleted)."""
    return [c for c in checkpoint.claims.values() if c.state is ClaimState.PREPARE_COMPLETED]


def prepared_refs(checkpoint: Checkpoint) -> dict[ClaimUID, ClaimRef]:
    """UID → reference of each claim ``checkpoint`` holds as prepared."""
    return {c.ref.uid: c.ref for c in completed_claims(checkpoint)}


def created_mig_devices(checkpoint: Checkpoint, inventory: Inventory) -> set[str]:
    """UUIDs of the MIG instances made for claims, or being made right now.

    A made one is in the checkpoint with its UUID. One being made is recorded
    (PrepareStarted) only as its profile and placement until the claim
    completes, while a re-discovery may already list it: it is found in
    ``inventory`` by that placement, so the pool never shows it as a
    pre-existing instance, not even for one publish.
    """
    made: set[str] = set()
    pending: set[tuple[str, int, int]] = set()
    for claim in checkpoint.claims.values():
        for device in claim.devices:
            if (mig := mig_of(device)) is None:
                continue
            if mig.created and mig.mig_uuid:
                made.add(mig.mig_uuid)
            elif mig.mig_uuid is None and claim.state is ClaimState.PREPARE_STARTED:
                pending.add((device.gpu_uuid, mig.profile_id, mig.placement_start))
    if pending:
        made.update(
            m.uuid
            for gpu in inventory.gpus
            for m in gpu.mig_devices
            if (gpu.uuid, m.profile_id, m.placement.start) in pending
        )
    return made


class CheckpointReads:
    """The reads above on the engine's checkpoint file and the current inventory."""

    def __init__(self, store: CheckpointStore, inventory: Callable[[], Inventory]) -> None:
        self._store = store
        self._inventory = inventory

    def prepared_refs(self) -> dict[ClaimUID, ClaimRef]:
        """The claims prepared now (blocks: reads the file; the guard calls it off the loop)."""
        return prepared_refs(self._store.load())

    async def completed_claims(self) -> list[CheckpointClaim]:
        return completed_claims(await asyncio.to_thread(self._store.load))

    async def created_mig_devices(self) -> set[str]:
        checkpoint = await asyncio.to_thread(self._store.load)
        return created_mig_devices(checkpoint, self._inventory())
