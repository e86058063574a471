"""At start-up, make the checkpoint and the CDI directory agree (files only).

Runs under the node lock before the plugin serves: half-prepared claims
(PrepareStarted) are rolled back, missing specs of prepared claims written
again, specs no claim owns removed. The engine then undoes the rolled-back
claims' side effects (:meth:`dra_driver.plugin.driver.Driver.reconcile`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from dra_driver.base.ids import ClaimUID
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.state.checkpoint import CheckpointClaim, CheckpointStore, ClaimState
from dra_driver.state.mig_shares import hand_over

log = logging.getLogger("dra_driver.plugin.driver")
# The lines keep the logger they were written under before this module split off.


@dataclass(frozen=True)
class ReconcileReport:
    rolled_back: tuple[ClaimUID, ...] = ()
    rewritten: tuple[ClaimUID, ...] = ()
    orphans_removed: tuple[str, ...] = ()


def reconcile_files(
    checkpoints: CheckpointStore, cdi: CdiStore
) -> tuple[ReconcileReport, list[CheckpointClaim]]:
    """The report, and the rolled-back entries whose side effects must be undone."""
    checkpoint = checkpoints.load()
    rolled_back_entries: list[CheckpointClaim] = []
    original = checkpoint
    rolled_back: list[ClaimUID] = []
    rewritten: list[ClaimUID] = []
    for uid, entry in sorted(checkpoint.claims.items()):
        if entry.state is ClaimState.PREPARE_STARTED:
            if entry.cdi_spec_file:
                cdi.remove(entry.cdi_spec_file)
            checkpoint = checkpoint.without(uid)
            rolled_back.append(uid)
            rolled_back_entries.append(entry)
            log.warning("rolled back half-prepared claim %s", entry.ref)
        elif entry.cdi_spec is not None and (
            cdi.path_for(uid) != entry.cdi_spec_file or not cdi.exists(entry.cdi_spec_file)
        ):
            path = cdi.write(uid, entry.cdi_spec)
            if entry.cdi_spec_file and entry.cdi_spec_file != path:
                cdi.remove(entry.cdi_spec_file)  # --cdi-root changed
            checkpoint = checkpoint.with_claim(replace(entry, cdi_spec_file=path))
            rewritten.append(uid)
            log.warning("rewrote missing CDI spec %s for claim %s", path, entry.ref)
    # A MIG instance a rolled-back share made (or joined) that kept claims still
    # share passes to them instead of being destroyed (mig_shares).
    for i, entry in enumerate(rolled_back_entries):
        rolled_back_entries[i], checkpoint = hand_over(entry, checkpoint)
    orphans: list[str] = []
    for uid, path in sorted(cdi.list_claim_uids().items()):
        if uid not in checkpoint.claims:
            cdi.remove(path)
            orphans.append(path)
            log.warning("removed orphan CDI spec %s (no checkpoint entry)", path)
    for path in cdi.stale_temp_files():
        cdi.remove(path)
    if checkpoint is not original or not checkpoints.exists():
        checkpoints.save(checkpoint)
    report = ReconcileReport(tuple(rolled_back), tuple(rewritten), tuple(orphans))
    return report, rolled_back_entries
