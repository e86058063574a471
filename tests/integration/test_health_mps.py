"""MPS daemon health, for real: the plugin with the mps-agent and the fake
``nvidia-cuda-mps-control`` (real processes). A killed daemon makes its GPU's
share device unhealthy in the kubelet's health stream until the agent has it
running again."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys

import pytest

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.core.settings import NodeSettings
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.compute_mode import FakeComputeMode, Mode
from tests.support.eventually import eventually
from tests.support.health_stream import until_health
from tests.support.mps import agent_running
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked


class GatedComputeMode(FakeComputeMode):
    """Holds every mode change (and so a daemon's start) while the gate is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        await self.gate.wait()
        await super().set_mode(gpu_uuid, mode)


def test_killed_mps_daemon_makes_its_share_device_unhealthy_until_restarted(
    node_dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dra_driver.plugin.health_monitor")
    modes = GatedComputeMode()
    agent = AgentConfig(
        socket_path=os.path.join(node_dirs.plugin, "mps-agent.sock"),
        state_dir=os.path.join(node_dirs.root, "mps"),
        control_binary=fake_control_path(),
        protocol="v3",
        compute_mode=modes,
        daemon_env={**os.environ, "PYTHON": sys.executable},
        restart_backoff_s=0.05,
    )
    claim = resource_claim("a", "small", devices=[share("gpu-0", memory="10Gi")])
    config = dataclasses.replace(
        node_dirs.config(),
        settings=NodeSettings(),  # MPS
        mps_agent_socket=agent.socket_path,
        health_probe_interval=0.05,
    )

    async def scenario() -> None:
        async with agent_running(agent):
            runtime = await start_plugin(
                PluginParts(
                    config, FakeGpuBackend("h100-80gb:2", NODE), InMemoryClaimSource([claim])
                )
            )
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER)
                ref = claim_ref(claim)
                assert (await plugin.prepare([ref]))[ref.uid].error == ""
                (daemon,) = (await MpsAgentClient(agent.socket_path).status()).daemons
                assert daemon.running and daemon.pid is not None
                stream = plugin.watch_health("v1alpha1")
                await until_health(stream, "gpu-0", "Healthy", timeout=20)

                modes.gate.clear()  # the agent cannot bring the daemon back yet
                os.kill(daemon.pid, signal.SIGKILL)
                down = await until_health(stream, "gpu-0", "Unhealthy", timeout=20)
                message = down["gpu-0"].message
                assert message.startswith("mps-daemon-down: MPS control daemon down:")
                assert "serving 1 share(s) is not running" in message
                assert down["gpu-1"].health == "Healthy"  # no daemon there: nothing to miss
                assert runtime.health_monitor is not None
                taint = {"key": f"{DRIVER}/unhealthy", "value": "mps-daemon-down"}
                assert runtime.health_monitor.taints() == {
                    "gpu-0": [{**taint, "effect": "NoSchedule"}]
                }

                modes.gate.set()  # the agent restarts it and restores the share
                up = await until_health(stream, "gpu-0", "Healthy", timeout=20)
                assert up["gpu-0"].message == ""
                await stream.aclose()
                # Running again is enough for health; the agent counts the restart once
                # it has restored the share, and the monitor's next poll logs it.
                client = MpsAgentClient(agent.socket_path)

                async def restart_counted() -> bool:
                    (daemon_now,) = (await client.status()).daemons
                    return daemon_now.restarts > 0

                await eventually(restart_counted, "the agent to count the restart")
                (again,) = (await client.status()).daemons
                assert again.running and again.restarts == 1 and again.pid != daemon.pid
                await runtime.health_monitor.poll_mps_once()
                assert not (await plugin.unprepare([ref]))[ref.uid]
            finally:
                modes.gate.set()
                await kubelet.close()
                await runtime.stop()

    run_checked(scenario())
    restarted = [r.getMessage() for r in caplog.records if "restarted it" in r.getMessage()]
    assert restarted and "GPU-" in restarted[0] and "1 share(s) restored" in restarted[0]
