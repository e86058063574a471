"""Prepare / unprepare engine: claim refs in, per-claim outcomes out.

For each NodePrepareResources call the engine GETs the claims (in parallel,
outside any lock), then hands the work to one batch worker. The worker takes
the node lock (task + ``flock``), loads the checkpoint, decides every claim of
every call waiting at that moment with the pure :func:`plan_prepare`, records
the decisions with one checkpoint write, and lets go of the lock::

    load ─ decide ─ save(PrepareStarted)                       (one batch, under the lock)
      └─ per claim, concurrently: side effects ─ CDI spec ─ record(PrepareCompleted)

Claims without side effects (whole GPUs, time-sliced shares) are finished in
the same pass: CDI specs, then one more write, still under the lock. A claim
with side effects (an MPS share, a MIG instance) runs them in a task of its
own, outside the lock, so claims on different GPUs (and MPS namespaces, which
the mps-agent serialises per GPU) are enforced at the same time, and the next
batch is decided while they run. MIG changes of one GPU take that GPU's lock.
Each claim's completion is recorded by a group commit: completions that arrive
while a write is in flight go together into the next one (one write each, not
one per claim). A claim is answered once its own work is recorded; a call
once all of its claims are. A claim whose side effects are in flight is not
decided again until they finish (a repeated or crossing prepare/unprepare
waits for it).

The observers (the claim log, metrics, claim status and Events) hear of each
claim after its answer: a lone call's before it returns, a wave's once the
whole wave has been answered (what they do is not what the wave waits for).

Each claim's failure stays its own: it becomes that claim's error string, the
others go on. A repeated prepare returns what the checkpoint recorded; an
unprepare of an unknown claim succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field, replace

from dra_driver.base.errors import DriverError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.cdi import CdiSpec, render_spec
from dra_driver.core.model import Inventory, ResourceClaim
from dra_driver.core.ports import ClaimSource
from dra_driver.core.prepare import (
    ClaimOperation,
    DriverObserver,
    MigInstance,
    MpsInMig,
    MpsShare,
    NodeContext,
    PlannedDevice,
    error_reason,
    mig_of,
    notify,
    owned_shares,
    plan_prepare,
)
from dra_driver.kubeletplugin.dra_servicer import ClaimOutcome
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.current_inventory import CurrentInventory
from dra_driver.plugin.enforcement import Enforcer
from dra_driver.state.checkpoint import (
    Checkpoint,
    CheckpointClaim,
    CheckpointStore,
    ClaimState,
)
from dra_driver.state.locks import NodeLock
from dra_driver.state.mig_shares import hand_over, keep_handed_over

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
    running: int = 0
    """Claims of this call whose side effects are still running."""

    def resolve_if_done(self) -> None:
        if self.running == 0 and not self.future.done():
            self.future.set_result(self.outcomes)


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


@dataclass(frozen=True)
class _Change:
    """One claim's record after its side effects: its entry, or its removal."""

    uid: ClaimUID
    entry: CheckpointClaim | None
    """The entry to record (PrepareCompleted, or kept for a retry); None: remove it."""


def with_changes(checkpoint: Checkpoint, changes: Sequence[_Change]) -> Checkpoint:
    """``checkpoint`` with each claim's recorded entry, or without it."""
    for change in changes:
        if change.entry is None:
            checkpoint = checkpoint.without(change.uid)
        else:
            # Keep a MIG instance handed to this claim while its side effects ran.
            entry = keep_handed_over(change.entry, checkpoint.claims.get(change.uid))
            checkpoint = checkpoint.with_claim(entry)
    return checkpoint


def _settle(
    changes: Sequence[tuple[_Change, asyncio.Future[None]]], error: BaseException | None
) -> None:
    """Tell the claims waiting on ``changes`` that their write is done, or failed."""
    for _, done in changes:
        if done.done():
            continue
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)


def _needs_effects(entry: CheckpointClaim) -> bool:
    return any(isinstance(d, MpsShare | MpsInMig | MigInstance) for d in entry.devices)


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
        inventory: CurrentInventory,
        claims: ClaimSource,
        checkpoints: CheckpointStore,
        cdi: CdiStore,
        lock: NodeLock,
        enforcer: Enforcer | None = None,
        observers: Sequence[DriverObserver] = (),
        activity: CallActivity | None = None,
    ) -> None:
        """``enforcer`` None: no side effects beyond CDI specs (MPS shares and MIG
        devices are then given their GPU's nodes only; tests of the engine alone).
        ``activity``: counts the calls in flight (work off the kubelet's path waits
        for a lull)."""
        self.ctx = ctx
        self.enforcer = enforcer
        self._inventory = inventory
        self.claims = claims
        self.checkpoints = checkpoints
        self.cdi = cdi
        self.lock = lock
        self.activity = activity if activity is not None else CallActivity()
        self.observers: list[DriverObserver] = list(observers)
        """Told of every claim's outcome (metrics, Events, claim status)."""
        self._pending: list[_Work] = []
        self._worker: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        """Set when a call arrives or a claim's side effects finish."""
        self._inflight: dict[ClaimUID, asyncio.Task[None]] = {}
        """Claims whose side effects run now (not decided again until they finish)."""
        self._gpu_lock: dict[str, asyncio.Lock] = {}
        self._changes: list[tuple[_Change, asyncio.Future[None]]] = []
        self._committer: asyncio.Task[None] | None = None
        self._untold: list[tuple[_Work, dict[ClaimUID, ClaimOutcome], float]] = []
        """Answered calls whose observers are told once their wave is over."""
        self._teller: asyncio.Task[None] | None = None

    @property
    def inventory(self) -> Inventory:
        """The node's GPUs as last discovered."""
        return self._inventory.get()

    # --- public API ---------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]:
        started = time.monotonic()
        with self.activity.call():
            unique = _unique(refs)
            fetched: list[ResourceClaim | BaseException]
            if len(unique) == 1:  # the kubelet's usual call: no task and gather for one GET
                try:
                    fetched = [await self.claims.get_claim(unique[0])]
                except Exception as err:
                    fetched = [err]
            else:
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
        with self.activity.call():
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
        """Wait for the claims in flight, their checkpoint writes and their observers."""
        while (
            self._worker is not None
            or self._inflight
            or self._committer is not None
            or self._teller is not None
        ):
            for task in (self._worker, self._committer, *self._inflight.values(), self._teller):
                if task is not None:
                    await asyncio.gather(task, return_exceptions=True)
            if self._worker is not None and self._worker.done():
                self._worker = None
            if self._committer is not None and self._committer.done():
                self._committer = None
            if self._teller is not None and self._teller.done():
                self._teller = None

    # --- batching -----------------------------------------------------------

    async def _submit(self, work: _Work, started: float) -> dict[ClaimUID, ClaimOutcome]:
        self._pending.append(work)
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="prepare-batch-worker")
        # The claim's work finishes even if our caller gives up (kubelet timeout):
        # the kubelet's retry then finds the recorded result.
        outcomes = await asyncio.shield(work.future)
        if self.observers:
            self._report(work, outcomes, time.monotonic() - started)
        return outcomes

    def _report(self, work: _Work, outcomes: dict[ClaimUID, ClaimOutcome], seconds: float) -> None:
        """Tell the observers now when this call is the only one in flight; in a wave,
        once the wave has been answered (its log lines, metrics and status are not
        what the other claims wait for, and they cost a quarter of a millisecond of
        the one core the wave's claims share)."""
        if self.activity.calls <= 1 and not self._untold:
            self._tell(work, outcomes, seconds)
            return
        # In the order the answers went out: a claim's prepare is always told first.
        self._untold.append((work, outcomes, seconds))
        if self._teller is None or self._teller.done():
            self._teller = asyncio.create_task(self._tell_after_wave(), name="claim-observers")

    async def _tell_after_wave(self) -> None:
        while self._untold:
            await self.activity.lull()
            told, self._untold = self._untold, []
            for work, outcomes, seconds in told:
                self._tell(work, outcomes, seconds)

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
        """Decide waiting calls in batches; a call on a claim in flight waits for it."""
        while True:
            ready = [w for w in self._pending if not any(r.uid in self._inflight for r in w.refs)]
            if not ready:
                if not self._pending:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            taken = {id(w) for w in ready}
            self._pending = [w for w in self._pending if id(w) not in taken]
            await self._decide_batch(ready)

    async def _decide_batch(self, batch: list[_Work]) -> None:
        changes: list[tuple[_Change, asyncio.Future[None]]] = []
        try:
            async with self.lock.hold():
                # The completions waiting for the group commit go into this write
                # too: one checkpoint write where there would be two in a row.
                changes, self._changes = self._changes, []
                plan = await asyncio.to_thread(self._phase1, batch, [c for c, _ in changes])
        except Exception as err:  # lock timeout, checkpoint unreadable: fail the batch
            # Nothing of this batch is known to be on disk: every claim fails
            # (even those decided as done) and the kubelet retries.
            log.error("prepare/unprepare batch failed: %s", err)
            _settle(changes, err)
            for work in batch:
                for ref in work.refs:
                    work.outcomes[ref.uid] = ClaimOutcome(
                        error=f"claim {ref}: {err}", reason=error_reason(err)
                    )
                work.resolve_if_done()
            return
        _settle(changes, None)
        if plan is not None:
            for work, entry in plan.to_release:
                self._start(work, entry.ref.uid, self._finish_release(work, entry))
            for work, entry, spec in plan.to_write:
                assert spec is not None
                self._start(work, entry.ref.uid, self._finish_prepare(work, entry, spec))
        for work in batch:
            work.resolve_if_done()

    def _start(self, work: _Work, uid: ClaimUID, job: Coroutine[None, None, None]) -> None:
        work.running += 1
        task = asyncio.create_task(job, name=f"claim-{uid}")
        self._inflight[uid] = task

        def done(_: asyncio.Task[None]) -> None:
            failed = None if task.cancelled() else task.exception()
            if failed is not None:  # a bug: the claim must still get an answer
                log.error("claim %s: %r", uid, failed, exc_info=failed)
                work.outcomes[uid] = ClaimOutcome(
                    error=f"claim {uid}: internal error: {failed!r}", reason=error_reason(failed)
                )
            if self._inflight.get(uid) is task:
                del self._inflight[uid]
            work.running -= 1
            work.resolve_if_done()
            self._wake.set()

        task.add_done_callback(done)

    # --- the critical section (runs in a worker thread, under the lock) -------

    def _phase1(self, batch: list[_Work], changes: Sequence[_Change] = ()) -> _BatchPlan | None:
        """Record ``changes`` (completions waiting for the group commit), decide, then
        record PrepareStarted entries (and drop unprepared ones) on disk before any
        side effect, in one write; finish the claims that have none. Returns what
        is left for the claims' own tasks (None: nothing)."""
        plan = self._decide(batch, with_changes(self.checkpoints.load(), changes))
        if not plan.changed:
            if changes:
                self.checkpoints.save(plan.checkpoint)
            return None
        self.checkpoints.save(plan.checkpoint)
        for path in plan.to_remove.values():
            self.cdi.remove(path)
        if self.enforcer is None:
            slow: list[tuple[_Work, CheckpointClaim, CdiSpec | None]] = []
            plan.to_release = []
        else:
            slow = [x for x in plan.to_write if x[2] is not None and _needs_effects(x[1])]
            plan.to_release = [x for x in plan.to_release if _needs_effects(x[1])]
        quick = [x for x in plan.to_write if not any(x is y for y in slow)]
        if quick:
            # Saves a task and a thread hop per claim for whole GPUs and time-sliced shares.
            plan.checkpoint = self._write_specs_and_complete(plan.checkpoint, quick)
        plan.to_write = slow
        return plan

    # --- one claim's side effects (a task of its own, outside the lock) -------

    async def _finish_prepare(self, work: _Work, started: CheckpointClaim, spec: CdiSpec) -> None:
        assert self.enforcer is not None
        ref = started.ref
        try:
            async with self._gpu_locks(started.devices):
                devices, spec = await self.enforcer.apply(ref, started.devices, spec)
        except Exception as err:
            message = f"claim {ref}: {err}"
            log.debug("prepare failed: %s", message)
            work.outcomes[ref.uid] = ClaimOutcome(error=message, reason=error_reason(err))
            await self._record_quietly(_Change(ref.uid, None))
            return
        entry = replace(started, devices=devices, cdi_spec=render_spec(spec))
        try:
            if self.cdi.in_memory:  # a few microseconds: cheaper than a thread hop
                self.cdi.write(ref.uid, entry.cdi_spec or {})
            else:
                await asyncio.to_thread(self.cdi.write, ref.uid, entry.cdi_spec or {})
        except OSError as err:
            message = f"claim {ref}: cannot write CDI spec {entry.cdi_spec_file}: {err}"
            log.error("%s", message)
            work.outcomes[ref.uid] = ClaimOutcome(error=message, reason="CdiWriteFailed")
            try:
                async with self._gpu_locks(devices):
                    await self.enforcer.release(ref, devices)
            except DriverError as undo:
                log.error("claim %s: undoing its side effects failed: %s", ref, undo)
            await self._record_quietly(_Change(ref.uid, None))
            return
        done = replace(entry, state=ClaimState.PREPARE_COMPLETED)
        try:
            await self._record(_Change(ref.uid, done))
        except Exception as err:
            # Left PrepareStarted on disk: the kubelet's retry plans it again.
            work.outcomes[ref.uid] = ClaimOutcome(
                error=f"claim {ref}: {err}", reason=error_reason(err)
            )
            return
        work.outcomes[ref.uid] = ClaimOutcome(devices=done.devices)
        log.debug(
            "prepared claim %s: %s",
            ref,
            ", ".join(f"{d.device_name}({d.mode.value})" for d in done.devices),
        )

    async def _finish_release(self, work: _Work, entry: CheckpointClaim) -> None:
        assert self.enforcer is not None
        try:
            async with self._gpu_locks(entry.devices):
                await self.enforcer.release(entry.ref, entry.devices)
        except DriverError as err:
            # Keep the claim so the kubelet's retry releases what is left.
            work.outcomes[entry.ref.uid] = ClaimOutcome(
                error=f"claim {entry.ref}: {err}", reason=error_reason(err)
            )
            await self._record_quietly(_Change(entry.ref.uid, entry))

    @contextlib.asynccontextmanager
    async def _gpu_locks(self, devices: Sequence[PlannedDevice]) -> AsyncIterator[None]:
        """The locks of the GPUs whose MIG layout ``devices`` change, in a fixed order.

        MPS shares need none here: the mps-agent serialises each GPU's daemon. An MPS
        share inside a MIG instance may create the instance, so it takes its GPU's."""
        gpus = sorted({d.gpu_uuid for d in devices if mig_of(d) is not None})
        async with contextlib.AsyncExitStack() as stack:
            for gpu in gpus:
                await stack.enter_async_context(self._gpu_lock.setdefault(gpu, asyncio.Lock()))
            yield

    # --- recording: a group commit --------------------------------------------

    async def _record(self, change: _Change) -> None:
        """Write ``change`` to the checkpoint with whatever else is waiting; raises
        the write's error."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._changes.append((change, done))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit(), name="checkpoint-commit")
        await done

    async def _record_quietly(self, change: _Change) -> None:
        try:
            await self._record(change)
        except Exception as err:
            # The entry stays as it is on disk (PrepareStarted: rolled back at the
            # next start, or planned again by the kubelet's retry).
            log.error("recording claim %s failed: %s", change.uid, err)

    async def _commit(self) -> None:
        while self._changes:
            changes: list[tuple[_Change, asyncio.Future[None]]] = []
            try:
                async with self.lock.hold():
                    # Taken once the lock is ours: whatever arrived while we waited
                    # for it goes into this write (a batch's pass may have taken all).
                    changes, self._changes = self._changes, []
                    if changes:
                        await asyncio.to_thread(self._apply_changes, [c for c, _ in changes])
            except Exception as err:
                _settle(changes, err)
                continue
            _settle(changes, None)

    def _apply_changes(self, changes: Sequence[_Change]) -> None:
        self.checkpoints.save(with_changes(self.checkpoints.load(), changes))

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

    def _write_specs_and_complete(
        self, checkpoint: Checkpoint, claims: Sequence[tuple[_Work, CheckpointClaim, object]]
    ) -> Checkpoint:
        """Write each claim's CDI spec, then record PrepareCompleted (one write)."""
        completed: list[tuple[_Work, CheckpointClaim]] = []
        for work, entry, _ in claims:
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
            return checkpoint
        for work, entry in completed:
            work.outcomes[entry.ref.uid] = ClaimOutcome(devices=entry.devices)
            log.debug(
                "prepared claim %s: %s",
                entry.ref,
                ", ".join(f"{d.device_name}({d.mode.value})" for d in entry.devices),
            )
        return checkpoint

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
                and not self.cdi.exists(recorded.cdi_spec_file)
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
                or not self.cdi.exists(entry.cdi_spec_file)
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
        if checkpoint is not original or not self.checkpoints.exists():
            self.checkpoints.save(checkpoint)
        report = ReconcileReport(tuple(rolled_back), tuple(rewritten), tuple(orphans))
        return report, rolled_back_entries
