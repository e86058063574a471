"""The controller process: informers, the claims in flight, a work queue, a leader-only worker.

Two halves, built by :func:`dra_driver.app.controller.build_controller` around the
caches they share (:mod:`.caches`): the change router (:mod:`.routing`), which turns
the informers' events into the caches' updates and the queue's claims on every
replica, and the claim processor (:mod:`.processing`), which decides one claim and
writes the decision. This module runs them: the informers, the leader election, the
leader's worker taking claims from the queue to the processor, the resync, the
metrics.

Every replica keeps its caches warm; only the Lease holder processes the queue
and writes. One worker decides claim after claim, so every decision sees the
previous one: each claim's in-flight record (:mod:`.inflight`) holds a decision in
the allocator's state (:mod:`.ledger_cache`) before its writes are sent, and then
our writes' answers, laid over the informer's claims until the watch shows a
resourceVersion at least as new. The
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
lost is the in-memory record of allocations we wrote (:mod:`.inflight`'s written
nodes), which turns a scheduler's clearing into a rejected node; after a restart a cleared claim is
allocated again without excluding that node, and is recorded on the next clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from dra_driver.base.errors import ApiError
from dra_driver.controller.caches import ControllerCaches
from dra_driver.controller.config import ControllerConfig
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.controller.leader import LeaderElector
from dra_driver.controller.lenient import allocated, deleting
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.processing import ClaimProcessor
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.reconcile import is_ours, placement_key, size_rank
from dra_driver.controller.routing import ChangeRouter
from dra_driver.controller.worker import ClaimSlot, Rank, work_claims
from dra_driver.k8s.transport import ApiTransport

log = logging.getLogger(__name__)

_IN_ARRIVAL = ((0,), (0,))


def _arrival_order(uid: str) -> tuple[tuple[Any, ...], Rank]:
    """Without a window: every claim in one place, so the worker keeps queue order."""
    return _IN_ARRIVAL


Work = Callable[[], Coroutine[Any, Any, object]]
"""A background task's body, run for the controller's lifetime."""


class Controller:
    """The controller's tasks around its two halves, given their collaborators: the
    caches (their informers each telling ``router``), the claim processor, the work
    queue, the Event recorder, the leader elector, the metrics and the API transport."""

    def __init__(
        self,
        config: ControllerConfig,
        caches: ControllerCaches,
        router: ChangeRouter,
        processor: ClaimProcessor,
        *,
        queue: WorkQueue,
        events: ClaimEventRecorder,
        elector: LeaderElector,
        metrics: ControllerMetrics,
        http: ApiTransport,
    ) -> None:
        """``http``: every request of the controller's own (the claims' reads and
        patches; the informers, the Lease and the Events have it too): closed by
        :meth:`close`."""
        self.config = config
        self.caches = caches
        self.router = router
        self.processor = processor
        self.claims = caches.claims
        self.pods = caches.pods
        self.informers = caches.informers.all()
        self.queue = queue
        self.events = events
        self.elector = elector
        self.metrics = metrics
        self._http = http

    @property
    def writes(self) -> int:
        """Claim writes answered so far."""
        return self.processor.writes

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
            self.router.enqueue_ours()

    async def _refresh_metrics(self) -> None:
        await self.synced()
        while True:
            if self.caches.changed and self.metrics.wanted:
                self.caches.changed = self.metrics.wanted = False
                try:
                    self.refresh_cluster_metrics()
                except Exception:  # metrics are advice: never a reason to stop allocating
                    log.exception("could not refresh the controller's cluster metrics")
            await asyncio.sleep(self.config.metrics_refresh_s)

    def refresh_cluster_metrics(self) -> None:
        """Recompute the free memory per device and the pending claims from the caches."""
        claims = self.caches.all_claims()
        state = self.caches.ledger.state()  # decisions in flight count as taken
        pending = sum(1 for c in claims if is_ours(c) and not allocated(c) and not deleting(c))
        self.metrics.set_cluster(state.free_memory(), pending)

    async def _lead(self) -> None:
        await self.synced()
        while True:
            await self.elector.leading.wait()
            self.router.enqueue_ours()
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
        key = placement_key(
            uid, self.caches.current_claim(uid), self.config.driver_name, self.caches.sizes
        )
        return key, size_rank(key)

    async def _work_claim(self, uid: str, slot: ClaimSlot) -> None:
        try:
            if self.elector.is_leader:
                await self.processor.process(uid, slot)
        except ApiError as err:
            log.warning("claim %s: %s; retrying in %.1fs", uid, err, self.config.error_backoff_s)
            self.queue.add_after(uid, self.config.error_backoff_s)
