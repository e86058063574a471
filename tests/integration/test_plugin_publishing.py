"""The running plugin keeps its ResourceSlices published (fake API over real HTTP)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.app.plugin import PluginParts, SliceOptions, start_plugin
from dra_driver.core.model import Inventory
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, node_object, resource_claim
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.publisher import SlicePublisher
from tests.support.chart import chart_api, plugin_transport
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked

SLICES = "resourceslices"


@pytest.fixture(params=[34, 36], ids=["k8s-1.34", "k8s-1.36"])
def api(request: pytest.FixtureRequest) -> Iterator[FakeKubeApi]:
    # The plugin runs as its ServiceAccount, under the chart's RBAC and slice policy.
    with chart_api(kube_minor=request.param) as fake:
        fake.create(node_object(NODE))
        fake.create(node_object("node-b"))
        yield fake


def parts_with_slices(dirs: NodeDirs, api: FakeKubeApi) -> tuple[PluginParts, SlicePublisher]:
    client = plugin_transport(api)
    publisher = SlicePublisher(client, driver_name=DRIVER, node_name=NODE)
    options = SliceOptions(
        publisher=publisher,
        probe=functools.partial(probe_capabilities, client, DRIVER, NODE),
    )
    parts = PluginParts(
        dirs.config(),
        FakeGpuBackend("h100-80gb:2,h100-80gb:1:mig", NODE),
        InMemoryClaimSource(),
        options,
    )
    return parts, publisher


def ours(api: FakeKubeApi) -> list[dict[str, Any]]:
    return [s for s in api.objects(SLICES) if s["spec"]["nodeName"] == NODE]


def test_publishes_at_start_and_again_after_each_registration(
    node_dirs: NodeDirs, api: FakeKubeApi
) -> None:
    foreign = api.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "node-b-other"},
            "spec": {"driver": DRIVER, "nodeName": "node-b", "pool": {"name": "node-b",
                     "generation": 1, "resourceSliceCount": 1}, "devices": []},
        }
    )  # fmt: skip

    async def scenario() -> None:
        parts, _ = parts_with_slices(node_dirs, api)
        runtime = await start_plugin(parts)
        try:
            assert runtime.publishing is not None
            publishing = runtime.publishing
            await eventually(lambda: publishing.last_result is not None, "the first publish")
            first = ours(api)
            assert {s["spec"]["pool"]["generation"] for s in first} == {1}
            counts = {s["spec"]["pool"]["resourceSliceCount"] for s in first}
            assert counts == {len(first)}
            assert runtime.publishing is not None and runtime.publishing.capabilities is not None
            names = sorted(d["name"] for s in first for d in s["spec"].get("devices", []))
            if runtime.publishing.capabilities.partitionable_devices:
                assert any("-mig-" in n for n in names), names
            else:  # 1.34: the MIG GPU has no static instance, so only whole GPUs
                assert names == ["gpu-0", "gpu-1"]

            # The kubelet starts: it wipes the node's slices, then registers us.
            for obj in first:
                api.delete(SLICES, obj["metadata"]["name"])
            kubelet = FakeKubelet(node_dirs.registry)
            await kubelet.wait_for_plugin(DRIVER)
            await eventually(
                lambda: (
                    publishing.last_result is not None and publishing.last_result.generation == 2
                ),
                "the republish",
            )
            assert len(ours(api)) == len(first)
            assert {s["spec"]["pool"]["generation"] for s in ours(api)} == {2}
            await kubelet.close()
        finally:
            await runtime.stop()
        # A normal shutdown leaves the slices to the next pod (or the kubelet).
        assert len(ours(api)) == len(first)
        assert api.get(SLICES, "node-b-other") == foreign

    run_checked(scenario())


class ResettableGpus(FakeGpuBackend):
    """A node whose GPU 1 comes back from a reset with MIG enabled."""

    def __init__(self) -> None:
        super().__init__("h100-80gb:2", NODE)
        self.after_reset = FakeGpuBackend("h100-80gb:1,h100-80gb:1:mig", NODE)
        self.reset = False

    async def inventory(self) -> Inventory:
        if self.reset:
            return await self.after_reset.inventory()
        return await super().inventory()


def test_inventory_change_is_republished(node_dirs: NodeDirs, api: FakeKubeApi) -> None:
    async def scenario() -> None:
        client = plugin_transport(api)
        publisher = SlicePublisher(client, driver_name=DRIVER, node_name=NODE)
        backend = ResettableGpus()
        runtime = await start_plugin(
            PluginParts(
                dataclasses.replace(node_dirs.config(), inventory_interval=0.05),
                backend,
                InMemoryClaimSource(),
                SliceOptions(
                    publisher=publisher,
                    probe=functools.partial(probe_capabilities, client, DRIVER, NODE),
                ),
            )
        )
        try:
            assert runtime.publishing is not None
            publishing = runtime.publishing
            await eventually(lambda: publishing.last_result is not None, "the first publish")
            backend.reset = True
            assert runtime.publishing is not None and runtime.publishing.capabilities is not None
            mig = runtime.publishing.capabilities.partitionable_devices
            await eventually(
                lambda: {s["spec"]["pool"]["generation"] for s in ours(api)} == {2},
                "the republish",
            )
            names = {d["name"] for s in ours(api) for d in s["spec"].get("devices", [])}
            assert "gpu-1" not in names
            assert any(n.startswith("gpu-1-mig-") for n in names) is mig
            assert runtime.server is not None
            health = {d.device_name for d in runtime.server.health.snapshot()[1]}
            assert "gpu-1" not in health and "gpu-1-mig-3g40gb-9-0" in health
        finally:
            await runtime.stop()

    run_checked(scenario())


def test_mig_instances_we_create_do_not_change_the_pool(node_dirs: NodeDirs) -> None:
    claim = resource_claim("ns", "mig", devices=[Allocated("gpu-0-mig-1g10gb-19-3")])

    async def scenario() -> None:
        with chart_api(kube_minor=36) as api:
            api.create(node_object(NODE))
            client = plugin_transport(api)
            publisher = SlicePublisher(client, driver_name=DRIVER, node_name=NODE)
            backend = FakeGpuBackend("h100-80gb:1:mig", NODE)
            runtime = await start_plugin(
                PluginParts(
                    dataclasses.replace(node_dirs.config(), inventory_interval=0.05),
                    backend,
                    InMemoryClaimSource([claim]),
                    SliceOptions(
                        publisher=publisher,
                        probe=functools.partial(probe_capabilities, client, DRIVER, NODE),
                    ),
                )
            )
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                assert runtime.publishing is not None
                publishing = runtime.publishing
                plugin = await kubelet.wait_for_plugin(DRIVER)
                await eventually(lambda: publishing.last_result is not None, "the first publish")
                ref = claim_ref(claim)
                assert (await plugin.prepare([ref]))[ref.uid].error == ""
                assert len((await backend.inventory()).gpus[0].mig_devices) == 1
                # The watcher sees the new instance, republishes: nothing changes.
                await eventually(
                    lambda: publishing.inventory.gpus[0].mig_devices, "the re-discovery"
                )
                publishing.publisher.request_publish()
                await asyncio.sleep(0.3)
                assert {s["spec"]["pool"]["generation"] for s in ours(api)} == {1}
                names = {d["name"] for s in ours(api) for d in s["spec"].get("devices", [])}
                assert "gpu-0-mig-1g10gb-19-3" in names and "gpu-0-mig-7g80gb-0-0" in names
            finally:
                await kubelet.close()
                await runtime.stop()

    run_checked(scenario())
