"""Prometheus metrics of the kubelet plugin.

Three kinds, each from the source that is right for it:

* What happened: prepares and unprepares by outcome, errors by reason, and
  their latency. :class:`PluginMetrics` is a
  :class:`~dra_driver.core.prepare.DriverObserver`; the engine tells it
  every claim's outcome.
* What is held now: prepared claims, and MPS shares and the memory they
  reserve per GPU. These are computed at scrape time from the engine's
  checkpoint, the record the engine itself trusts, so they cannot drift from
  it and a restarted plugin reports them at once. Scrapes run on the metrics
  server's thread; the checkpoint file is replaced atomically, so reading it
  there needs no lock.
* Device health, as last given to :meth:`PluginMetrics.set_device_health` (the
  health monitor calls it with every device on each change).
* Pods guarded against disruption by node autoscalers, as last counted by the
  disruption guard (:meth:`PluginMetrics.set_guarded_pods`).

Metric names and labels are listed in :data:`METRICS`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from dra_driver.base.errors import DriverError
from dra_driver.core.model import Inventory
from dra_driver.core.prepare import ClaimOperation, MpsInMig, MpsShare
from dra_driver.observability.claim_log import outcome
from dra_driver.observability.metrics_server import PREFIX, new_registry
from dra_driver.state.checkpoint import Checkpoint, ClaimState

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Seconds: a repeated prepare answers in about a millisecond, an MPS daemon start
or a MIG instance takes seconds, and the kubelet gives up at 45 s."""

HEALTH_STATUSES = ("Healthy", "Unhealthy", "Unknown")

# The (operation, outcome) series that exist from the start, at 0.
_SERIES = (
    ("prepare", "ok"),
    ("prepare", "repeated"),
    ("prepare", "error"),
    ("unprepare", "ok"),
    ("unprepare", "error"),
)

METRICS = {
    PREFIX + "claim_operations_total": "counter{operation, outcome=ok|repeated|error}",
    PREFIX + "claim_operation_errors_total": "counter{operation, reason}",
    PREFIX + "claim_operation_duration_seconds": "histogram{operation}",
    PREFIX + "prepared_claims": "gauge{state=PrepareStarted|PrepareCompleted}",
    PREFIX + "mps_shares": "gauge{gpu_uuid, device}",
    PREFIX + "mps_reserved_memory_bytes": "gauge{gpu_uuid, device}",
    PREFIX + "device_health": "gauge{device, gpu_uuid, status=Healthy|Unhealthy|Unknown}",
    PREFIX + "device_health_reason_info": "gauge{device, gpu_uuid, reason}",
    PREFIX + "disruption_guarded_pods": "gauge",
}


class CheckpointReader(Protocol):
    def load(self) -> Checkpoint: ...


class HealthReading(Protocol):
    """One device's health as the health model reports it."""

    @property
    def device_name(self) -> str: ...

    @property
    def gpu_uuid(self) -> str: ...

    @property
    def status(self) -> str:
        """One of :data:`HEALTH_STATUSES`."""
        ...

    @property
    def reason(self) -> str | None:
        """Why it is not healthy (e.g. an XID), empty or None when it is."""
        ...


@dataclass(frozen=True)
class _Health:
    device: str
    gpu_uuid: str
    status: str
    reason: str


def held_metrics(checkpoint: Checkpoint, inventory: Inventory | None) -> list[Metric]:
    """The claim and share gauges for ``checkpoint`` (pure).

    Every GPU of ``inventory`` that can hold MPS shares has its series, at 0
    when nothing is prepared there, so a dashboard sees the drop to 0 instead
    of a series that vanishes.
    """
    claims = GaugeMetricFamily(
        PREFIX + "prepared_claims",
        "Claims recorded in the plugin's checkpoint, by state (PrepareStarted: a prepare "
        "in progress, or one that died half-way and is rolled back at the next start).",
        labels=["state"],
    )
    states = collections.Counter(claim.state for claim in checkpoint.claims.values())
    for state in ClaimState:
        claims.add_metric([state.value], states[state])
    per_gpu: dict[tuple[str, str], list[int]] = {}
    for gpu in inventory.gpus if inventory is not None else ():
        if not gpu.mig_enabled:
            per_gpu[(gpu.uuid, gpu.device_name)] = [0, 0]
    for claim in checkpoint.claims.values():
        for device in claim.devices:
            if isinstance(device, MpsShare | MpsInMig):
                held = per_gpu.setdefault((device.gpu_uuid, device.device_name), [0, 0])
                held[0] += 1
                held[1] += device.limits.memory_bytes
    shares = GaugeMetricFamily(
        PREFIX + "mps_shares",
        "MPS shares of prepared claims on this GPU (as recorded in the checkpoint).",
        labels=["gpu_uuid", "device"],
    )
    memory = GaugeMetricFamily(
        PREFIX + "mps_reserved_memory_bytes",
        "Device memory reserved on this GPU by the MPS shares of prepared claims "
        "(the sum of their memory limits).",
        labels=["gpu_uuid", "device"],
        unit="bytes",
    )
    for (gpu_uuid, device_name), (count, memory_bytes) in sorted(per_gpu.items()):
        shares.add_metric([gpu_uuid, device_name], count)
        memory.add_metric([gpu_uuid, device_name], memory_bytes)
    return [claims, shares, memory]


def health_metrics(devices: Iterable[_Health]) -> list[Metric]:
    health = GaugeMetricFamily(
        PREFIX + "device_health",
        "1 for the device's current health status (Healthy, Unhealthy, Unknown), 0 for the others.",
        labels=["device", "gpu_uuid", "status"],
    )
    reasons = InfoMetricFamily(
        PREFIX + "device_health_reason",
        "Why a device is not healthy, for devices that have a reason.",
        labels=["device", "gpu_uuid"],
    )
    for d in devices:
        for status in HEALTH_STATUSES:
            health.add_metric([d.device, d.gpu_uuid, status], 1 if status == d.status else 0)
        if d.reason:
            reasons.add_metric([d.device, d.gpu_uuid], {"reason": d.reason})
    return [health, reasons]


class _StateCollector(Collector):
    """Gauges computed at scrape time (on the metrics server's thread)."""

    def __init__(
        self, checkpoints: CheckpointReader | None, inventory: Callable[[], Inventory] | None
    ) -> None:
        self.checkpoints = checkpoints
        self.inventory = inventory
        self.health: tuple[_Health, ...] | None = None
        """None until the health model first reports; replaced whole, never mutated."""

    def describe(self) -> Iterable[Metric]:
        return [*held_metrics(Checkpoint(boot_id=""), None), *health_metrics(())]

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        health = self.health
        if health is not None:
            yield from health_metrics(health)
        if self.checkpoints is None:
            return
        try:
            checkpoint = self.checkpoints.load()
        except DriverError as err:
            # The prepares fail for the same reason and count it by reason.
            log.warning("metrics: claim gauges left out of this scrape: %s", err)
            return
        yield from held_metrics(checkpoint, self.inventory() if self.inventory else None)


class PluginMetrics:
    """The kubelet plugin's metrics, in a registry of their own (:attr:`registry`).

    Hand it to the engine as an observer, to the health monitor as a listener of
    every device (:meth:`set_device_health`) and to the disruption guard
    (:meth:`set_guarded_pods`); serve :attr:`registry` with
    :func:`~dra_driver.observability.metrics_server.serve_metrics`.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        checkpoints: CheckpointReader | None = None,
        inventory: Callable[[], Inventory] | None = None,
    ) -> None:
        """``checkpoints``: the engine's checkpoint, read at each scrape for the claim
        and share gauges (None: those are not reported); ``inventory``: the node's
        GPUs now (each MPS-capable GPU's share series, at 0 when it holds none)."""
        self.registry = registry if registry is not None else new_registry("kubelet-plugin")
        self._operations = Counter(
            PREFIX + "claim_operations",
            "Claims prepared or unprepared for the kubelet, by outcome (repeated: the claim "
            "was already prepared and its recorded result was returned).",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self._errors = Counter(
            PREFIX + "claim_operation_errors",
            "Claims whose prepare or unprepare failed, by reason (ClaimNotFound, Overcommit, "
            "InvalidConfig, MpsAgentError, ...).",
            ["operation", "reason"],
            registry=self.registry,
        )
        self._seconds = Histogram(
            PREFIX + "claim_operation_duration_seconds",
            "Time from the kubelet's call reaching the engine to the claim's answer.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        for operation, result in _SERIES:
            self._operations.labels(operation, result)
            self._seconds.labels(operation)
        self._guarded_pods = Gauge(
            PREFIX + "disruption_guarded_pods",
            "Pods on this node that carry karpenter.sh/do-not-disrupt and "
            "cluster-autoscaler.kubernetes.io/safe-to-evict=false because a prepared claim "
            "of theirs asked for the disruption guard (as last counted by the plugin).",
            registry=self.registry,
        )
        self._state = _StateCollector(checkpoints, inventory)
        self.registry.register(self._state)

    def claim_done(self, op: ClaimOperation) -> None:
        self._operations.labels(op.operation, outcome(op)).inc()
        self._seconds.labels(op.operation).observe(op.seconds)
        if not op.ok:
            self._errors.labels(op.operation, op.reason or "InternalError").inc()

    def set_guarded_pods(self, count: int) -> None:
        """The disruption guard's count of the pods it guards now."""
        self._guarded_pods.set(count)

    def set_device_health(self, devices: Iterable[HealthReading]) -> None:
        """Report every device's health; devices left out are no longer reported."""
        snapshot = []
        for device in devices:
            status = str(device.status)
            if status not in HEALTH_STATUSES:
                raise ValueError(
                    f"device {device.device_name}: health status {status!r} is not one of "
                    f"{', '.join(HEALTH_STATUSES)}"
                )
            snapshot.append(
                _Health(device.device_name, device.gpu_uuid, status, device.reason or "")
            )
        self._state.health = tuple(sorted(snapshot, key=lambda h: (h.device, h.gpu_uuid)))
