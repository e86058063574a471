"""The mps-agent's collector: the agent's state is read on its own event loop."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from prometheus_client import generate_latest

from dra_driver.mpsagent.metrics import AgentMetrics
from dra_driver.mpsagent.protocol import AgentStatus, DaemonStatus
from tests.support.metrics import Scrape

P = "fractional_gpu_dra_"
STATUS = AgentStatus(
    version=1,
    protocol="v3",
    daemons=(
        DaemonStatus(
            "GPU-0",
            pid=41,
            running=True,
            restarts=2,
            shares=3,
            namespaces_deleting=2,
            namespace_delete_failures=7,
        ),
        DaemonStatus("GPU-1", pid=None, running=False, restarts=5, shares=1),
    ),
)


class Agent:
    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def status(self) -> AgentStatus:
        self.threads.append(threading.current_thread())
        return STATUS


def scrape(metrics: AgentMetrics) -> Scrape:
    return Scrape(generate_latest(metrics.registry).decode())


def test_a_scrape_from_another_thread_reads_the_status_on_the_agents_loop() -> None:
    metrics, agent = AgentMetrics(), Agent()

    async def scenario() -> Scrape:
        metrics.watch(agent, asyncio.get_running_loop())
        return await asyncio.to_thread(scrape, metrics)

    got = asyncio.run(scenario())
    assert agent.threads == [threading.main_thread()]  # the loop's thread, not the scraper's
    assert got.get(P + "mps_agent_info", protocol="v3") == 1
    assert got.get(P + "mps_daemon_running", gpu_uuid="GPU-0") == 1
    assert got.get(P + "mps_daemon_running", gpu_uuid="GPU-1") == 0
    assert got.get(P + "mps_daemon_restarts_total", gpu_uuid="GPU-1") == 5
    assert got.get(P + "mps_agent_shares", gpu_uuid="GPU-0") == 3
    assert got.get(P + "mps_namespaces_deleting", gpu_uuid="GPU-0") == 2
    assert got.get(P + "mps_namespace_delete_failures_total", gpu_uuid="GPU-0") == 7
    assert got.get(P + "mps_namespace_delete_failures_total", gpu_uuid="GPU-1") == 0


def test_a_scrape_on_the_loop_itself_reads_directly() -> None:
    metrics, agent = AgentMetrics(), Agent()

    async def scenario() -> Scrape:
        metrics.watch(agent, asyncio.get_running_loop())
        return scrape(metrics)  # would wait on itself if it hopped

    assert asyncio.run(scenario()).get(P + "mps_agent_shares", gpu_uuid="GPU-1") == 1


def test_a_loop_that_does_not_answer_leaves_the_agent_out_of_the_scrape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics, agent = AgentMetrics(timeout_s=0.05), Agent()
    loop = asyncio.new_event_loop()  # never run: stands in for a blocked loop
    try:
        metrics.watch(agent, loop)
        with caplog.at_level(logging.WARNING, logger="dra_driver.observability"):
            got = scrape(metrics)
        assert not got.series(P + "mps_agent_info")
        assert got.series(P + "build_info")
        assert "did not answer in 0.1s" in caplog.text
    finally:
        loop.close()
    assert not scrape(metrics).series(P + "mps_agent_info")  # closed loop: nothing to ask
    metrics.unwatch()
    assert not scrape(metrics).series(P + "mps_agent_info")
    assert agent.threads == []
