"""Faults dropped as files reach the kubelet's health stream through the real plugin runtime."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from tests.support.health_stream import until_health
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked


def drop(directory: str, name: str, text: str) -> None:
    """As a test or an operator would: write a temporary name, then rename."""
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


async def renamed(path: str) -> None:
    deadline = time.monotonic() + 10
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear"
        await asyncio.sleep(0.01)


def test_a_dropped_xid_file_makes_the_device_unhealthy_and_a_reset_file_heals_it(
    node_dirs: NodeDirs,
) -> None:
    health_dir = os.path.join(node_dirs.plugin, "fake-health")

    async def scenario() -> None:
        backend = FakeGpuBackend("h100-80gb:2,h100-80gb:1:mig", NODE, health_dir=health_dir)
        config = dataclasses.replace(node_dirs.config(), health_probe_interval=0.05)
        runtime = await start_plugin(PluginParts(config, backend, InMemoryClaimSource()))
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            stream = plugin.watch_health("v1")
            reports = await until_health(stream, "gpu-1", "Healthy")
            await renamed(health_dir)  # the backend made its directory

            drop(health_dir, "typo.json", '{"gpu": "gpu-1", "xdi": 79}')
            drop(health_dir, "xid.json", '{"gpu": "gpu-1", "xid": 79}')
            reports = await until_health(stream, "gpu-1", "Unhealthy")
            assert reports["gpu-1"].message == (
                "xid-79: XID 79 (GPU has fallen off the bus) (needs a GPU reset)"
            )
            assert reports["gpu-0"].health == "Healthy"
            await renamed(os.path.join(health_dir, "xid.json.done"))
            await renamed(os.path.join(health_dir, "typo.json.bad"))

            drop(health_dir, "mig.json", '{"gpu": "gpu-2", "xid": 48}')
            mig_names = [n for n in reports if n.startswith("gpu-2-mig-")]  # MIG is on
            assert mig_names
            reports = await until_health(stream, mig_names[0], "Unhealthy")
            assert {reports[n].health for n in mig_names} == {"Unhealthy"}  # fatal: all

            drop(health_dir, "reset.json", '{"reset": true}')  # every GPU
            reports = await until_health(stream, "gpu-1", "Healthy")
            reports = await until_health(stream, mig_names[0], "Healthy")
            assert {r.health for r in reports.values()} == {"Healthy"}
            assert sorted(os.listdir(health_dir)) == [
                "mig.json.done",
                "reset.json.done",
                "typo.json.bad",
                "xid.json.done",
            ]
            await stream.aclose()
        finally:
            await kubelet.close()
            await runtime.stop()
        assert backend._watcher is None  # stopped with the plugin

    run_checked(scenario())
