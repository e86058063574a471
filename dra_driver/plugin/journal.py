"""The checkpoint as the claims' transactions use it: batched decisions, a group commit.

:class:`CheckpointJournal` alone takes the node lock (task + ``flock``,
:mod:`dra_driver.state.locks`) and alone writes the checkpoint while the plugin
serves. It offers two things, both written by one writer task, one pass at a
time::

    pass:  lock ─ load ─ apply the records ─ decide the claims ─ save (once) ─ unlock

* :meth:`CheckpointJournal.decision` decides one claim against the checkpoint as
  it is on disk (with the decisions before it in the same pass), and answers only
  once the pass's write is durable: a PrepareStarted entry is on disk before any
  side effect. Every claim waiting when a pass takes the lock is decided in that
  pass, in arrival order (one write for all of them). Its ``on_decided``, if
  given, hears the result as soon as the pass has decided, while the write is
  still in progress: the caller may start what is safe to start before the entry
  is durable (an MPS share's ensure, :mod:`~dra_driver.plugin.early_shares`).
  The claim then stays *held* until its caller leaves the ``async with``: a
  second decision of it (a repeated or crossing prepare/unprepare) waits for its
  side effects to finish.
* :meth:`CheckpointJournal.record` writes one claim's change (PrepareCompleted, a
  removal) with every other change waiting: those that arrive while a pass is
  writing go together into the next (a group commit), with that pass's decisions.

A pass that cannot take the lock or read or write the checkpoint fails every
decision and record in it (nothing of them is known to be on disk); a decision
that raises fails that claim only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dra_driver.base.ids import ClaimUID
from dra_driver.state.checkpoint import Checkpoint, CheckpointStore
from dra_driver.state.locks import NodeLock

log = logging.getLogger(__name__)

T = TypeVar("T")

Decide = Callable[[Checkpoint], tuple[Checkpoint, T]]
"""One claim's decision: the checkpoint so far in, the checkpoint to write and the
result out; returns the same checkpoint object when it changes nothing. Runs in a
worker thread, under the node lock."""

Update = Callable[[Checkpoint], Checkpoint]
"""One claim's recorded change."""


OnDecided = Callable[[Any], None]
"""Told a decision's result on the event loop before the pass's write is durable;
not told when the decision raised. It must not raise (what it raises is logged)."""


@dataclass(eq=False)
class _Decision:
    uid: ClaimUID
    decide: Decide[Any]
    answer: asyncio.Future[Any]
    on_decided: OnDecided | None = None


@dataclass(eq=False)
class _Record:
    update: Update
    written: asyncio.Future[None]


class CheckpointJournal:
    def __init__(self, store: CheckpointStore, lock: NodeLock) -> None:
        self.store = store
        self.lock = lock
        self._decisions: list[_Decision] = []
        self._records: list[_Record] = []
        self._held: set[ClaimUID] = set()
        """Claims decided whose callers are still inside their ``async with``."""
        self._writer: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def decision(
        self, uid: ClaimUID, decide: Decide[T], on_decided: OnDecided | None = None
    ) -> AsyncIterator[T]:
        """``decide``'s result once it is on disk; ``uid`` is held until the block exits.

        ``on_decided`` hears the result before the write is durable (it may then
        still fail: the block is not entered and the pass's error raised).
        Raises the pass's error (lock, checkpoint) or ``decide``'s own."""
        answer: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._decisions.append(_Decision(uid, decide, answer, on_decided))
        self._wake_writer()
        try:
            result = await answer
        except asyncio.CancelledError:
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                self._release(uid)  # decided just as our caller gave up
            raise
        try:
            yield result
        finally:
            self._release(uid)

    async def record(self, update: Update) -> None:
        """Write ``update`` with whatever else is waiting; raises the write's error."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._records.append(_Record(update, written))
        self._wake_writer()
        await written

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[CheckpointStore]:
        """The node lock and the store, for work outside any pass (start-up reconcile)."""
        async with self.lock.hold():
            yield self.store

    async def close(self) -> None:
        """Wait for the pass in progress and those it leaves ready."""
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)

    # --- the writer ---------------------------------------------------------------

    def _release(self, uid: ClaimUID) -> None:
        self._held.discard(uid)
        if self._decisions:
            self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_passes(), name="checkpoint-journal")

    def _has_work(self) -> bool:
        return bool(self._records) or any(d.uid not in self._held for d in self._decisions)

    async def _write_passes(self) -> None:
        # Ends when nothing is ready; a release or a new request starts it again
        # (the check and the end are one step of the loop: no wake-up is lost).
        while self._has_work():
            await self._write_pass()
            # Let the claims just answered run to their next step first: a quick
            # claim's completion (no side effects) then joins the next pass instead of
            # following it in a pass of its own.
            await asyncio.sleep(0)

    def _take(self) -> tuple[list[_Decision], list[_Record]]:
        """The records, and the decisions of claims not held (one per claim: a second
        one waits for the first's caller), marking those claims held."""
        taken: list[_Decision] = []
        waiting: list[_Decision] = []
        for decision in self._decisions:
            if decision.answer.cancelled():
                continue  # its caller gave up before it was decided
            if decision.uid in self._held:
                waiting.append(decision)
                continue
            self._held.add(decision.uid)
            taken.append(decision)
        self._decisions = waiting
        records, self._records = self._records, []
        return taken, records

    async def _write_pass(self) -> None:
        decisions: list[_Decision] = []
        records: list[_Record] = []
        try:
            async with self.lock.hold():
                # Taken once the lock is ours: whatever arrived while we waited for
                # it goes into this write.
                decisions, records = self._take()
                loop = asyncio.get_running_loop()
                results = await asyncio.to_thread(self._apply, decisions, records, loop)
        except Exception as err:  # lock timeout, checkpoint unreadable or unwritable
            if not decisions and not records:
                decisions, records = self._take()
            log.error(
                "prepare/unprepare batch failed (%d claim decision(s), %d record(s)): %s",
                len(decisions),
                len(records),
                err,
            )
            for decision in decisions:
                self._held.discard(decision.uid)
                _settle(decision.answer, None, err)
            for record in records:
                _settle(record.written, None, err)
            return
        for record in records:
            _settle(record.written, None, None)
        for decision, (value, error) in zip(decisions, results, strict=True):
            if error is not None or decision.answer.cancelled():
                self._held.discard(decision.uid)  # no caller will hold it
            _settle(decision.answer, value, error)

    def _apply(
        self,
        decisions: list[_Decision],
        records: list[_Record],
        loop: asyncio.AbstractEventLoop,
    ) -> list[tuple[Any, Exception | None]]:
        """In a worker thread, under the lock: load, apply, decide, tell the
        ``on_decided`` listeners (on the loop), save once."""
        loaded = checkpoint = self.store.load()
        for record in records:
            checkpoint = record.update(checkpoint)
        results: list[tuple[Any, Exception | None]] = []
        for decision in decisions:
            try:
                checkpoint, value = decision.decide(checkpoint)
            except Exception as err:  # a bug in one claim's decision fails that claim
                log.error("deciding claim %s failed: %r", decision.uid, err, exc_info=err)
                results.append((None, err))
                continue
            results.append((value, None))
        told = [
            (decision.on_decided, value)
            for decision, (value, error) in zip(decisions, results, strict=True)
            if decision.on_decided is not None and error is None
        ]
        if told:
            # Before the save: what the listeners start runs while it is written.
            loop.call_soon_threadsafe(_tell, told)
        if records or checkpoint is not loaded:
            self.store.save(checkpoint)
        return results


def _tell(told: list[tuple[OnDecided, Any]]) -> None:
    for on_decided, value in told:
        try:
            on_decided(value)
        except Exception as err:  # a listener's bug: its claim goes on without it
            log.error("a decision's listener failed: %r", err, exc_info=err)


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # its waiter gave up (cancelled)
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
