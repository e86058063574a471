"""The mps-agent's composition root: its configuration's collaborators, its metrics
server, and the agent run until a signal (:func:`~dra_driver.mpsagent.agent.run_agent`)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent.agent import AgentConfig, run_agent
from dra_driver.mpsagent.commands import UNSHARE_PRIVATE_MOUNT
from dra_driver.mpsagent.compute_mode import FakeComputeMode, NvidiaSmiComputeMode
from dra_driver.mpsagent.metrics import AgentMetrics
from dra_driver.observability.metrics_server import serve_metrics


@dataclass(frozen=True)
class AgentOptions:
    """``dra-driver mps-agent``'s flags, parsed."""

    socket_path: str
    state_dir: str
    mps_control: str
    """The control binary, or ``fake`` for the packaged fake (no GPU)."""
    protocol: str
    driver_version: str | None
    persistent_control_channel: bool
    daemon_shm: str
    """``private``, ``agent`` or ``auto`` (private unless the control binary is fake)."""
    metrics_port: int
    """0: no metrics served."""
    metrics_address: str


def agent_config(options: AgentOptions) -> AgentConfig:
    """The agent's configuration and collaborators: the real or the fake MPS control
    binary and compute mode, and the daemons' shm namespace."""
    fake = options.mps_control == "fake"
    return AgentConfig(
        socket_path=options.socket_path,
        state_dir=options.state_dir,
        control_binary=fake_control_path() if fake else options.mps_control,
        protocol=options.protocol,
        compute_mode=FakeComputeMode() if fake else NvidiaSmiComputeMode(),
        driver_version=options.driver_version,
        # The fake launcher runs ${PYTHON}: this interpreter has the package.
        daemon_env={**os.environ, "PYTHON": sys.executable} if fake else None,
        control_channel=options.persistent_control_channel,
        shm_namespace=(
            UNSHARE_PRIVATE_MOUNT
            if options.daemon_shm == "private" or (options.daemon_shm == "auto" and not fake)
            else None
        ),
    )


def run_mps_agent(options: AgentOptions) -> None:
    """Serve the agent (and its metrics) until SIGTERM or SIGINT."""
    config = agent_config(options)
    os.makedirs(os.path.dirname(config.socket_path), exist_ok=True)
    metrics = AgentMetrics() if options.metrics_port else None
    server = (
        serve_metrics(options.metrics_port, metrics.registry, options.metrics_address)
        if metrics
        else None
    )
    try:
        asyncio.run(run_agent(config, metrics=metrics))
    finally:
        if server is not None:
            server.stop()
