"""Running the mps-agent in a test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from dra_driver.mpsagent.agent import AgentConfig, run_agent
from dra_driver.mpsagent.metrics import AgentMetrics


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
