"""Prepare / unprepare engine: claim refs in, per-claim outcomes out.

For each NodePrepareResources call the engine GETs the claims (in parallel,
outside any lock), then hands the work to one batch worker. The worker takes
the node lock (task + ``flock``), loads the checkpoint, decides every claim of
every call waiting at that moment with the pure :func:`plan_prepare`, and
applies the decisions with one checkpoint write per phase::

    load ─ decide ─ save(PrepareStarted) ─ write CDI specs ─ save(PrepareCompleted)

Batching is what keeps a burst of concurrent calls cheap: fifty calls that
arrive together cost two checkpoint fsyncs, not a hundred. Each claim's
failure stays its own: it becomes that claim's error string, the others go on.
A repeated prepare returns what the checkpoint recorded; an unprepare of an
unknown claim succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from dra_driver.core.cdi import CdiSpec, render_spec
from dra_driver.core.errors import DriverError
from dra_driver.core.ids import ClaimRef, ClaimUID
from dra_driver.core.model import Inventory, ResourceClaim
from dra_driver.core.plan import Mode, NodeContext, PlannedDevice, plan_prepare
from dra_driver.core.ports import ClaimSource
from dra_driver.kubeletplugin.dra_servicer import ClaimOutcome
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.enforcement import Enforcer, owned_shares
from dra_driver.plugin.observers import ClaimOperation, DriverObserver, error_reason, notify
from dra_driver.state.checkpoint import (
    Checkpoint,
    CheckpointClaim,
    CheckpointStore,
    ClaimState,
)
from dra_driver.state.locks import NodeLock
from dra_driver.state.mig_shares import hand_over

log = logging.getLogger(__name__)
# Each claim's outcome is logged once, by observability/claim_log.py (an observer);
# the engine's own lines about claims are DEBUG.


@dataclass(frozen=True)
class ReconcileReport:
    rolled_back: tuple[ClaimUID, ...] = ()
    rewritten: tuple[ClaimUID, ...] = ()
    orphans_removed: tuple[str, ...] = ()


@dataclass
class _Work:
    """One gRPC call's claims, waiting for the batch worker."""

    prepare: bool
    refs: list[ClaimRef]
    fetched: dict[ClaimUID, ResourceClaim | BaseException]
    future: asyncio.Future[dict[ClaimUID, ClaimOutcome]]
    outcomes: dict[ClaimUID, ClaimOutcome] = field(default_factory=dict)


@dataclass
class _BatchPlan:
    """What one batch decided: the checkpoint to write and the files to touch."""

    checkpoint: Checkpoint
    changed: bool = False
    to_write: list[tuple[_Work, CheckpointClaim, CdiSpec | None]] = field(default_factory=list)
    """New entries, with the plan's CDI spec when side effects must still run."""
    to_remove: dict[ClaimUID, str] = field(default_factory=dict)
    to_release: list[tuple[_Work, CheckpointClaim]] = field(default_factory=list)
    """Unprepared entries whose side effects (MPS share, MIG instance) must be undone."""


def _unique(refs: Sequence[ClaimRef]) -> list[ClaimRef]:
    seen: dict[ClaimUID, ClaimRef] = {}
    for ref in refs:
        seen.setdefault(ref.uid, ref)
    return list(seen.values())


class Driver:
    def __init__(
        self,
        *,
        ctx: NodeContext,
        inventory: Inventory,
        claims: ClaimSource,
        checkpoints: CheckpointStore,
        cdi: CdiStore,
        lock: NodeLock,
        enforcer: Enforcer | None = None,
        observers: Sequence[DriverObserver] = (),
    ) -> None:
        """``enforcer`` None: no side effects beyond CDI specs (MPS shares and MIG
        devices are then given their GPU's nodes only; tests of the engine alone)."""
        self.ctx = ctx
        self.enforcer = enforcer
        self.inventory = inventory
        self.claims = claims
        self.checkpoints = checkpoints
        self.cdi = cdi
        self.lock = lock
        self.observers: list[DriverObserver] = list(observers)
        """Told of every claim's outcome (metrics, Events, claim status)."""
        self._pending: list[_Work] = []
        self._worker: asyncio.Task[None] | None = None

    # --- public API ---------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]:
        started = time.monotonic()
        unique = _unique(refs)
        fetched = await asyncio.gather(
            *(self.claims.get_claim(ref) for ref in unique), return_exceptions=True
        )
        work = _Work(
            prepare=True,
            refs=unique,
            fetched={ref.uid: got for ref, got in zip(unique, fetched, strict=True)},
            future=asyncio.get_running_loop().create_future(),
        )
        return await self._submit(work, started)

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]:
        started = time.monotonic()
        work = _Work(
            prepare=False,
            refs=_unique(refs),
            fetched={},
            future=asyncio.get_running_loop().create_future(),
        )
        return await self._submit(work, started)

    async def reconcile(self) -> ReconcileReport:
        """Make checkpoint, CDI dir, MPS shares and MIG instances agree; once at start-up."""
        async with self.lock.hold():
            report, rolled_back = await asyncio.to_thread(self._reconcile)
            if self.enforcer is not None:
                for entry in rolled_back:
                    try:
                        await self.enforcer.release(entry.ref, entry.devices)
                        await self.enforcer.destroy_leftover(entry.devices)
                    except DriverError as err:
                        log.error("cleaning up half-prepared claim %s failed: %s", entry.ref, err)
                kept = (await asyncio.to_thread(self.checkpoints.load)).claims.values()
                owned = [key for entry in kept for key in owned_shares(entry.devices)]
                try:
                    await self.enforcer.release_orphan_shares(owned)
                except DriverError as err:
                    # No agent yet (its DaemonSet may start after us): shares are
                    # checked again at the next start.
                    log.warning("could not reconcile MPS shares with the mps-agent: %s", err)
            return report

    async def close(self) -> None:
        if self._worker is not None:
            await self._worker

    # --- batching -----------------------------------------------------------

    async def _submit(self, work: _Work, started: float) -> dict[ClaimUID, ClaimOutcome]:
        self._pending.append(work)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="prepare-batch-worker")
        # The batch finishes even if our caller gives up (kubelet timeout):
        # the kubelet's retry then finds the recorded result.
        outcomes = await asyncio.shield(work.future)
        if self.observers:
            self._tell(work, outcomes, time.monotonic() - started)
        return outcomes

    def _tell(self, work: _Work, outcomes: dict[ClaimUID, ClaimOutcome], seconds: float) -> None:
        for ref in work.refs:
            outcome = outcomes.get(ref.uid)
            if outcome is None:
                continue
            fetched = work.fetched.get(ref.uid)
            notify(
                self.observers,
                ClaimOperation(
                    operation="prepare" if work.prepare else "unprepare",
                    ref=ref,
                    seconds=seconds,
                    devices=tuple(d for d in outcome.devices if isinstance(d, PlannedDevice)),
                    error=outcome.error,
                    reason=outcome.reason if outcome.error else "",
                    claim=fetched if isinstance(fetched, ResourceClaim) else None,
                    repeated=outcome.repeated,
                ),
            )

    async def _drain(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                async with self.lock.hold():
                    plan = await asyncio.to_thread(self._phase1, batch)
                    if plan is not None:
                        await self._enforce(plan)
                        await asyncio.to_thread(self._write_specs_and_complete, plan)
                    # (When nothing has side effects, _phase1 already completed it.)
            except Exception as err:  # lock timeout, checkpoint unreadable: fail the batch
                # Nothing of this batch is known to be on disk: every claim fails
                # (even those decided as done) and the kubelet retries.
                log.error("prepare/unprepare batch failed: %s", err)
                for work in batch:
                    for ref in work.refs:
                        work.outcomes[ref.uid] = ClaimOutcome(
                            error=f"claim {ref}: {err}", reason=error_reason(err)
                        )
            for work in batch:
                if not work.future.done():
                    work.future.set_result(work.outcomes)

    # --- the critical section (runs in a worker thread, under the lock) -------

    def _phase1(self, batch: list[_Work]) -> _BatchPlan | None:
        """Decide, then record PrepareStarted entries (and drop unprepared ones) on disk
        before any side effect. Returns the plan when side effects must run (then
        phase 2); None when nothing changed or the batch is already complete."""
        plan = self._decide(batch, self.checkpoints.load())
        if not plan.changed:
            return None
        self.checkpoints.save(plan.checkpoint)
        for path in plan.to_remove.values():
            self.cdi.remove(path)
        if not self._has_side_effects(plan):
            # Saves a thread hop per batch for whole GPUs and time-sliced shares.
            self._write_specs_and_complete(plan)
            return None
        return plan

    def _has_side_effects(self, plan: _BatchPlan) -> bool:
        if self.enforcer is None:
            return False
        entries = [entry for _, entry, spec in plan.to_write if spec is not None]
        entries += [entry for _, entry in plan.to_release]
        return any(d.mode in (Mode.MPS, Mode.MIG) for e in entries for d in e.devices)

    async def _enforce(self, plan: _BatchPlan) -> None:
        """Side effects (MPS shares, MIG instances); a failure fails its claim alone."""
        if self.enforcer is None:
            return
        for work, entry in plan.to_release:
            try:
                await self.enforcer.release(entry.ref, entry.devices)
            except DriverError as err:
                # Keep the claim so the kubelet's retry releases what is left.
                plan.checkpoint = plan.checkpoint.with_claim(entry)
                work.outcomes[entry.ref.uid] = ClaimOutcome(
                    error=f"claim {entry.ref}: {err}", reason=error_reason(err)
                )
        kept: list[tuple[_Work, CheckpointClaim, CdiSpec | None]] = []
        for work, started, planned_spec in plan.to_write:
            if planned_spec is None:
                kept.append((work, started, planned_spec))
                continue
            try:
                devices, spec = await self.enforcer.apply(
                    started.ref, started.devices, planned_spec
                )
            except Exception as err:
                message = f"claim {started.ref}: {err}"
                log.debug("prepare failed: %s", message)
                work.outcomes[started.ref.uid] = ClaimOutcome(
                    error=message, reason=error_reason(err)
                )
                plan.checkpoint = plan.checkpoint.without(started.ref.uid)
                continue
            entry = replace(started, devices=devices, cdi_spec=render_spec(spec))
            plan.checkpoint = plan.checkpoint.with_claim(entry)
            kept.append((work, entry, spec))
        plan.to_write = kept

    def _decide(self, batch: list[_Work], checkpoint: Checkpoint) -> _BatchPlan:
        """Decide every claim of the batch in arrival order; writes nothing."""
        plan = _BatchPlan(checkpoint)
        for work in batch:
            for ref in work.refs:
                if work.prepare:
                    decided = self._decide_prepare(work, ref, plan.checkpoint)
                    if decided is not None:
                        entry, spec = decided
                        plan.checkpoint = plan.checkpoint.with_claim(entry)
                        plan.to_write.append((work, entry, spec))
                        plan.to_remove.pop(ref.uid, None)
                        plan.changed = True
                    continue
                # Prepared and unprepared in one batch: the unprepare wins.
                for other, _, _ in (x for x in plan.to_write if x[1].ref.uid == ref.uid):
                    other.outcomes[ref.uid] = ClaimOutcome(
                        error=f"claim {ref}: unprepared while it was being prepared",
                        reason="UnpreparedMeanwhile",
                    )
                plan.to_write = [x for x in plan.to_write if x[1].ref.uid != ref.uid]
                recorded = plan.checkpoint.claims.get(ref.uid)
                if recorded is not None:
                    # A MIG instance other claims still share passes to them (mig_shares).
                    recorded, plan.checkpoint = hand_over(
                        recorded, plan.checkpoint.without(ref.uid)
                    )
                    if recorded.cdi_spec_file:
                        plan.to_remove[ref.uid] = recorded.cdi_spec_file
                    plan.to_release.append((work, recorded))
                    plan.changed = True
                    log.debug("unprepared claim %s", ref)
                work.outcomes[ref.uid] = ClaimOutcome()
        return plan

    def _write_specs_and_complete(self, plan: _BatchPlan) -> None:
        """Phase 2: write each claim's CDI spec, then record PrepareCompleted (and
        what the side effects changed)."""
        checkpoint = plan.checkpoint
        completed: list[tuple[_Work, CheckpointClaim]] = []
        for work, entry, _ in plan.to_write:
            try:
                self.cdi.write(entry.ref.uid, entry.cdi_spec or {})
            except OSError as err:
                message = f"claim {entry.ref}: cannot write CDI spec {entry.cdi_spec_file}: {err}"
                log.error("%s", message)
                checkpoint = checkpoint.without(entry.ref.uid)
                work.outcomes[entry.ref.uid] = ClaimOutcome(error=message, reason="CdiWriteFailed")
                continue
            done = replace(entry, state=ClaimState.PREPARE_COMPLETED)
            checkpoint = checkpoint.with_claim(done)
            completed.append((work, done))
        try:
            self.checkpoints.save(checkpoint)
        except DriverError as err:
            # Left PrepareStarted on disk: the kubelet's retry plans them again.
            for work, entry in completed:
                work.outcomes[entry.ref.uid] = ClaimOutcome(
                    error=f"claim {entry.ref}: {err}", reason=error_reason(err)
                )
            return
        for work, entry in completed:
            work.outcomes[entry.ref.uid] = ClaimOutcome(devices=entry.devices)
            log.debug(
                "prepared claim %s: %s",
                entry.ref,
                ", ".join(f"{d.device_name}({d.mode.value})" for d in entry.devices),
            )

    def _decide_prepare(
        self, work: _Work, ref: ClaimRef, checkpoint: Checkpoint
    ) -> tuple[CheckpointClaim, CdiSpec | None] | None:
        """Record the outcome for a claim that needs no work, or return its new entry
        (with the plan's CDI spec when its side effects must still run)."""
        recorded = checkpoint.claims.get(ref.uid)
        if recorded is not None and recorded.state is ClaimState.PREPARE_COMPLETED:
            if (
                recorded.cdi_spec is not None
                and recorded.cdi_spec_file
                and not os.path.exists(recorded.cdi_spec_file)
            ):
                # Someone emptied the CDI dir under a prepared claim: the
                # runtime would fail to start the container, so write it again.
                log.warning("CDI spec of prepared claim %s is missing; writing it again", ref)
                return replace(recorded, state=ClaimState.PREPARE_STARTED), None
            work.outcomes[ref.uid] = ClaimOutcome(devices=recorded.devices, repeated=True)
            return None
        fetched = work.fetched[ref.uid]
        if isinstance(fetched, BaseException):
            cause = str(fetched) if isinstance(fetched, DriverError) else repr(fetched)
            message = cause if cause.startswith("claim ") else f"claim {ref}: {cause}"
            log.debug("prepare failed: %s", message)
            work.outcomes[ref.uid] = ClaimOutcome(error=message, reason=error_reason(fetched))
            return None
        try:
            # A PrepareStarted entry is an attempt that died half-way; planning
            # again is safe because the plan is deterministic.
            in_use = checkpoint.without(ref.uid).device_uses()
            plan = plan_prepare(fetched, self.inventory, self.ctx, in_use)
        except DriverError as err:
            log.debug("prepare failed: %s", err)
            work.outcomes[ref.uid] = ClaimOutcome(error=str(err), reason=error_reason(err))
            return None
        entry = CheckpointClaim(
            ref=ref,
            state=ClaimState.PREPARE_STARTED,
            devices=plan.devices,
            cdi_spec_file=self.cdi.path_for(ref.uid),
            cdi_spec=render_spec(plan.cdi_spec),
        )
        return entry, plan.cdi_spec

    def _reconcile(self) -> tuple[ReconcileReport, list[CheckpointClaim]]:
        checkpoint = self.checkpoints.load()
        rolled_back_entries: list[CheckpointClaim] = []
        original = checkpoint
        rolled_back: list[ClaimUID] = []
        rewritten: list[ClaimUID] = []
        for uid, entry in sorted(checkpoint.claims.items()):
            if entry.state is ClaimState.PREPARE_STARTED:
                if entry.cdi_spec_file:
                    self.cdi.remove(entry.cdi_spec_file)
                checkpoint = checkpoint.without(uid)
                rolled_back.append(uid)
                rolled_back_entries.append(entry)
                log.warning("rolled back half-prepared claim %s", entry.ref)
            elif entry.cdi_spec is not None and (
                self.cdi.path_for(uid) != entry.cdi_spec_file
                or not os.path.exists(entry.cdi_spec_file)
            ):
                path = self.cdi.write(uid, entry.cdi_spec)
                if entry.cdi_spec_file and entry.cdi_spec_file != path:
                    self.cdi.remove(entry.cdi_spec_file)  # --cdi-root changed
                checkpoint = checkpoint.with_claim(replace(entry, cdi_spec_file=path))
                rewritten.append(uid)
                log.warning("rewrote missing CDI spec %s for claim %s", path, entry.ref)
        # A MIG instance a rolled-back share made (or joined) that kept claims still
        # share passes to them instead of being destroyed (mig_shares).
        for i, entry in enumerate(rolled_back_entries):
            rolled_back_entries[i], checkpoint = hand_over(entry, checkpoint)
        orphans: list[str] = []
        for uid, path in sorted(self.cdi.list_claim_uids().items()):
            if uid not in checkpoint.claims:
                self.cdi.remove(path)
                orphans.append(path)
                log.warning("removed orphan CDI spec %s (no checkpoint entry)", path)
        for path in self.cdi.stale_temp_files():
            self.cdi.remove(path)
        if checkpoint is not original or not os.path.exists(self.checkpoints.path):
            self.checkpoints.save(checkpoint)
        report = ReconcileReport(tuple(rolled_back), tuple(rewritten), tuple(orphans))
        return report, rolled_back_entries
