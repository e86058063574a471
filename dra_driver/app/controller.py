"""The allocation controller's composition root: its object graph and its tasks.

:func:`build_controller` builds the graph by constructor injection: the caches (an
informer per kind, each telling the change router), the change router (events ->
caches and queue), the claim processor (decide, write) with the claim writer, the
work queue, the Event recorder, the leader elector and the metrics, handed to the
:class:`~dra_driver.controller.Controller` that runs them;
:func:`serve` runs its background tasks in one :class:`asyncio.TaskGroup`
(:func:`~dra_driver.app.tasks.supervise`): they must live as long as the
controller, so one that fails or returns stops them all and the controller with
them (:class:`~dra_driver.app.tasks.BackgroundTaskFailed`: ``dra-driver
controller`` exits 2, to be restarted), rather than leaving a replica that holds
the Lease with, say, a dead informer or worker.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import uuid
from collections.abc import Callable
from typing import Any

from dra_driver.app.heap import settle_heap
from dra_driver.app.tasks import BackgroundTaskFailed, first_of, supervise
from dra_driver.controller import Controller, ControllerConfig
from dra_driver.controller.caches import ControllerCaches, Informers
from dra_driver.controller.claim_writes import ClaimWriter
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.controller.informer import (
    CLAIMS,
    CLASSES,
    NAMESPACES,
    NODES,
    PODS,
    SLICES,
    Informer,
    KindPath,
)
from dra_driver.controller.leader import LeaderElector, LoopLeaseApi
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.processing import ClaimProcessor
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.routing import ChangeRouter
from dra_driver.k8s.client import make_api_client
from dra_driver.k8s.event_queue import WriteLane
from dra_driver.k8s.transport import api_transport
from dra_driver.observability.metrics_server import serve_metrics

__all__ = ["BackgroundTaskFailed", "build_controller", "run", "run_controller", "serve"]

log = logging.getLogger(__name__)

EVENTS_FLUSH_S = 5.0
"""How long a stopping controller waits for its queued Events."""


def build_controller(
    api_client: Any,
    config: ControllerConfig,
    *,
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
) -> Controller:
    """The controller and its collaborators, against ``api_client``."""

    # Every request on the loop (no thread hand-off, a third of the CPU per write); a
    # configuration the loop transport does not speak is refused here, by name
    # (ConfigError: ``dra-driver controller`` exits 2 before it serves).
    http = api_transport(api_client)

    def informer(kind: KindPath) -> Informer:
        return Informer(http, kind, read_timeout_s=config.read_timeout_s)

    queue = WorkQueue()
    informers = Informers(
        claims=informer(CLAIMS),
        pods=informer(PODS),
        slices=informer(SLICES),
        classes=informer(CLASSES),
        nodes=informer(NODES),
        namespaces=informer(NAMESPACES),
    )
    metrics = ControllerMetrics()
    caches = ControllerCaches(config.driver_name, informers, on_refused=metrics.move_refused)
    router = ChangeRouter(caches, queue)
    router.listen(informers)

    # The Events: one sender behind the claim writes (the lane).
    lane = WriteLane()
    events = ClaimEventRecorder(
        http,
        interval_s=config.event_interval_s,
        queued=True,
        lane=lane,
        on_drop=metrics.event_dropped,
    )
    writes = ClaimWriter(http, caches.inflight, events, lane=lane, missed=queue.add)
    processor = ClaimProcessor(
        config,
        caches,
        writes,
        events=events,
        queue=queue,
        metrics=metrics,
        freed=lambda: router.enqueue_ours(pending_only=True),
        share_id=share_id,
    )
    return Controller(
        config,
        caches,
        router,
        processor,
        queue=queue,
        events=events,
        elector=LeaderElector(
            LoopLeaseApi(http, config.lease_namespace, config.lease_name),
            name=config.lease_name,
            namespace=config.lease_namespace,
            identity=config.identity,
            lease_duration_s=config.lease_duration_s,
            renew_deadline_s=config.renew_deadline_s,
            renew_interval_s=config.renew_interval_s,
            retry_interval_s=config.retry_interval_s,
        ),
        metrics=metrics,
        http=http,
    )


async def serve(controller: Controller, stop: asyncio.Event) -> None:
    """Run ``controller`` until ``stop`` is set; then release the Lease and end every loop.

    Raises :class:`BackgroundTaskFailed` (after stopping the others) when one of its
    background tasks failed or ended.
    """
    failures: list[BackgroundTaskFailed] = []
    failed = asyncio.Event()

    def record(failure: BackgroundTaskFailed) -> None:
        failures.append(failure)
        failed.set()

    background = asyncio.create_task(
        supervise(controller.background(), component="controller", on_failure=record),
        name="controller-tasks",
    )
    try:
        await first_of(stop.wait(), failed.wait())
        if not failures:
            log.info("controller %s stopping", controller.config.identity)
            # The Events queued behind the last writes (the sender still runs).
            await controller.events.flush(EVENTS_FLUSH_S)
    finally:
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        await controller.close()
    if failures:
        raise failures[0]


YOUNG_GC_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (CPython's default:
700). Every claim write and watch event decodes a claim's JSON (a few hundred
containers, most garbage at once): at 700 the collector ran several times a claim and
promoted the rest into older generations that it then walked again (gen 0 and 1: 0.28
and 0.72 s of a 1,200-claim burst at 50 nodes, one run, ``hack/bench/controller.py``;
0.29 and 0.05 s at 10,000). JSON holds no reference cycles: what waits longer for a
collection is at most this many objects."""


async def run_controller(
    config: ControllerConfig,
    stop: asyncio.Event | None = None,
    api_client: Any = None,
    *,
    settle: bool = False,
) -> None:
    """Run the controller until ``stop`` is set (or, without one, SIGTERM/SIGINT).

    ``settle`` (the process, not tests): once the informers are synced, freeze the heap
    (:func:`~dra_driver.app.heap.settle_heap`: the caches' objects as listed are never
    walked by a collection again), and collect the youngest generation less often
    (:data:`YOUNG_GC_THRESHOLD`)."""
    if api_client is None:
        api_client = make_api_client(config.kubeconfig, config.host)
    api = api_client
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "controller %s for driver %s (lease %s/%s)",
        config.identity,
        config.driver_name,
        config.lease_namespace,
        config.lease_name,
    )
    controller = build_controller(api, config)
    server = None
    if config.metrics_port > 0:
        server = serve_metrics(
            config.metrics_port, controller.metrics.registry, config.metrics_address
        )
    settled = asyncio.create_task(_settle_when_synced(controller)) if settle else None
    try:
        await serve(controller, stop)
    finally:
        if settled is not None:
            settled.cancel()
            await asyncio.gather(settled, return_exceptions=True)
        if server is not None:
            await asyncio.to_thread(server.stop)


async def _settle_when_synced(controller: Controller) -> None:
    await controller.synced()
    _, *older = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *older)
    settle_heap()


def run(config: ControllerConfig) -> None:
    """Serve until SIGTERM or SIGINT (raises :class:`BackgroundTaskFailed` when a
    background task dies: ``dra-driver controller`` exits 2)."""
    asyncio.run(run_controller(config, settle=True))
