"""The controller's Prometheus metrics, in their own registry.

Served at ``--metrics-port`` (``/metrics``) by
:func:`dra_driver.observability.metrics_server.serve_metrics`; every replica
serves them (followers count nothing but keep the cluster gauges current)::

    fractional_gpu_dra_controller_allocations_total
        allocations written (status.allocation of a controller-path claim)
    fractional_gpu_dra_controller_allocation_failures_total{reason}
        allocation attempts that ended without one; reason: unfit, quota,
        invalid-quota, class-not-found, selector-error, refused. A claim that
        fits nowhere is tried again (on changes, and every retry interval), and
        each try counts
    fractional_gpu_dra_controller_allocation_duration_seconds
        histogram: from taking a claim off the queue to its allocation written
        (the allocator, the finalizer and status writes, conflict retries)
    fractional_gpu_dra_controller_events_dropped_total
        Events dropped because the queue of Events to send was full (the API
        server took them slower than they came; each drop is also logged)
    fractional_gpu_dra_controller_inflight_moves_refused_total{from, to}
        moves of a claim's in-flight record that its table refuses
        (:mod:`dra_driver.controller.inflight`; each also logged): 0 unless the
        controller's own bookkeeping is wrong
    fractional_gpu_dra_controller_gpu_free_memory_bytes{node, device}
        free memory of each controller-managed device, from the ledger of every
        allocated claim and the decisions in flight (0 while a device is held whole)
    fractional_gpu_dra_controller_claims_pending
        controller-path claims without an allocation (not being deleted)

The two gauges are a snapshot the controller refreshes on its event loop
(:meth:`ControllerMetrics.set_cluster`); a scrape, which runs on the metrics
server's thread, only reads the latest snapshot and never waits on the loop. The
snapshot is refreshed only once a scrape asked for one (:attr:`ControllerMetrics.wanted`):
it reads every device of the cluster and every claim (a tenth of the controller's CPU at
500 nodes when done every few seconds, ``hack/bench/controller.py``), so it is done per
scrape, not per change, and a scrape shows the cluster as of about one scrape before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dra_driver.allocator import DeviceMemory

NAMESPACE = "fractional_gpu_dra"
SUBSYSTEM = "controller"
PREFIX = f"{NAMESPACE}_{SUBSYSTEM}"
FAILURE_REASONS = (
    "unfit",
    "quota",
    "invalid-quota",
    "class-not-found",
    "selector-error",
    "refused",
)
"""Every ``reason`` label value, exported at 0 from the start."""
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class ClusterSnapshot:
    devices: tuple[DeviceMemory, ...] = ()
    pending: int = 0


class _ClusterCollector(Collector):
    """Yields the gauges of the latest snapshot (devices that left are not kept)."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._metrics.snapshot  # one read: the loop replaces it whole
        self._metrics.wanted = True  # the next one, for the next scrape
        free = GaugeMetricFamily(
            f"{PREFIX}_gpu_free_memory_bytes",
            "Free memory of each controller-managed device, from the controller's ledger",
            labels=["node", "device"],
        )
        for d in snapshot.devices:
            free.add_metric([d.node or "", d.device], d.free)
        yield free
        yield GaugeMetricFamily(
            f"{PREFIX}_claims_pending",
            "Controller-path claims without an allocation",
            value=snapshot.pending,
        )


class ControllerMetrics:
    """The controller's metrics; one instance (and registry) per controller."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        ns, sub, reg = NAMESPACE, SUBSYSTEM, self.registry
        self.allocations = Counter(
            "allocations",
            "Allocations the controller wrote",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.failures = Counter(
            "allocation_failures",
            "Allocation attempts that ended without one, by reason",
            ["reason"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        self.latency = Histogram(
            "allocation_duration_seconds",
            "From taking a claim off the queue to its allocation written",
            buckets=LATENCY_BUCKETS,
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.events_dropped = Counter(
            "events_dropped",
            "Events dropped because the queue of Events to send was full",
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.moves_refused = Counter(
            "inflight_moves_refused",
            "Moves of a claim's in-flight record that its table refuses, by from and to",
            ["from", "to"],
            namespace=ns,
            subsystem=sub,
            registry=reg,
        )
        self.snapshot = ClusterSnapshot()
        self.wanted = False
        """A scrape read the snapshot since it was last refreshed (set on the server's
        thread, cleared on the loop)."""
        self.registry.register(_ClusterCollector(self))

    def allocated(self, seconds: float) -> None:
        self.allocations.inc()
        self.latency.observe(seconds)

    def event_dropped(self) -> None:
        self.events_dropped.inc()

    def move_refused(self, from_phase: str, to_phase: str) -> None:
        self.moves_refused.labels(from_phase, to_phase).inc()

    def failed(self, reason: str) -> None:
        self.failures.labels(reason).inc()

    def set_cluster(self, devices: Iterable[DeviceMemory], pending: int) -> None:
        """Replace the gauges' snapshot (called on the event loop)."""
        self.snapshot = ClusterSnapshot(tuple(devices), pending)
