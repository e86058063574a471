"""The mps-agent's composition root: its configuration's collaborators, its object
graph (the MPS protocol, a daemon per GPU, the agent and its socket, its metrics
and metrics server) and the agent run until a signal (:func:`run_agent`).

A GPU's daemon supervisor must live as long as its daemon: one that dies
unexpectedly stops the agent (:class:`~dra_driver.app.tasks.BackgroundTaskFailed`:
``dra-driver mps-agent`` exits 2, to be restarted) with the shutdown a signal
gives it (:meth:`~dra_driver.mpsagent.agent.MpsAgent.close`), rather than leaving
an agent whose daemon nobody restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.app.heap import settle_heap
from dra_driver.app.tasks import BackgroundTaskFailed, first_of
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent.agent import AgentConfig, MpsAgent
from dra_driver.mpsagent.commands import UNSHARE_PRIVATE_MOUNT, choose_protocol, daemon_protocol
from dra_driver.mpsagent.compute_mode import FakeComputeMode, NvidiaSmiComputeMode
from dra_driver.mpsagent.daemon import MpsDaemon
from dra_driver.mpsagent.metrics import AgentMetrics
from dra_driver.mpsagent.protocol import MpsProtocol
from dra_driver.observability.metrics_server import serve_metrics

log = logging.getLogger(__name__)


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
    spare_namespaces: int
    """MPS v3: spare namespaces per daemon (:attr:`AgentConfig.spare_namespaces`)."""
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
        spare_namespaces=options.spare_namespaces,
        shm_namespace=(
            UNSHARE_PRIVATE_MOUNT
            if options.daemon_shm == "private" or (options.daemon_shm == "auto" and not fake)
            else None
        ),
    )


def build_agent(
    config: AgentConfig, supervisor_failed: Callable[[str, BaseException], None]
) -> MpsAgent:
    """The agent and its collaborators: the MPS protocol (``config.protocol``, or by
    driver version) and the daemon of each GPU or MIG instance, made on first use
    (a MIG instance's daemon speaks legacy MPS: :func:`daemon_protocol`)."""
    protocol: MpsProtocol = choose_protocol(config.protocol, config.driver_version)

    def daemon(gpu_uuid: str) -> MpsDaemon:
        return MpsDaemon(
            gpu_uuid,
            config.state_dir,
            config.control_binary,
            daemon_protocol(protocol, gpu_uuid),
            config.compute_mode,
            base_env=config.daemon_env,
            command_timeout=config.command_timeout_s,
            shm_namespace=config.shm_namespace,
            uid_check_interval=config.uid_check_interval_s,
            control_channel=config.control_channel,
        )

    return MpsAgent(config, protocol=protocol, daemon=daemon, supervisor_failed=supervisor_failed)


async def run_agent(
    config: AgentConfig,
    *,
    install_signal_handlers: bool = True,
    ready: asyncio.Event | None = None,
    metrics: AgentMetrics | None = None,
    settle: bool = False,
) -> None:
    """Run the agent until cancelled, SIGTERM or SIGINT; then shut down in order.

    ``metrics``: report this agent's daemons and shares there while it runs;
    ``settle``: once serving, freeze the heap (:func:`~dra_driver.app.heap.settle_heap`;
    the daemon's process, not a test's).
    Raises :class:`BackgroundTaskFailed` (after the same shutdown) when a daemon's
    supervisor died unexpectedly.
    """
    failures: list[BackgroundTaskFailed] = []
    failed = asyncio.Event()

    def supervisor_failed(name: str, err: BaseException) -> None:
        failure = BackgroundTaskFailed(name, err, "mps-agent")
        if not failures:  # the first one says why the agent stops
            failures.append(failure)
            log.error("%s", failure)
            failed.set()

    agent = build_agent(config, supervisor_failed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if metrics is not None:
        metrics.watch(agent, loop)
    handled: list[signal.Signals] = []
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
    try:
        await agent.start()
        await agent.serve()
        if settle:
            settle_heap()
        if ready is not None:
            ready.set()
        await first_of(stop.wait(), failed.wait())
        if not failures:
            log.info("mps-agent stopping")
    finally:
        if metrics is not None:
            metrics.unwatch()
        for sig in handled:
            loop.remove_signal_handler(sig)
        await agent.close()
    if failures:
        raise failures[0]


def run_mps_agent(options: AgentOptions) -> None:
    """Serve the agent (and its metrics) until SIGTERM or SIGINT (raises
    :class:`BackgroundTaskFailed` when a daemon's supervisor dies)."""
    config = agent_config(options)
    os.makedirs(os.path.dirname(config.socket_path), exist_ok=True)
    metrics = AgentMetrics() if options.metrics_port else None
    server = (
        serve_metrics(options.metrics_port, metrics.registry, options.metrics_address)
        if metrics
        else None
    )
    try:
        asyncio.run(run_agent(config, metrics=metrics, settle=True))
    finally:
        if server is not None:
            server.stop()
