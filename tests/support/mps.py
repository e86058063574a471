"""Running the mps-agent in a test's event loop."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent.agent import AgentConfig, run_agent
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.metrics import AgentMetrics


def fake_agent_config(
    plugin_dir: str, root: str, extra_env: Mapping[str, str] | None = None
) -> AgentConfig:
    """An MPS v3 agent on the packaged fake control, its socket in ``plugin_dir``, its
    state under ``root``; ``extra_env`` reaches the fake daemons (e.g. a command delay)."""
    return AgentConfig(
        socket_path=os.path.join(plugin_dir, "mps-agent.sock"),
        state_dir=os.path.join(root, "mps"),
        control_binary=fake_control_path(),
        protocol="v3",
        compute_mode=FakeComputeMode(),
        daemon_env={**os.environ, "PYTHON": sys.executable, **(extra_env or {})},
    )


@asynccontextmanager
async def agent_running(
    config: AgentConfig, metrics: AgentMetrics | None = None
) -> AsyncIterator[None]:
    """The agent serving until the block ends; ``metrics``: its metrics, kept current."""
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_agent(config, install_signal_handlers=False, ready=ready, metrics=metrics)
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        await task  # raises why the agent could not start
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
