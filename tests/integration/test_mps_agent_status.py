"""The agent's status while the last share of a GPU is released: its daemon stops,
and it is not reported as a daemon that should run and does not (the plugin's health
monitor taints a GPU whose daemon holds shares and is down)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from dra_driver.mpsagent.compute_mode import FakeComputeMode, Mode
from dra_driver.plugin.health_monitor import mps_daemons_down
from tests.support.mps import GIB, GPU0, agent_running, cleanup, make_node


class HeldRestore(FakeComputeMode):
    """Giving the GPU its mode back (after the daemon has exited) waits until the test
    lets it go: the window between the daemon's exit and the release's end stays open."""

    def __init__(self) -> None:
        super().__init__()
        self.restoring = asyncio.Event()
        self.go_on = asyncio.Event()

    async def set_mode(self, gpu_uuid: str, mode: Mode) -> None:
        if mode != "EXCLUSIVE_PROCESS":
            self.restoring.set()
            await self.go_on.wait()
        await super().set_mode(gpu_uuid, mode)


def test_a_daemon_stopping_after_its_last_share_is_not_down() -> None:
    node = make_node("v3")
    modes = HeldRestore()
    config = replace(node.config, compute_mode=modes)

    async def scenario() -> None:
        async with agent_running(config):
            client = node.client()
            await client.ensure_share(
                GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=GIB,
                active_thread_percentage=50,
            )  # fmt: skip
            release = asyncio.create_task(client.release_share(GPU0, "share-a"))
            while not modes.restoring.is_set():  # until the daemon has gone
                status = await client.status()
                assert not mps_daemons_down(status), status
                await asyncio.sleep(0)
            # In the window: the daemon has stopped running, and that is not "down".
            status = await client.status()
            assert not mps_daemons_down(status), status
            assert [(d.gpu_uuid, d.running) for d in status.daemons] == [(GPU0, False)], status
            modes.go_on.set()
            assert await release is True
            assert not mps_daemons_down(await client.status())

    try:
        asyncio.run(scenario())
    finally:
        cleanup(node)
