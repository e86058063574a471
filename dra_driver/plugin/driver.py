"""Prepare / unprepare engine: claim refs in, per-claim outcomes out.

Each claim of a NodePrepareResources call is one transaction, read top to bottom
in :meth:`Driver._prepare_claim` and :meth:`Driver._carry_out`::

    GET (the call's claims in parallel, outside any lock)
    plan ─ record PrepareStarted          one journal pass: every claim deciding now, one write
                                          (a plain MPS share's ensure starts as it is written)
    side effects                          MPS share, MIG instance (none for whole GPUs)
    CDI spec                              rendered once, written
    record PrepareCompleted               group commit: with every completion waiting, one write

A failure is answered with :meth:`ClaimOutcome.failed` (the claim's alone; the others
go on) once what was done is undone and the entry dropped; a failed PrepareCompleted
write leaves PrepareStarted, which the kubelet's retry plans again. An
unprepare is the same shape: drop the entry (one pass; a plain MPS share's release
starts as it is written), remove the CDI spec, undo the side effects (a failure
records the entry again, for the kubelet's retry).

The :class:`~dra_driver.plugin.journal.CheckpointJournal` alone holds the node
lock (task + ``flock``) and writes the checkpoint: decisions are serialised, a
PrepareStarted entry is durable before any side effect but a plain MPS share's
ensure, which runs while it is written (:mod:`~dra_driver.plugin.early_shares`:
the agent's state and the start-up reconcile cover a crash), and a claim whose side
effects are in flight is not decided again until its transaction ends (a repeated
or crossing prepare/unprepare waits for it). Side effects run outside the lock,
so claims on different GPUs (and MPS v3 shares of one GPU: the mps-agent runs
different claims' namespaces side by side) are enforced at the same time while
the next claims are decided. MIG changes of one GPU take that GPU's lock.

A call's claims run in a task of their own, so they finish even if the kubelet
gives up on the call: its retry then finds the recorded result (a repeated
prepare returns it; an unprepare of an unknown claim succeeds). The observers
(claim log, metrics, claim status, Events) hear of each claim after its answer
(:mod:`~dra_driver.plugin.announcer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import replace
from typing import Any, Literal

from dra_driver.base.errors import CdiWriteError, DriverError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.cdi import render_spec
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
    mig_of,
    owned_shares,
)
from dra_driver.kubeletplugin.dra_servicer import ClaimOutcome
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.announcer import OutcomeAnnouncer
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.claim_decisions import (
    Answered,
    PrepareInputs,
    Started,
    decide_prepare,
    decide_unprepare,
)
from dra_driver.plugin.current_inventory import CurrentInventory
from dra_driver.plugin.early_shares import EarlyShares, plain_mps
from dra_driver.plugin.enforcement import Enforcer
from dra_driver.plugin.journal import CheckpointJournal, Update
from dra_driver.plugin.startup_reconcile import ReconcileReport, reconcile_files
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, CheckpointStore, ClaimState
from dra_driver.state.locks import NodeLock
from dra_driver.state.mig_shares import keep_handed_over

__all__ = ["Driver", "ReconcileReport"]

log = logging.getLogger(__name__)
# Each claim's outcome is logged once, by observability/claim_log.py (an observer);
# the engine's own lines about claims are DEBUG.

Fetched = ResourceClaim | BaseException


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
        self.cdi = cdi
        self.journal = CheckpointJournal(checkpoints, lock)
        self.activity = activity if activity is not None else CallActivity()
        self.observers: list[DriverObserver] = list(observers)
        """Told of every claim's outcome (metrics, Events, claim status)."""
        self._announcer = OutcomeAnnouncer(self.observers, self.activity)
        self._calls: set[asyncio.Task[dict[ClaimUID, ClaimOutcome]]] = set()
        self._gpu_lock: dict[str, asyncio.Lock] = {}

    @property
    def inventory(self) -> Inventory:
        """The node's GPUs as last discovered."""
        return self._inventory.get()

    @property
    def checkpoints(self) -> CheckpointStore:
        """The checkpoint, to read (the journal writes it)."""
        return self.journal.store

    @property
    def lock(self) -> NodeLock:
        """The node lock the journal takes (the composition root closes it)."""
        return self.journal.lock

    # --- public API ---------------------------------------------------------

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]:
        started = time.monotonic()
        with self.activity.call():
            unique = _unique(refs)
            fetched = await self._get_claims(unique)
            outcomes = await self._run_call(
                [self._prepare_claim(ref, fetched[ref.uid]) for ref in unique], unique
            )
            self._announce("prepare", unique, outcomes, fetched, started)
            return outcomes

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]:
        started = time.monotonic()
        with self.activity.call():
            unique = _unique(refs)
            outcomes = await self._run_call([self._unprepare_claim(ref) for ref in unique], unique)
            self._announce("unprepare", unique, outcomes, {}, started)
            return outcomes

    async def reconcile(self) -> ReconcileReport:
        """Make checkpoint, CDI dir, MPS shares and MIG instances agree; once at start-up."""
        async with self.journal.exclusive() as checkpoints:
            report, rolled_back = await asyncio.to_thread(reconcile_files, checkpoints, self.cdi)
            if self.enforcer is not None:
                for entry in rolled_back:
                    try:
                        await self.enforcer.release(entry.ref, entry.devices)
                        await self.enforcer.destroy_leftover(entry.devices)
                    except DriverError as err:
                        log.error("cleaning up half-prepared claim %s failed: %s", entry.ref, err)
                kept = (await asyncio.to_thread(checkpoints.load)).claims.values()
                owned = [key for entry in kept for key in owned_shares(entry.devices)]
                try:
                    await self.enforcer.release_orphan_shares(owned)
                except DriverError as err:
                    # No agent yet (its DaemonSet may start after us): shares are
                    # checked again at the next start.
                    log.warning("could not reconcile MPS shares with the mps-agent: %s", err)
            return report

    async def close(self) -> None:
        """Wait for the claims in flight, their checkpoint writes and their observers;
        send the MPS share releases deferred until now."""
        while calls := [task for task in self._calls if not task.done()]:
            await asyncio.gather(*calls, return_exceptions=True)
        if self.enforcer is not None:
            await self.enforcer.flush_releases()
        await self.journal.close()
        await self._announcer.close()

    # --- one call -----------------------------------------------------------

    async def _get_claims(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, Fetched]:
        fetched: list[Fetched]
        if len(refs) == 1:  # the kubelet's usual call: no task and gather for one GET
            try:
                fetched = [await self.claims.get_claim(refs[0])]
            except Exception as err:
                fetched = [err]
        else:
            fetched = await asyncio.gather(
                *(self.claims.get_claim(ref) for ref in refs), return_exceptions=True
            )
        return {ref.uid: got for ref, got in zip(refs, fetched, strict=True)}

    async def _run_call(
        self, transactions: list[Coroutine[Any, Any, ClaimOutcome]], refs: Sequence[ClaimRef]
    ) -> dict[ClaimUID, ClaimOutcome]:
        """The call's claims, each its own transaction, in a task of their own: it
        finishes even if our caller gives up (kubelet timeout), and the kubelet's
        retry then finds the recorded result."""

        async def run() -> dict[ClaimUID, ClaimOutcome]:
            if len(transactions) == 1:
                return {refs[0].uid: await transactions[0]}
            outcomes = await asyncio.gather(*transactions)
            return {ref.uid: outcome for ref, outcome in zip(refs, outcomes, strict=True)}

        task = asyncio.create_task(run(), name=f"claims-{refs[0].uid}" if refs else "claims")
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return await asyncio.shield(task)

    def _announce(
        self,
        operation: Literal["prepare", "unprepare"],
        refs: Sequence[ClaimRef],
        outcomes: dict[ClaimUID, ClaimOutcome],
        fetched: dict[ClaimUID, Fetched],
        started: float,
    ) -> None:
        if not self.observers:
            return
        seconds = time.monotonic() - started
        self._announcer.announce(
            [
                ClaimOperation(
                    operation=operation,
                    ref=ref,
                    seconds=seconds,
                    devices=tuple(d for d in outcome.devices if isinstance(d, PlannedDevice)),
                    error=outcome.error,
                    reason=outcome.reason if outcome.error else "",
                    claim=got if isinstance(got := fetched.get(ref.uid), ResourceClaim) else None,
                    repeated=outcome.repeated,
                )
                for ref in refs
                if (outcome := outcomes.get(ref.uid)) is not None
            ]
        )

    # --- one claim's transactions -------------------------------------------------

    async def _prepare_claim(self, ref: ClaimRef, fetched: Fetched) -> ClaimOutcome:
        """Plan and record PrepareStarted, side effects, CDI spec, record PrepareCompleted."""

        def decide(checkpoint: Checkpoint) -> tuple[Checkpoint, Answered | Started]:
            inputs = PrepareInputs(
                ref, fetched, self.inventory, self.ctx, self.cdi.path_for(ref.uid), self.cdi.exists
            )
            return decide_prepare(checkpoint, inputs)

        early = self.enforcer.early_shares(ref) if self.enforcer is not None else None

        def on_decided(decided: Answered | Started) -> None:
            # While PrepareStarted is written: the claim's plain MPS shares (see
            # early_shares for why they need no entry on disk first).
            if early is not None and isinstance(decided, Started) and decided.spec is not None:
                early.start(decided.entry.devices)

        try:
            async with self.journal.decision(ref.uid, decide, on_decided) as decided:
                if isinstance(decided, Answered):
                    return decided.outcome
                return await self._carry_out(decided, early)
        except Exception as err:  # the pass failed (lock, checkpoint): nothing is on disk
            if early is not None:
                await early.abandon()
            return self._failed(ref, err)
        except BaseException:
            if early is not None:
                early.abandon_later()
            raise

    async def _carry_out(self, started: Started, early: EarlyShares | None) -> ClaimOutcome:
        """The rest of a prepare once its PrepareStarted entry is durable."""
        ref = started.entry.ref
        entry: CheckpointClaim | None = None
        try:
            entry = await self._apply_side_effects(started, early)
            await self._write_spec(entry)
        except Exception as err:
            # A lost spec's side effects serve the claim's running containers: kept
            # (the kubelet's retry plans the claim again and finds them in place).
            await self._undo_prepare(ref, entry if started.spec is not None else None)
            return self._failed(ref, err)
        done = replace(entry, state=ClaimState.PREPARE_COMPLETED)
        try:
            await self.journal.record(lambda cp: cp.with_claim(_as_recorded(done, cp)))
        except Exception as err:
            # Left PrepareStarted on disk: the kubelet's retry plans it again.
            return self._failed(ref, err)
        log.debug(
            "prepared claim %s: %s",
            ref,
            ", ".join(f"{d.device_name}({d.mode.value})" for d in done.devices),
        )
        return ClaimOutcome(devices=done.devices)

    async def _apply_side_effects(
        self, started: Started, early: EarlyShares | None
    ) -> CheckpointClaim:
        """The entry with what its side effects made and its CDI spec (rendered once);
        on failure the enforcer has undone this claim's and raises."""
        entry, spec = started.entry, started.spec
        if spec is None:  # a prepared claim's lost spec: its side effects are in place
            return entry
        devices = entry.devices
        if self.enforcer is not None and self.enforcer.must_settle_releases(devices):
            await self.enforcer.settle_releases(devices)  # a whole GPU after its MPS shares
        if self.enforcer is not None and _has_side_effects(devices):
            async with self._gpu_locks(devices):
                devices, spec = await self.enforcer.apply(entry.ref, devices, spec, early)
        return replace(entry, devices=devices, cdi_spec=render_spec(spec))

    async def _write_spec(self, entry: CheckpointClaim) -> None:
        try:
            if self.cdi.in_memory:  # a few microseconds: cheaper than a thread hop
                self.cdi.write(entry.ref.uid, entry.cdi_spec or {})
            else:
                await asyncio.to_thread(self.cdi.write, entry.ref.uid, entry.cdi_spec or {})
        except OSError as err:
            failure = CdiWriteError(f"cannot write CDI spec {entry.cdi_spec_file}: {err}")
            log.error("claim %s: %s", entry.ref, failure)
            raise failure from err

    async def _undo_prepare(self, ref: ClaimRef, applied: CheckpointClaim | None) -> None:
        """Release ``applied``'s side effects (None: none were made) and drop the entry."""
        if applied is not None:
            try:
                await self._release(applied)
            except DriverError as undo:
                log.error("claim %s: undoing its side effects failed: %s", ref, undo)
        await self._record_quietly(ref, lambda cp: cp.without(ref.uid))

    async def _unprepare_claim(self, ref: ClaimRef) -> ClaimOutcome:
        """Drop the entry, remove the CDI spec, undo the side effects."""

        def decide(checkpoint: Checkpoint) -> tuple[Checkpoint, CheckpointClaim | None]:
            return decide_unprepare(checkpoint, ref)

        early: list[asyncio.Task[None]] = []
        enforcer = self.enforcer

        def on_decided(leaving: CheckpointClaim | None) -> None:
            # While the entry's removal is written: a plain MPS share's release
            # (early_shares says why that is safe), unless it waits for a lull
            # once the entry is gone (deferred_releases says why).
            if (
                leaving is not None
                and enforcer is not None
                and plain_mps(leaving.devices)
                and not enforcer.may_defer_release(leaving.devices)
            ):
                early.append(asyncio.create_task(self._release(leaving)))

        try:
            async with self.journal.decision(ref.uid, decide, on_decided) as leaving:
                if leaving is None:
                    return ClaimOutcome()
                try:
                    await self._remove_spec(leaving)
                    if early:
                        await early.pop()
                    elif enforcer is None or not enforcer.release_later(
                        leaving.ref, leaving.devices
                    ):
                        await self._release(leaving)
                except Exception:
                    # Keep the claim so the kubelet's retry releases what is left.
                    await self._record_quietly(ref, lambda cp: cp.with_claim(leaving))
                    raise
        except Exception as err:
            for release in early:  # the removal failed: the kubelet's retry releases again
                with contextlib.suppress(Exception):  # logged by the enforcer
                    await release
            return self._failed(ref, err)
        log.debug("unprepared claim %s", ref)
        return ClaimOutcome()

    async def _remove_spec(self, entry: CheckpointClaim) -> None:
        if not entry.cdi_spec_file:
            return
        if self.cdi.in_memory:
            self.cdi.remove(entry.cdi_spec_file)
        else:
            await asyncio.to_thread(self.cdi.remove, entry.cdi_spec_file)

    async def _release(self, entry: CheckpointClaim) -> None:
        if self.enforcer is not None and _has_side_effects(entry.devices):
            async with self._gpu_locks(entry.devices):
                await self.enforcer.release(entry.ref, entry.devices)

    async def _record_quietly(self, ref: ClaimRef, update: Update) -> None:
        try:
            await self.journal.record(update)
        except Exception as err:
            # The entry stays as it is on disk (PrepareStarted: rolled back at the
            # next start, or planned again by the kubelet's retry).
            log.error("recording claim %s failed: %s", ref, err)

    def _failed(self, ref: ClaimRef, err: BaseException) -> ClaimOutcome:
        outcome = ClaimOutcome.failed(ref, err)
        if isinstance(err, DriverError):
            log.debug("%s", outcome.error)
        else:  # a bug: the claim still gets an answer
            log.error("%s", outcome.error, exc_info=err)
        return outcome

    def _gpu_locks(
        self, devices: Sequence[PlannedDevice]
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """The locks of the GPUs whose MIG layout ``devices`` change, in a fixed order.

        MPS shares need none here: the mps-agent orders what must be (a share's own
        commands, its GPU's daemon start and stop, every legacy change). An MPS
        share inside a MIG instance may create the instance, so it takes its GPU's.
        No MIG device: nothing to take (no generator and exit stack per MPS claim)."""
        gpus = sorted({d.gpu_uuid for d in devices if mig_of(d) is not None})
        if not gpus:
            return contextlib.nullcontext()
        return self._take_gpu_locks(gpus)

    @contextlib.asynccontextmanager
    async def _take_gpu_locks(self, gpus: Sequence[str]) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for gpu in gpus:
                await stack.enter_async_context(self._gpu_lock.setdefault(gpu, asyncio.Lock()))
            yield


def _as_recorded(done: CheckpointClaim, checkpoint: Checkpoint) -> CheckpointClaim:
    """``done`` with a MIG instance handed to it while its side effects ran (mig_shares)."""
    return keep_handed_over(done, checkpoint.claims.get(done.ref.uid))


def _has_side_effects(devices: Sequence[PlannedDevice]) -> bool:
    return any(isinstance(d, MpsShare | MpsInMig | MigInstance) for d in devices)


def _unique(refs: Sequence[ClaimRef]) -> list[ClaimRef]:
    seen: dict[ClaimUID, ClaimRef] = {}
    for ref in refs:
        seen.setdefault(ref.uid, ref)
    return list(seen.values())
