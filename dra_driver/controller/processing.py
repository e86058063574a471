"""One claim processed: decided (pure :func:`~.reconcile.decide`) and the decision carried
out (the writes, the Events), until the claim needs nothing more.

An allocation is held (:meth:`~.inflight.InFlight.decided`) before its first write is
sent, so the next claim, decided while these writes are in flight, sees it; the writer
(:mod:`.claim_writes`) moves the claim's in-flight record with each write. A conflict
re-reads the claim and decides again, up to :data:`MAX_CONFLICT_RETRIES` times, then
the claim is queued after the error backoff. Only the leader's worker calls this.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from dra_driver.base.errors import ApiConflictError
from dra_driver.controller.caches import ControllerCaches
from dra_driver.controller.claim_writes import AllocationTurn, ClaimWriter
from dra_driver.controller.config import ControllerConfig
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.reconcile import (
    Allocate,
    ClusterView,
    Deallocate,
    Decision,
    Ignore,
    RecordRejected,
    Refuse,
    Wait,
    deallocation_patch,
    decide,
    describe_allocation,
    finalizer_removal_patch,
    rejected_patch,
)
from dra_driver.core import claim_shape
from dra_driver.k8s.rest import JsonObj

log = logging.getLogger(__name__)

MAX_CONFLICT_RETRIES = 5


class ClaimTurn(AllocationTurn, Protocol):
    """A claim's place in its batch as the processor uses it (:class:`~.worker.ClaimSlot`):
    its allocation waits its turn, and it tells when it has none to write or its writes
    are done."""

    def pass_turn(self) -> None: ...

    def written(self) -> None: ...


class ClaimProcessor:
    def __init__(
        self,
        config: ControllerConfig,
        caches: ControllerCaches,
        writes: ClaimWriter,
        *,
        events: ClaimEventRecorder,
        queue: WorkQueue,
        metrics: ControllerMetrics,
        freed: Callable[[], None],
        share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        """``freed()``: an allocation was given back (the pending claims are queued)."""
        self.config = config
        self._caches = caches
        self.claim_writes = writes
        self._events = events
        self._queue = queue
        self._metrics = metrics
        self._freed = freed
        self._share_id = share_id

    @property
    def writes(self) -> int:
        """Claim writes answered so far."""
        return self.claim_writes.writes

    def view(self) -> ClusterView:
        """What :func:`decide` reads: the allocator's state kept across claims (so no
        slice or allocated claim is read again per claim), our writes, the quotas."""
        return ClusterView(
            driver_name=self.config.driver_name,
            state=self._caches.ledger.state(),
            written=self._caches.inflight.written_nodes,
            share_id=self._share_id,
            namespaces=self._caches.namespaces_by_name(),
        )

    async def process(self, uid: str, turn: ClaimTurn | None = None) -> None:
        """Decide and apply until the claim needs nothing more; re-read on conflicts."""
        caches = self._caches
        started = time.monotonic()
        claim = caches.current_claim(uid)
        for _ in range(MAX_CONFLICT_RETRIES):
            if claim is None:
                return
            decision = decide(claim, caches.pods_of(claim), caches.nodes_by_name(), self.view())
            if turn is not None and not isinstance(decision, Allocate | RecordRejected):
                turn.pass_turn()  # no allocation to send: the next claim's may go
            if isinstance(decision, Allocate):
                # Held now, before the first write is sent: the next claim is decided
                # while these writes are in flight and must see it.
                caches.inflight.decided(uid, claim_shape.namespace(claim), decision.allocation)
            try:
                again = await self.apply(claim, decision, turn)
            except ApiConflictError as err:
                caches.inflight.abandon(uid, err)
                log.info("claim %s: %s; re-reading", uid, err)
                claim = await self.claim_writes.get(claim)
                continue
            except BaseException as err:
                caches.inflight.abandon(uid, err)
                raise
            self._count(decision, time.monotonic() - started)
            if again is None:
                return
            claim = again
        self._queue.add_after(uid, self.config.error_backoff_s)

    def _count(self, decision: Decision, seconds: float) -> None:
        match decision:
            case Allocate():
                self._metrics.allocated(seconds)
                self._caches.changed = True
            case Wait(event=True, cause=cause):
                self._metrics.failed(cause or "unfit")
            case Refuse(cause=cause):
                self._metrics.failed(cause)
            case Deallocate() | RecordRejected():
                self._caches.changed = True

    async def apply(  # noqa: PLR0911
        self, claim: JsonObj, decision: Decision, turn: ClaimTurn | None = None
    ) -> JsonObj | None:
        """Carry out ``decision``; returns the claim when it needs another decision.
        ``turn``: the claim's place in its batch (its allocation waits its turn)."""
        uid = claim_shape.key(claim)
        events = self._events
        match decision:
            case Ignore():
                return None
            case Wait(reason=reason, event=event):
                if event:
                    events.post(claim, "CannotAllocate", reason, "Warning")
                    self._queue.add_after(uid, self.config.retry_unfit_s)
                return None
            case Refuse(reason=reason):
                events.post(claim, "AllocationRefused", reason, "Warning")
                return None
            case Allocate(allocation=allocation, node=node, reserve_for=reserve_for):
                claim = await self.claim_writes.allocate(
                    claim, allocation, turn, node=node or "", reserve_for=reserve_for
                )
                if turn is not None:
                    turn.written()
                if self.config.allocation_events:
                    events.post(claim, "Allocated", describe_allocation(allocation))
                return None
            case RecordRejected(node=node):
                claim = await self.claim_writes.patch_metadata(
                    claim, rejected_patch(claim, node), "the rejected-nodes annotation"
                )
                self._caches.inflight.took_back(uid)
                events.post(
                    claim,
                    "NodeRejected",
                    f"the scheduler cleared the allocation on node {node}; allocating elsewhere",
                    "Warning",
                )
                return claim
            case Deallocate(clear_status=clear_status):
                if clear_status:
                    claim = await self.claim_writes.patch(
                        claim, deallocation_patch(claim), status=True
                    )
                    self._caches.ledger.claim_seen(claim)  # freed: the state is built anew
                    self._caches.inflight.took_back(uid)
                    events.post(
                        claim, "Deallocated", "allocated but never reserved and no pod uses it"
                    )
                unprotect = finalizer_removal_patch(claim)
                if unprotect is not None:
                    await self.claim_writes.patch(claim, unprotect)
                self._freed()
                return None
        return None
