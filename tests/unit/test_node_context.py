"""The engine's node context at plugin start: names from the configuration, what every
container gets on a backend without a driver (the fake one)."""

from __future__ import annotations

import asyncio

from dra_driver.core.cdi import fake_common_edits
from dra_driver.core.prepare import NodeContext
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.plugin.config import PluginConfig
from dra_driver.plugin.node_context import common_edits, node_context

CONFIG = PluginConfig(
    driver_name="gpu.example.com",
    node_name="node-a",
    registry_dir="/registry",
    plugin_dir="/plugin",
    cdi_root="/cdi",
    driver_root="/nonexistent-driver-root",
)


def test_a_backend_without_driver_files_gets_stand_in_control_nodes() -> None:
    edits = common_edits(CONFIG, has_driver_files=False)
    assert edits == fake_common_edits() and edits.device_nodes and not edits.mounts


def test_the_context_of_fake_gpus() -> None:
    async def context() -> NodeContext:
        backend = FakeGpuBackend("l4:1", CONFIG.node_name)
        try:
            return await node_context(CONFIG, backend, await backend.inventory())
        finally:
            await backend.close()

    ctx = asyncio.run(context())
    assert ctx.driver_name == "gpu.example.com" and ctx.node_name == ctx.pool_name == "node-a"
    assert ctx.cdi_kind == "k8s.gpu.example.com/claim"
    assert ctx.settings == CONFIG.settings
    assert ctx.common_edits == fake_common_edits()
    assert ctx.fake_device_nodes and ctx.dmem is None  # fake GPUs have no dmem regions
