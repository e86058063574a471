"""The agent's status while the last share of a GPU is released: its daemon stops,
and it is not reported as a daemon that should run and does not (the plugin's health
monitor taints a GPU whose daemon holds shares and is down)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from dra_driver.mpsagent.compute_mode import FakeComputeMode, Mode
from dra_driver.plugin.health_monitor import mps_daemons_down
from tests.support.mps import GIB, GPU0, agent_running, cleanup, make_node


class SlowRestore(FakeComputeMode):
    """Giving the GPU its mode back takes a while (after the daemon has exited)."""

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        if mode != "EXCLUSIVE_PROCESS":
            await asyncio.sleep(0.3)
        await super().set_mode(gpu_uuid, mode)


def test_a_daemon_stopping_after_its_last_share_is_not_down() -> None:
    node = make_node("v3")
    config = replace(node.config, compute_mode=SlowRestore())

    async def scenario() -> None:
        async with agent_running(config):
            client = node.client()
            await client.ensure_share(
                GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=GIB,
                active_thread_percentage=50,
            )  # fmt: skip
            release = asyncio.create_task(client.release_share(GPU0, "share-a"))
            seen = []
            while not release.done():
                status = await client.status()
                seen.append(status)
                assert not mps_daemons_down(status), status
                await asyncio.sleep(0.01)
            assert await release is True
            # The window was there to be seen: the daemon had stopped running.
            assert any(d.gpu_uuid == GPU0 and not d.running for s in seen for d in s.daemons)

    try:
        asyncio.run(scenario())
    finally:
        cleanup(node)
