"""The mps-agent's metrics for real: the agent with the fake MPS control daemon (real
processes), metrics scraped over HTTP; and the ``dra-driver mps-agent`` process serving
them on ``--metrics-port``."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.error
from collections.abc import Iterator

import pytest

from dra_driver import __version__
from dra_driver.mpsagent.metrics import AgentMetrics
from dra_driver.observability.metrics_server import serve_metrics
from tests.support.eventually import eventually
from tests.support.metrics import Scrape, scrape
from tests.support.mps import (
    GIB,
    GPU0,
    GPU1,
    Node,
    agent_running,
    cleanup,
    daemon_pid,
    make_node,
)
from tests.support.processes import free_port

P = "fractional_gpu_dra_"
RUNNING = P + "mps_daemon_running"
RESTARTS = P + "mps_daemon_restarts_total"
SHARES = P + "mps_agent_shares"


@pytest.fixture
def node() -> Iterator[Node]:
    made = make_node("v3")
    yield made
    cleanup(made)


def test_daemons_restarts_and_shares_per_gpu(node: Node) -> None:
    metrics = AgentMetrics()
    server = serve_metrics(0, metrics.registry, "127.0.0.1")

    async def scraped() -> Scrape:
        # Off the loop: the scrape waits for the agent's loop to read its state.
        return await asyncio.to_thread(scrape, server.port)

    async def scenario() -> None:
        async with agent_running(node.config, metrics):
            idle = await scraped()
            assert idle.get(P + "mps_agent_info", protocol="v3") == 1
            assert not idle.series(RUNNING)  # no share yet: no daemon

            client = node.client()
            for name, gpu in (("a", GPU0), ("b", GPU0), ("c", GPU1)):
                await client.ensure_share(
                    gpu, f"share-{name}", claim_uid=f"claim-{name}",
                    memory_limit_bytes=GIB, active_thread_percentage=20,
                )  # fmt: skip
            got = await scraped()
            assert got.get(RUNNING, gpu_uuid=GPU0) == 1
            assert got.get(SHARES, gpu_uuid=GPU0) == 2
            assert got.get(SHARES, gpu_uuid=GPU1) == 1
            assert got.get(RESTARTS, gpu_uuid=GPU0) == 0
            assert got.types[P + "mps_daemon_restarts"] == "counter"

            pid = await daemon_pid(client, GPU0)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)

            async def restarted() -> bool:
                return (await scraped()).get(RESTARTS, gpu_uuid=GPU0) == 1

            await eventually(restarted)
            got = await scraped()
            assert got.get(RUNNING, gpu_uuid=GPU0) == 1
            assert got.get(SHARES, gpu_uuid=GPU0) == 2
            assert got.get(RESTARTS, gpu_uuid=GPU1) == 0

            await client.release_share(GPU1, "share-c")  # its last share: daemon stopped
            assert not {s["gpu_uuid"] for s in (await scraped()).series(RUNNING)} & {GPU1}
        stopped = await scraped()
        assert not stopped.series(RUNNING) and not stopped.series(P + "mps_agent_info")
        assert stopped.series(P + "build_info")

    try:
        asyncio.run(scenario())
    finally:
        server.stop()


def test_the_agent_process_serves_metrics_until_sigterm(node: Node) -> None:
    port = free_port()
    cmd = [
        sys.executable, "-m", "dra_driver", "mps-agent",
        "--socket", node.config.socket_path,
        "--state-dir", node.config.state_dir,
        "--mps-control", "fake",
        "--mps-protocol", "legacy",
        "--metrics-port", str(port),
        "--metrics-address", "127.0.0.1",
        "--log-format", "json",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                got = scrape(port)
            except urllib.error.URLError:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "no metrics endpoint"
                time.sleep(0.05)
                continue
            if got.series(P + "mps_agent_info"):
                break
            time.sleep(0.05)  # served, the agent not yet started
        assert got.get(P + "mps_agent_info", protocol="legacy") == 1
        assert got.get(P + "build_info", version=__version__, component="mps-agent") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert '"message":"mps-agent stopping"' in err  # --log-format json
    with pytest.raises(urllib.error.URLError):
        scrape(port)  # the server stopped with the agent
