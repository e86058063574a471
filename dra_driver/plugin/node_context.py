"""Who the plugin is on this node and what every claim's container gets (at start, I/O).

:func:`node_context` gathers the engine's :class:`~dra_driver.core.prepare.NodeContext`:
the names from the configuration, the driver files every GPU container needs
(:func:`common_edits`) and the dmem hook for MPS shares' memory limits.
"""

from __future__ import annotations

import asyncio
import logging

from dra_driver.base.ids import PoolName
from dra_driver.core.cdi import (
    ContainerEdits,
    cdi_kind_for_driver,
    edits_from_driver_files,
    edits_from_toolkit_spec,
    fake_common_edits,
)
from dra_driver.core.model import Inventory
from dra_driver.core.ports import GpuBackend
from dra_driver.core.prepare import NodeContext
from dra_driver.gpu.driver_files import discover_driver_files, load_toolkit_spec
from dra_driver.plugin.config import PluginConfig
from dra_driver.plugin.enforcement import dmem_hook_settings

__all__ = ["common_edits", "node_context"]

log = logging.getLogger(__name__)


def common_edits(config: PluginConfig, has_driver_files: bool) -> ContainerEdits:
    """What every GPU container needs besides its GPU: libraries, control nodes, hooks.

    A backend without driver files (fake): stand-in control nodes. Otherwise the
    NVIDIA Container Toolkit's CDI spec when the node has one (its common edits),
    else our own discovery under ``config.driver_root``. Blocks (reads files).
    """
    if not has_driver_files:
        return fake_common_edits()
    doc = load_toolkit_spec()
    if doc is not None:
        log.info("using the NVIDIA Container Toolkit's CDI spec for the driver files")
        return edits_from_toolkit_spec(doc).common
    files = discover_driver_files(config.driver_root)
    for note in files.notes:
        log.info("driver discovery: %s", note)
    return edits_from_driver_files(files, hook_path=config.cdi_hook_path)


async def node_context(
    config: PluginConfig, backend: GpuBackend, inventory: Inventory
) -> NodeContext:
    """The engine's node context for ``inventory``'s GPUs on ``backend``."""
    return NodeContext(
        driver_name=config.driver_name,
        node_name=config.node_name,
        pool_name=PoolName(config.node_name),
        cdi_kind=cdi_kind_for_driver(config.driver_name),
        settings=config.settings,
        common_edits=await asyncio.to_thread(common_edits, config, backend.has_driver_files),
        fake_device_nodes=not backend.has_device_nodes,
        dmem=await dmem_hook_settings(
            inventory.gpus,
            cgroup_root=config.cgroup_root,
            hook_dir=config.hook_dir,
            mode=config.dmem_limits,
        )
        if backend.supports_dmem
        else None,
    )
