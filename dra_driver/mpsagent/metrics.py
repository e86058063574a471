"""Prometheus metrics of the mps-agent, read from the agent's own state at scrape time.

The agent's state belongs to its event loop, and a scrape runs on the metrics
server's thread: the scrape asks the loop for the agent's status and waits for
it (a few seconds at most) rather than reading dicts the loop may be changing.
A loop that does not answer in time leaves the agent's series out of that one
scrape; the process metrics still come.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from dra_driver.mpsagent.protocol import AgentStatus
from dra_driver.observability.metrics_server import PREFIX, new_registry

log = logging.getLogger(__name__)

METRICS = {
    PREFIX + "mps_agent_info": "gauge{protocol=v3|legacy}, always 1",
    PREFIX + "mps_daemon_running": "gauge{gpu_uuid}, 1 or 0",
    PREFIX + "mps_daemon_restarts_total": "counter{gpu_uuid}",
    PREFIX + "mps_agent_shares": "gauge{gpu_uuid}",
    PREFIX + "mps_waiting_uids": "gauge{gpu_uuid}, legacy MPS only",
    PREFIX + "mps_namespaces_deleting": "gauge{gpu_uuid}, MPS v3 only",
    PREFIX + "mps_namespace_delete_failures_total": "counter{gpu_uuid}, MPS v3 only",
    PREFIX + "mps_spare_namespaces": "gauge{gpu_uuid}, MPS v3 only",
    PREFIX + "mps_spare_namespace_failures_total": "counter{gpu_uuid}, MPS v3 only",
}


class StatusSource(Protocol):
    """:class:`~dra_driver.mpsagent.agent.MpsAgent` is one."""

    def status(self) -> AgentStatus: ...


def agent_metrics(status: AgentStatus) -> list[Metric]:
    """The agent's series for ``status`` (pure)."""
    info = InfoMetricFamily(
        PREFIX + "mps_agent", "The MPS protocol the agent drives (v3 or legacy)."
    )
    info.add_metric([], {"protocol": status.protocol})
    running = GaugeMetricFamily(
        PREFIX + "mps_daemon_running",
        "1 while this GPU's MPS control daemon runs; 0 while it is down (being restarted, "
        "or it could not be brought back).",
        labels=["gpu_uuid"],
    )
    restarts = CounterMetricFamily(
        PREFIX + "mps_daemon_restarts",
        "Times the agent restarted this GPU's MPS control daemon after it died unasked, "
        "since the agent started.",
        labels=["gpu_uuid"],
    )
    shares = GaugeMetricFamily(
        PREFIX + "mps_agent_shares",
        "MPS shares the agent holds on this GPU (one namespace each under MPS v3).",
        labels=["gpu_uuid"],
    )
    # Here rather than in the kubelet plugin's metrics: the agent finds the wait, and
    # reads it at scrape time, so the gauge has no poll lag and no stale value while
    # the plugin is down or cannot reach the agent; it sits with the other per-GPU
    # daemon series. The plugin turns the same status into Events.
    waiting = GaugeMetricFamily(
        PREFIX + "mps_waiting_uids",
        "Legacy MPS: UIDs whose MPS clients wait on this GPU until the server of another "
        "UID exits (legacy MPS serves one UID at a time); 0 when none wait, and always "
        "under MPS v3.",
        labels=["gpu_uuid"],
    )
    deleting = GaugeMetricFamily(
        PREFIX + "mps_namespaces_deleting",
        "MPS v3: namespaces of released shares not deleted yet (the release answers once "
        "the state file no longer holds the share; the delete follows, retried until it "
        "works). Staying above 0 means the daemon refuses the deletes: see the agent's log.",
        labels=["gpu_uuid"],
    )
    delete_failures = CounterMetricFamily(
        PREFIX + "mps_namespace_delete_failures",
        "MPS v3: failed tries at deleting a released share's namespace, since the agent "
        "started (each is retried).",
        labels=["gpu_uuid"],
    )
    spares = GaugeMetricFamily(
        PREFIX + "mps_spare_namespaces",
        "MPS v3: namespaces this GPU's daemon holds made ahead of the shares that will "
        "take them (a new share then needs one command, not two).",
        labels=["gpu_uuid"],
    )
    spare_failures = CounterMetricFamily(
        PREFIX + "mps_spare_namespace_failures",
        "MPS v3: spare namespaces the daemon refused to make, since the agent started "
        "(each is tried again; new shares make their own meanwhile).",
        labels=["gpu_uuid"],
    )
    for daemon in status.daemons:
        running.add_metric([daemon.gpu_uuid], 1 if daemon.running else 0)
        restarts.add_metric([daemon.gpu_uuid], daemon.restarts)
        shares.add_metric([daemon.gpu_uuid], daemon.shares)
        waiting.add_metric([daemon.gpu_uuid], len(set(daemon.waiting_uids)))
        deleting.add_metric([daemon.gpu_uuid], daemon.namespaces_deleting)
        delete_failures.add_metric([daemon.gpu_uuid], daemon.namespace_delete_failures)
        spares.add_metric([daemon.gpu_uuid], daemon.spare_namespaces)
        spare_failures.add_metric([daemon.gpu_uuid], daemon.spare_namespace_failures)
    return [
        *(info, running, restarts, shares, waiting, deleting, delete_failures),
        *(spares, spare_failures),
    ]


class _AgentCollector(Collector):
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.watched: tuple[StatusSource, asyncio.AbstractEventLoop] | None = None

    def describe(self) -> Iterable[Metric]:
        return agent_metrics(AgentStatus(version=0, protocol="v3", daemons=()))

    def collect(self) -> Iterable[Metric]:
        status = self._status()
        return agent_metrics(status) if status is not None else []

    def _status(self) -> AgentStatus | None:
        watched = self.watched
        if watched is None:
            return None
        agent, loop = watched
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:  # no loop in this thread: the metrics server's
            on_loop = False
        if on_loop:
            return agent.status()
        answer: concurrent.futures.Future[AgentStatus] = concurrent.futures.Future()

        def read() -> None:
            if not answer.set_running_or_notify_cancel():
                return
            try:
                answer.set_result(agent.status())
            except Exception as err:
                answer.set_exception(err)

        try:
            loop.call_soon_threadsafe(read)
        except RuntimeError:  # the loop is closed: the agent is gone
            return None
        try:
            return answer.result(timeout=self.timeout_s)
        except TimeoutError:
            answer.cancel()
            log.warning(
                "metrics: the mps-agent's event loop did not answer in %.1fs; "
                "its series are left out of this scrape",
                self.timeout_s,
            )
            return None


class AgentMetrics:
    """The mps-agent's metrics, in a registry of their own (:attr:`registry`).

    ``run_agent(..., metrics=...)`` calls :meth:`watch` once its agent exists
    and :meth:`unwatch` when it stops.
    """

    def __init__(self, registry: CollectorRegistry | None = None, timeout_s: float = 5.0) -> None:
        self.registry = registry if registry is not None else new_registry("mps-agent")
        self._collector = _AgentCollector(timeout_s)
        self.registry.register(self._collector)

    def watch(self, agent: StatusSource, loop: asyncio.AbstractEventLoop) -> None:
        """Report ``agent``, whose state belongs to ``loop``."""
        self._collector.watched = (agent, loop)

    def unwatch(self) -> None:
        self._collector.watched = None
