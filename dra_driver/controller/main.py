"""The controller process: informers, the assume cache, a work queue, a leader-only worker.

Every replica keeps its caches warm; only the Lease holder processes the queue
and writes. One worker decides claim after claim, so every decision sees the
previous one: the allocator's state (:mod:`.ledger_cache`) records a decision
before its writes are sent, and the assume cache holds our writes, laid over the
informer's claims until the watch shows a resourceVersion at least as new. The
writes themselves are in flight side by side (up to ``write_concurrency`` claims),
so one claim's round trips never wait behind another's; a claim's own steps stay
in order (finalizer, then allocation), and a write that fails drops the decision
from the allocator's state before the claim is decided again.

Placement order (:mod:`.worker`): the worker starts the largest claim it holds next
(:func:`~.reconcile.placement_key`), taking in what the queue holds each time a
write slot frees, so a burst is packed as best fit packs it sorted rather than in
arrival order, even when its claims span many reads of the queue. The batching
window (``batch_window_s``) holds only an idle worker's first claim, so that the
claims that come with it are sorted together; a claim that comes while others are
worked waits for no window. Retries and backoff stay per claim (the queue's). 0
turns the order off: one claim at a time in arrival order, its writes done before
the next is decided.

Namespaces are watched for the VRAM quota annotation; a change to one requeues
that namespace's pending claims. Metrics (:mod:`.metrics`) are kept by every
replica and served when ``metrics_port`` is set.

Restart: nothing is persisted here. The ledger is rebuilt from every allocated
claim in the informer; rejected nodes live on the claim (annotation). What is
lost is the in-memory record of allocations we wrote (``written``), which turns
a scheduler's clearing into a rejected node; after a restart a cleared claim is
allocated again without excluding that node, and is recorded on the next clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from dra_driver.allocator import SelectorCache
from dra_driver.base.errors import ApiConflictError, ApiError
from dra_driver.controller.assume import AssumeCache
from dra_driver.controller.claim_index import ClaimPodIndex
from dra_driver.controller.claim_sizes import ClaimSizes
from dra_driver.controller.claim_writes import ClaimWriter
from dra_driver.controller.config import ControllerConfig
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.controller.informer import (
    CLAIMS,
    CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    SLICES,
    ChangeHandler,
    Informer,
    KindPath,
    uid_of,
)
from dra_driver.controller.leader import LeaderElector
from dra_driver.controller.ledger_cache import LedgerCache, Sources
from dra_driver.controller.lenient import allocated, deleting
from dra_driver.controller.lenient import namespace as claim_namespace
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
    is_ours,
    placement_key,
    pod_uses,
    rejected_patch,
    size_rank,
)
from dra_driver.controller.worker import ClaimSlot, Rank, work_claims
from dra_driver.core import claim_shape
from dra_driver.k8s.event_queue import WriteLane
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport

log = logging.getLogger(__name__)


MAX_CONFLICT_RETRIES = 5

_IN_ARRIVAL = ((0,), (0,))


def _arrival_order(uid: str) -> tuple[tuple[Any, ...], Rank]:
    """Without a window: every claim in one place, so the worker keeps queue order."""
    return _IN_ARRIVAL


InformerFactory = Callable[[KindPath, ChangeHandler], Informer]
"""(kind, change handler) → the informer of that kind, telling that handler."""

Work = Callable[[], Coroutine[Any, Any, object]]
"""A background task's body, run for the controller's lifetime."""


class Controller:
    """The controller's caches, queue and worker, given their collaborators: the API
    transport its writes go through, an informer per kind (made by ``informer``, each
    telling one of this controller's change handlers), the work queue, the Event
    recorder, the leader elector and the metrics (built by
    :func:`dra_driver.app.controller.build_controller`)."""

    def __init__(
        self,
        config: ControllerConfig,
        http: ApiTransport,
        *,
        informer: InformerFactory,
        queue: WorkQueue,
        events: ClaimEventRecorder,
        elector: LeaderElector,
        metrics: ControllerMetrics,
        lane: WriteLane | None = None,
        share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        """``http``: every request of the controller's own (the claims' reads and
        patches; the informers, the Lease and the Events have it too): closed by
        :meth:`close`."""
        self.config = config
        self._share_id = share_id
        self.claims = informer(CLAIMS, self._claim_changed)
        self.pods = informer(PODS, self._pod_changed)
        self.slices = informer(SLICES, self._capacity_changed)
        self.classes = informer(CLASSES, self._capacity_changed)
        self.nodes = informer(NODES, self._nodes_changed)
        self.namespaces = informer(NAMESPACES, self._namespace_changed)
        self.informers = (
            self.claims,
            self.pods,
            self.slices,
            self.classes,
            self.nodes,
            self.namespaces,
        )
        self.queue = queue
        self.assume = AssumeCache(self.claims)
        self.written: dict[str, str] = {}
        """Claim UID -> node of an allocation we wrote and did not take back."""
        self.events = events
        self.elector = elector
        self._selectors = SelectorCache()
        self.ledger = LedgerCache(
            config.driver_name,
            Sources(
                slices=self.slices.each,
                classes=self.classes.values,
                allocated_claims=self.all_claims,
            ),
            self._selectors,
        )
        self.index = ClaimPodIndex()
        self._unallocated_ours: set[str] = set()
        """UIDs of the claims of ours the informer shows unallocated: with the assumed
        ones, every claim a change of capacity may let through (:meth:`_enqueue_ours`
        with ``pending_only`` looks at these, not at every claim cached: a claim
        deleted or freed would otherwise cost a pass over all of them on the loop)."""
        self.sizes = ClaimSizes(config.driver_name)
        self._nodes_index: dict[str, JsonObj] | None = None
        self._namespaces_index: dict[str, JsonObj] | None = None
        """Nodes and Namespaces by name, built when first asked after a change."""
        self._http = http
        self.claim_writes = ClaimWriter(http, self.assume, events, lane=lane, missed=queue.add)
        self.metrics = metrics
        self._cluster_changed = True
        """Something the metrics' gauges show changed since they were last computed."""

    # --- cache views ---------------------------------------------------------------

    def current_claim(self, uid: str) -> JsonObj | None:
        return self.assume.current(uid)

    def all_claims(self) -> list[JsonObj]:
        return self.assume.all()

    def view(self) -> ClusterView:
        """What :func:`decide` reads: the allocator's state kept across claims (so no
        slice or allocated claim is read again per claim), our writes, the quotas."""
        return ClusterView(
            driver_name=self.config.driver_name,
            state=self.ledger.state(),
            written=self.written,
            share_id=self._share_id,
            namespaces=self._namespaces_by_name(),
        )

    def _nodes_by_name(self) -> dict[str, JsonObj]:
        if self._nodes_index is None:
            self._nodes_index = {
                str((n.get("metadata") or {}).get("name")): n for n in self.nodes.values()
            }
        return self._nodes_index

    def _namespaces_by_name(self) -> dict[str, JsonObj]:
        if self._namespaces_index is None:
            self._namespaces_index = {
                str((n.get("metadata") or {}).get("name")): n for n in self.namespaces.values()
            }
        return self._namespaces_index

    def pods_of(self, claim: JsonObj) -> list[JsonObj]:
        """The pods that may use ``claim`` (the index's; :func:`decide` checks each)."""
        return [p for u in self.index.pods_of(claim) if (p := self.pods.get(u)) is not None]

    # --- change handlers (on the loop) -------------------------------------------------

    def _claim_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        self._cluster_changed = True
        if etype == "SYNCED":
            claims = self.claims.values()
            self.index.reset_claims(claims)
            self._unallocated_ours = {uid_of(c) for c in claims if is_ours(c) and not allocated(c)}
            self.sizes.retain(self.claims.uids())
            self.ledger.invalidate()  # a relist may have dropped or changed anything
            self._enqueue_ours()
            return
        uid = uid_of(new)
        known = self.assume.seen(new)
        if etype == "DELETED" or not is_ours(new) or allocated(new):
            self._unallocated_ours.discard(uid)
        else:
            self._unallocated_ours.add(uid)
        if etype == "DELETED":
            self.assume.forget(uid)
            self.written.pop(uid, None)
            self.index.claim_gone(uid)
            self.ledger.claim_gone(uid)
            self.sizes.forget(uid)
        else:
            self.index.claim_changed(new)
            current = self.current_claim(uid)
            if current is not None:
                self.ledger.claim_seen(current)
        echo = etype == "MODIFIED" and (known or self.claim_writes.echo(new))
        if is_ours(new) and not echo:
            # The echo of our own write was decided upon when it was written (and the
            # worker goes on from its answer): deciding it again finds nothing to do.
            self.queue.add(uid)
        freed = etype == "DELETED" or not allocated(new)
        if freed and allocated(old):
            self._enqueue_ours(pending_only=True)

    def _pod_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        if etype == "SYNCED":
            self.index.reset_pods(self.pods.values())
            self._enqueue_ours()
            return
        if etype == "DELETED":
            self.index.pod_gone(uid_of(new))
        else:
            self.index.pod_changed(new)
        for uid in self.index.claims_of(new) | (self.index.claims_of(old) if old else set()):
            claim = self.claims.get(uid)
            if claim is not None and is_ours(claim) and (pod_uses(new, claim) or old):
                self.queue.add(uid)

    def _capacity_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        self._cluster_changed = True
        self.ledger.invalidate()
        self._enqueue_ours(pending_only=True)

    def _nodes_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        """A Node's labels and taints decide where a pod may go, not what is free."""
        self._nodes_index = None
        self._cluster_changed = True
        self._enqueue_ours(pending_only=True)

    def _namespace_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        """A namespace's quota may have changed: its pending claims are tried again."""
        self._namespaces_index = None
        if etype == "SYNCED":
            self._enqueue_ours(pending_only=True)
            return
        self._enqueue_ours(
            pending_only=True, namespace=str((new.get("metadata") or {}).get("name", ""))
        )

    def _enqueue_ours(self, pending_only: bool = False, namespace: str | None = None) -> None:
        for claim in self._pending_claims() if pending_only else self.all_claims():
            if not is_ours(claim):
                continue
            if pending_only and allocated(claim):
                continue
            if namespace is not None and claim_namespace(claim) != namespace:
                continue
            self.queue.add(uid_of(claim))

    def _pending_claims(self) -> list[JsonObj]:
        """A superset of the claims of ours unallocated as we know them: those the
        informer shows so, and those we wrote (their current copy may be ours)."""
        uids = self._unallocated_ours | set(self.assume.assumed)
        return [c for c in (self.current_claim(u) for u in uids) if c is not None]

    # --- running -------------------------------------------------------------------

    def background(self) -> dict[str, Work]:
        """The tasks that must run as long as the controller, by name: an informer per
        kind, the leader election, the leader's worker, the resync, the metrics and the
        Events' sender. Cancelling them ends every loop and releases the Lease."""
        work: dict[str, Work] = {f"informer-{i.kind.name}": i.run for i in self.informers}
        work["leader-election"] = self.elector.run
        work["worker"] = self._lead
        work["resync"] = self._resync
        work["metrics"] = self._refresh_metrics
        if self.events.queue is not None:
            work["events"] = self.events.run
        return work

    async def close(self) -> None:
        """After the background tasks: wake whoever waits on the queue; close the kept
        connections to the API server."""
        self.queue.close()
        await self._http.close()

    async def synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_s)
            self._enqueue_ours()

    async def _refresh_metrics(self) -> None:
        await self.synced()
        while True:
            if self._cluster_changed and self.metrics.wanted:
                self._cluster_changed = self.metrics.wanted = False
                try:
                    self.refresh_cluster_metrics()
                except Exception:  # metrics are advice: never a reason to stop allocating
                    log.exception("could not refresh the controller's cluster metrics")
            await asyncio.sleep(self.config.metrics_refresh_s)

    def refresh_cluster_metrics(self) -> None:
        """Recompute the free memory per device and the pending claims from the caches."""
        claims = self.all_claims()
        state = self.ledger.state()  # decisions in flight count as taken
        pending = sum(1 for c in claims if is_ours(c) and not allocated(c) and not deleting(c))
        self.metrics.set_cluster(state.free_memory(), pending)

    async def _lead(self) -> None:
        await self.synced()
        while True:
            await self.elector.leading.wait()
            self._enqueue_ours()
            worker = asyncio.create_task(self._work())
            lost = asyncio.create_task(self.elector.lost.wait())
            try:
                await asyncio.wait({worker, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (worker, lost):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if worker.done() and not worker.cancelled() and worker.exception() is not None:
                raise worker.exception()  # type: ignore[misc]

    def _concurrency(self) -> int:
        return max(1, self.config.write_concurrency) if self.config.batch_window_s > 0 else 1

    async def _work(self) -> None:
        """Claims in placement order, up to :meth:`_concurrency` at once
        (:func:`~.worker.work_claims`). A claim that fails with anything but an API
        error stops the worker with that error."""
        await work_claims(
            self.queue,
            batch_window_s=self.config.batch_window_s,
            concurrency=self._concurrency(),
            order=self._placement if self.config.batch_window_s > 0 else _arrival_order,
            work=self._work_claim,
        )

    def _placement(self, uid: str) -> tuple[tuple[Any, ...], Rank]:
        """Largest first; claims that allocate nothing first of all, in queue order."""
        key = placement_key(uid, self.current_claim(uid), self.config.driver_name, self.sizes)
        return key, size_rank(key)

    async def _work_claim(self, uid: str, slot: ClaimSlot) -> None:
        try:
            if self.elector.is_leader:
                await self.process(uid, slot)
        except ApiError as err:
            log.warning("claim %s: %s; retrying in %.1fs", uid, err, self.config.error_backoff_s)
            self.queue.add_after(uid, self.config.error_backoff_s)

    # --- one claim -----------------------------------------------------------------

    @property
    def writes(self) -> int:
        """Claim writes answered so far."""
        return self.claim_writes.writes

    async def process(self, uid: str, slot: ClaimSlot | None = None) -> None:
        """Decide and apply until the claim needs nothing more; re-read on conflicts."""
        started = time.monotonic()
        claim = self.current_claim(uid)
        for _ in range(MAX_CONFLICT_RETRIES):
            if claim is None:
                return
            decision = decide(claim, self.pods_of(claim), self._nodes_by_name(), self.view())
            if slot is not None and not isinstance(decision, Allocate | RecordRejected):
                slot.pass_turn()  # no allocation to send: the next claim's may go
            if isinstance(decision, Allocate):
                # Taken now, before the first write is sent: the next claim is decided
                # while these writes are in flight and must see it.
                self.ledger.decided(uid, claim_shape.namespace(claim), decision.allocation)
            try:
                again = await self.apply(claim, decision, slot)
            except ApiConflictError as err:
                self.ledger.failed(uid)
                log.info("claim %s: %s; re-reading", uid, err)
                claim = await self.claim_writes.get(claim)
                continue
            except BaseException:
                self.ledger.failed(uid)
                raise
            self._count(decision, time.monotonic() - started)
            if again is None:
                return
            claim = again
        self.queue.add_after(uid, self.config.error_backoff_s)

    def _count(self, decision: Decision, seconds: float) -> None:
        match decision:
            case Allocate():
                self.metrics.allocated(seconds)
                self._cluster_changed = True
            case Wait(event=True, cause=cause):
                self.metrics.failed(cause or "unfit")
            case Refuse(cause=cause):
                self.metrics.failed(cause)
            case Deallocate() | RecordRejected():
                self._cluster_changed = True

    async def apply(  # noqa: PLR0911
        self, claim: JsonObj, decision: Decision, slot: ClaimSlot | None = None
    ) -> JsonObj | None:
        """Carry out ``decision``; returns the claim when it needs another decision.
        ``slot``: the claim's place in its batch (its allocation waits its turn)."""
        uid = uid_of(claim)
        match decision:
            case Ignore():
                return None
            case Wait(reason=reason, event=event):
                if event:
                    self.events.post(claim, "CannotAllocate", reason, "Warning")
                    self.queue.add_after(uid, self.config.retry_unfit_s)
                return None
            case Refuse(reason=reason):
                self.events.post(claim, "AllocationRefused", reason, "Warning")
                return None
            case Allocate(allocation=allocation, node=node, reserve_for=reserve_for):
                claim = await self.claim_writes.allocate(
                    claim, allocation, slot, reserve_for=reserve_for
                )
                self.ledger.written(uid)
                self.written[uid] = node or ""
                if slot is not None:
                    slot.written()
                if self.config.allocation_events:
                    self.events.post(claim, "Allocated", describe_allocation(allocation))
                return None
            case RecordRejected(node=node):
                claim = await self.claim_writes.patch_metadata(
                    claim, rejected_patch(claim, node), "the rejected-nodes annotation"
                )
                self.written.pop(uid, None)
                self.events.post(
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
                    self.ledger.claim_seen(claim)  # freed: the state is built anew
                    self.written.pop(uid, None)
                    self.events.post(
                        claim, "Deallocated", "allocated but never reserved and no pod uses it"
                    )
                unprotect = finalizer_removal_patch(claim)
                if unprotect is not None:
                    await self.claim_writes.patch(claim, unprotect)
                self._enqueue_ours(pending_only=True)
                return None
        return None
