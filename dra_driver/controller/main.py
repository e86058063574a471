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

Batching window (``batch_window_s``): the worker takes claims from the queue in
batches, every claim queued by the time the oldest has waited the window, and
works a batch largest claim first (:func:`~.reconcile.placement_order`), so a
burst is packed as best fit packs a sorted list rather than in arrival order. A
claim waits at most the window plus the decisions ahead of it (not their writes);
retries and backoff stay per claim (the queue's). 0 turns it off: one claim at a
time in arrival order, its writes done before the next is decided.

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
import functools
import logging
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocator import SelectorCache
from dra_driver.base.errors import ApiConflictError, ApiError, ApiNotFoundError
from dra_driver.controller.claim_index import ClaimPodIndex
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
    resource_version_of,
    uid_of,
)
from dra_driver.controller.leader import LeaderElector
from dra_driver.controller.ledger_cache import LedgerCache, Sources
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.reconcile import (
    FINALIZER,
    Allocate,
    ClusterView,
    Deallocate,
    Decision,
    Ignore,
    RecordRejected,
    Refuse,
    Wait,
    allocation_patch,
    deallocation_patch,
    decide,
    describe_allocation,
    finalizer_patch,
    finalizer_removal_patch,
    is_ours,
    placement_key,
    pod_uses,
    rejected_patch,
    size_rank,
)
from dra_driver.k8s.events import now_rfc3339
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.watch import MERGE_PATCH, send_json

log = logging.getLogger(__name__)

MAX_CONFLICT_RETRIES = 5


@dataclass(frozen=True)
class ControllerConfig:
    driver_name: str
    kubeconfig: str | None = None
    host: str | None = None
    """Plain-HTTP API URL without credentials (tests)."""
    lease_name: str = "fractional-gpu-dra-controller"
    lease_namespace: str = "default"
    identity: str = field(default_factory=socket.gethostname)
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    """How long a leader keeps trying to renew before it gives up and exits."""
    renew_interval_s: float = 5.0
    retry_interval_s: float = 2.0
    read_timeout_s: float = 30.0
    """Idle watch streams are reopened (from the last version) after this long."""
    resync_s: float = 60.0
    retry_unfit_s: float = 30.0
    """A claim that fits nowhere is tried again after this long (and on any change)."""
    error_backoff_s: float = 2.0
    event_interval_s: float = 60.0
    """An equal Event (same claim, reason and message) is written again, as a count on
    the one before, at most this often."""
    batch_window_s: float = 0.2
    """Claims queued within this long of the oldest are worked together, largest
    first; 0: one at a time in arrival order."""
    write_concurrency: int = 32
    """Claims whose writes may be in flight at once (with a batching window; without
    one, a claim's writes end before the next claim is decided)."""
    metrics_port: int = 0
    """Serve Prometheus metrics on this port (:func:`dra_driver.app.controller.run_controller`);
    0: not served."""
    metrics_address: str = "0.0.0.0"
    metrics_refresh_s: float = 5.0
    """How often the free-memory and pending-claims gauges are recomputed (when
    anything changed)."""


def _claim_path(claim: JsonObj, status: bool = False) -> str:
    meta = claim.get("metadata") or {}
    path = (
        f"/apis/resource.k8s.io/v1/namespaces/{meta.get('namespace', 'default')}"
        f"/resourceclaims/{meta.get('name', '')}"
    )
    return path + "/status" if status else path


InformerFactory = Callable[[KindPath, ChangeHandler], Informer]
"""(kind, change handler) → the informer of that kind, telling that handler."""

Work = Callable[[], Coroutine[Any, Any, object]]
"""A background task's body, run for the controller's lifetime."""


class Controller:
    """The controller's caches, queue and worker, given their collaborators: the API
    client its writes go through, an informer per kind (made by ``informer``, each
    telling one of this controller's change handlers), the work queue, the Event
    recorder, the leader elector, the metrics and the write threads (built by
    :func:`dra_driver.app.controller.build_controller`)."""

    def __init__(
        self,
        config: ControllerConfig,
        api_client: Any,
        *,
        informer: InformerFactory,
        queue: WorkQueue,
        events: ClaimEventRecorder,
        elector: LeaderElector,
        metrics: ControllerMetrics,
        writer: ThreadPoolExecutor,
        share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.config = config
        self._api = api_client
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
        self.assumed: dict[str, JsonObj] = {}
        """Claim UID -> the claim as we last wrote it, until the watch catches up."""
        self.written: dict[str, str] = {}
        """Claim UID -> node of an allocation we wrote and did not take back."""
        self.events = events
        self.elector = elector
        self._selectors = SelectorCache()
        self.ledger = LedgerCache(
            config.driver_name,
            Sources(
                slices=self.slices.values,
                classes=self.classes.values,
                allocated_claims=self.all_claims,
            ),
            self._selectors,
        )
        self.index = ClaimPodIndex()
        self._nodes_index: dict[str, JsonObj] | None = None
        self._namespaces_index: dict[str, JsonObj] | None = None
        """Nodes and Namespaces by name, built when first asked after a change."""
        self._writer = writer
        """The threads the claims' writes block in (shut down by :meth:`close`)."""
        self._turns: dict[str, _Turn] = {}
        """Claim UID -> its wave in its batch (largest first), while it is worked."""
        self._release_slot: dict[str, Callable[[], None]] = {}
        """Claim UID -> what gives its write slot back, while it holds one."""
        self.writes = 0
        self.metrics = metrics
        self._cluster_changed = True
        """Something the metrics' gauges show changed since they were last computed."""

    # --- cache views ---------------------------------------------------------------

    def current_claim(self, uid: str) -> JsonObj | None:
        seen = self.claims.get(uid)
        mine = self.assumed.get(uid)
        if mine is not None and (
            seen is None or resource_version_of(mine) > resource_version_of(seen)
        ):
            return mine
        return seen

    def all_claims(self) -> list[JsonObj]:
        uids = set(self.claims.objects) | set(self.assumed)
        return [c for c in (self.current_claim(u) for u in uids) if c is not None]

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
            self.index.reset_claims(self.claims.values())
            self.ledger.invalidate()  # a relist may have dropped or changed anything
            self._enqueue_ours()
            return
        uid = uid_of(new)
        mine = self.assumed.get(uid)
        if mine is not None and resource_version_of(new) >= resource_version_of(mine):
            del self.assumed[uid]
        if etype == "DELETED":
            self.assumed.pop(uid, None)
            self.written.pop(uid, None)
            self.index.claim_gone(uid)
            self.ledger.claim_gone(uid)
        else:
            self.index.claim_changed(new)
            current = self.current_claim(uid)
            if current is not None:
                self.ledger.claim_seen(current)
        if is_ours(new):
            self.queue.add(uid)
        freed = etype == "DELETED" or not (new.get("status") or {}).get("allocation")
        if freed and (old.get("status") or {}).get("allocation"):
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
        for claim in self.all_claims():
            if not is_ours(claim):
                continue
            if pending_only and (claim.get("status") or {}).get("allocation"):
                continue
            if (
                namespace is not None
                and (claim.get("metadata") or {}).get("namespace") != namespace
            ):
                continue
            self.queue.add(uid_of(claim))

    # --- running -------------------------------------------------------------------

    def background(self) -> dict[str, Work]:
        """The tasks that must run as long as the controller, by name: an informer per
        kind, the leader election, the leader's worker, the resync and the metrics.
        Cancelling them ends every loop and releases the Lease."""
        work: dict[str, Work] = {f"informer-{i.kind.name}": i.run for i in self.informers}
        work["leader-election"] = self.elector.run
        work["worker"] = self._lead
        work["resync"] = self._resync
        work["metrics"] = self._refresh_metrics
        return work

    def close(self) -> None:
        """After the background tasks: wake whoever waits on the queue; the write
        threads end with the writes they have (each bounded by the client's timeout)."""
        self.queue.close()
        self._writer.shutdown(wait=False)

    async def synced(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self.informers))

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_s)
            self._enqueue_ours()

    async def _refresh_metrics(self) -> None:
        await self.synced()
        while True:
            if self._cluster_changed:
                self._cluster_changed = False
                try:
                    self.refresh_cluster_metrics()
                except Exception:  # metrics are advice: never a reason to stop allocating
                    log.exception("could not refresh the controller's cluster metrics")
            await asyncio.sleep(self.config.metrics_refresh_s)

    def refresh_cluster_metrics(self) -> None:
        """Recompute the free memory per device and the pending claims from the caches."""
        claims = self.all_claims()
        state = self.ledger.state()  # decisions in flight count as taken
        pending = sum(
            1
            for c in claims
            if is_ours(c)
            and not (c.get("status") or {}).get("allocation")
            and not (c.get("metadata") or {}).get("deletionTimestamp")
        )
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
        """Take batches, start each claim in placement order (its decision is taken at
        its start, before any other claim's), up to :meth:`_concurrency` claims at once.
        A claim that fails with anything but an API error stops the worker with that
        error, as it did when claims were worked one at a time."""
        slots = asyncio.Semaphore(self._concurrency())
        claims: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []
        failed = asyncio.Event()

        def finished(task: asyncio.Task[None]) -> None:
            claims.discard(task)
            if not task.cancelled() and (err := task.exception()) is not None:
                failures.append(err)
                failed.set()

        async def dispatch() -> None:
            while True:
                batch = await self.queue.get_batch(self.config.batch_window_s)
                driver = self.config.driver_name
                keyed = sorted(  # stable: claims that allocate nothing keep queue order
                    ((placement_key(uid, self.current_claim(uid), driver), uid) for uid in batch),
                    key=lambda item: item[0],
                )
                order = deque((uid, size_rank(key)) for key, uid in keyed)
                waves = _waves([rank for _, rank in order])
                if len(order) > 1:
                    log.debug("working a batch of %d claims, largest first", len(order))
                try:
                    while order:
                        await slots.acquire()
                        uid, rank = order.popleft()
                        turn = _Turn(waves[rank])
                        task = asyncio.create_task(self._claim_task(uid, slots, turn))
                        claims.add(task)
                        task.add_done_callback(finished)
                finally:
                    # Cancelled (leadership lost, stopping): release the rest unworked;
                    # a new leader enqueues every claim of ours again.
                    for uid, _ in order:
                        self.queue.done(uid)

        dispatcher = asyncio.create_task(dispatch())
        stopped = asyncio.create_task(failed.wait())
        try:
            await asyncio.wait({dispatcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if failures:
                raise failures[0]
            dispatcher.result()  # it only ends by failing
        finally:
            pending = [dispatcher, stopped, *claims]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _claim_task(self, uid: str, slots: asyncio.Semaphore, turn: _Turn) -> None:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                slots.release()

        self._release_slot[uid] = release
        self._turns[uid] = turn
        try:
            if self.elector.is_leader:
                await self.process(uid)
        except ApiError as err:
            log.warning("claim %s: %s; retrying in %.1fs", uid, err, self.config.error_backoff_s)
            self.queue.add_after(uid, self.config.error_backoff_s)
        finally:
            self._release_slot.pop(uid, None)
            self._turns.pop(uid, None)
            turn.leave()  # whatever happened, the smaller claims after it may go on
            release()
            self.queue.done(uid)

    def _pass_turn(self, uid: str) -> None:
        turn = self._turns.get(uid)
        if turn is not None:
            turn.leave()

    def _claim_written(self, uid: str) -> None:
        """The claim's own writes are done: the next claim may start while its Event is
        written (the write threads bound those)."""
        release = self._release_slot.pop(uid, None)
        if release is not None:
            release()

    # --- one claim -----------------------------------------------------------------

    async def process(self, uid: str) -> None:
        """Decide and apply until the claim needs nothing more; re-read on conflicts."""
        started = time.monotonic()
        claim = self.current_claim(uid)
        for _ in range(MAX_CONFLICT_RETRIES):
            if claim is None:
                return
            decision = decide(claim, self.pods_of(claim), self._nodes_by_name(), self.view())
            if not isinstance(decision, Allocate | RecordRejected):
                self._pass_turn(uid)  # no allocation to send: the next claim's may go
            if isinstance(decision, Allocate):
                # Taken now, before the first write is sent: the next claim is decided
                # while these writes are in flight and must see it.
                namespace = str((claim.get("metadata") or {}).get("namespace", ""))
                self.ledger.decided(uid, namespace, decision.allocation)
            try:
                again = await self.apply(claim, decision)
            except ApiConflictError as err:
                self.ledger.failed(uid)
                log.info("claim %s: %s; re-reading", uid, err)
                claim = await self._get(claim)
                continue
            except BaseException:
                self.ledger.failed(uid)
                raise
            self._count(decision, time.monotonic() - started)
            if again is None:
                return
            claim = again
        self.queue.add_after(uid, self.config.error_backoff_s)

    async def _call(self, call: Callable[[], JsonObj]) -> JsonObj:
        """``call`` in one of the write threads."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    async def _get(self, claim: JsonObj) -> JsonObj | None:
        try:
            fresh = await self._call(
                functools.partial(send_json, self._api, "GET", _claim_path(claim))
            )
        except ApiNotFoundError:
            return None
        self._assume(fresh)
        return fresh

    async def _patch(
        self,
        claim: JsonObj,
        patch: JsonObj,
        *,
        status: bool = False,
    ) -> JsonObj:
        """A JSON merge patch of the claim (or its ``/status``); the answer is assumed."""
        written = await self._call(
            functools.partial(
                send_json,
                self._api,
                "PATCH",
                _claim_path(claim, status),
                patch,
                content_type=MERGE_PATCH,
            )
        )
        self.writes += 1
        self._assume(written)
        return written

    async def _patch_metadata(self, claim: JsonObj, patch: JsonObj, what: str) -> JsonObj:
        """A metadata patch that the claim may refuse for good; then it goes on without.

        A claim created with opaque parameters in a form the API server does not
        write back itself (spaces, as the Python client's ``json.dumps`` sends them)
        refuses every JSON write to the main resource: the server compacts the
        stored bytes and sees the spec change (422 ``field is immutable``). Its
        ``/status`` can still be written, so the claim is still allocated, without
        the finalizer (this controller deallocates it when its pods are gone) and
        with a Warning Event that says how to recreate it.
        """
        try:
            return await self._patch(claim, patch)
        except ApiError as err:
            if err.status != 422:
                raise
            await self.events.record(
                claim,
                "MetadataWriteRefused",
                f"could not write {what}: {err}. The API server refuses any JSON write of "
                "this claim's metadata when its opaque parameters were sent in another form "
                "than the server's own (e.g. with spaces, as the Python client's json.dumps "
                "writes them); the claim is allocated without it. Recreate the claim with "
                "kubectl (compact JSON) to make it writable",
                "Warning",
            )
            return claim

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

    def _assume(self, claim: JsonObj) -> None:
        uid = uid_of(claim)
        seen = self.claims.get(uid)
        if seen is None or resource_version_of(claim) > resource_version_of(seen):
            self.assumed[uid] = claim

    async def apply(self, claim: JsonObj, decision: Decision) -> JsonObj | None:  # noqa: PLR0911
        """Carry out ``decision``; returns the claim when it needs another decision."""
        uid = uid_of(claim)
        match decision:
            case Ignore():
                return None
            case Wait(reason=reason, event=event):
                if event:
                    await self.events.record(claim, "CannotAllocate", reason, "Warning")
                    self.queue.add_after(uid, self.config.retry_unfit_s)
                return None
            case Refuse(reason=reason):
                await self.events.record(claim, "AllocationRefused", reason, "Warning")
                return None
            case Allocate(allocation=allocation, node=node):
                protect = finalizer_patch(claim)
                if protect is not None:
                    claim = await self._patch_metadata(claim, protect, "the finalizer " + FINALIZER)
                turn = self._turns.get(uid)
                if turn is not None:
                    await turn.wait()
                body = allocation_patch(claim, allocation, now_rfc3339(), keep_shares=True)
                claim = await self._patch(claim, body, status=True)
                if turn is not None:
                    turn.leave()
                self.ledger.written(uid)
                self.written[uid] = node or ""
                self._claim_written(uid)
                await self.events.record(claim, "Allocated", describe_allocation(allocation))
                return None
            case RecordRejected(node=node):
                claim = await self._patch_metadata(
                    claim, rejected_patch(claim, node), "the rejected-nodes annotation"
                )
                self.written.pop(uid, None)
                await self.events.record(
                    claim,
                    "NodeRejected",
                    f"the scheduler cleared the allocation on node {node}; allocating elsewhere",
                    "Warning",
                )
                return claim
            case Deallocate(clear_status=clear_status):
                if clear_status:
                    claim = await self._patch(claim, deallocation_patch(claim), status=True)
                    self.ledger.claim_seen(claim)  # freed: the state is built anew
                    self.written.pop(uid, None)
                    await self.events.record(
                        claim, "Deallocated", "allocated but never reserved and no pod uses it"
                    )
                unprotect = finalizer_removal_patch(claim)
                if unprotect is not None:
                    await self._patch(claim, unprotect)
                self._enqueue_ours(pending_only=True)
                return None
        return None


class _Wave:
    """The claims of one size in a batch. Their allocations are written side by side,
    once every larger claim of the batch has had its allocation answered (or decided it
    has none): a burst is allocated largest first, as it was decided, in what the API
    server sees as well, while claims of a size never wait on one another."""

    def __init__(self, before: _Wave | None, members: int) -> None:
        self.before = before
        self.left = members
        self.done = asyncio.Event()

    def leave(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.done.set()


def _waves(ranks: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], _Wave]:
    """One wave per size in a batch (``ranks`` sorted, largest first), each after the
    one before."""
    waves: dict[tuple[Any, ...], _Wave] = {}
    before: _Wave | None = None
    for rank in ranks:
        wave = waves.get(rank)
        if wave is None:
            wave = waves[rank] = _Wave(before, 0)
            before = wave
        wave.left += 1
    return waves


class _Turn:
    """One claim's membership of its wave: it leaves once, when its allocation is
    answered or it knows it writes none."""

    def __init__(self, wave: _Wave) -> None:
        self.wave = wave
        self._left = False

    async def wait(self) -> None:
        """Until every larger claim of the batch is done."""
        if self.wave.before is not None:
            await self.wave.before.done.wait()

    def leave(self) -> None:
        if not self._left:
            self._left = True
            self.wave.leave()
