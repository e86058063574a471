"""dra-driver cleanup: what a node is left with after the driver, undone."""

from __future__ import annotations

import dataclasses
import os
import sys

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.cli import main
from dra_driver.core.cdi import cdi_kind_for_driver
from dra_driver.core.settings import NodeSettings
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.objects import Allocated, claim_ref, node_object, resource_claim, share
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.cleanup import cleanup_node
from tests.support.chart import chart_api, plugin_transport
from tests.support.mps import agent_running
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked


def test_cleanup_undoes_mig_mps_cdi_and_slices(node_dirs: NodeDirs) -> None:
    socket = os.path.join(node_dirs.plugin, "mps-agent.sock")
    agent = AgentConfig(
        socket_path=socket,
        state_dir=os.path.join(node_dirs.root, "mps"),
        control_binary=fake_control_path(),
        protocol="v3",
        compute_mode=FakeComputeMode(),
        daemon_env={**os.environ, "PYTHON": sys.executable},
    )
    backend = FakeGpuBackend("h100-80gb:1,h100-80gb:1:mig", NODE)
    claims = [
        resource_claim("ns", "mps", devices=[share("gpu-0", memory="10Gi")]),
        resource_claim("ns", "mig", devices=[Allocated("gpu-1-mig-1g10gb-19-2")]),
    ]
    config = dataclasses.replace(
        node_dirs.config(), settings=NodeSettings(), mps_agent_socket=socket
    )

    async def scenario() -> None:
        with chart_api() as api:  # the plugin as its ServiceAccount
            api.create(node_object(NODE))
            publisher = SlicePublisher(plugin_transport(api), driver_name=DRIVER, node_name=NODE)
            async with agent_running(agent):
                runtime = await start_plugin(
                    PluginParts(config, backend, InMemoryClaimSource(claims))
                )
                kubelet = FakeKubelet(node_dirs.registry)
                try:
                    plugin = await kubelet.wait_for_plugin(DRIVER)
                    results = await plugin.prepare([claim_ref(c) for c in claims])
                    assert not any(r.error for r in results.values())
                finally:
                    await kubelet.close()
                    await runtime.stop()
                # Left behind: a MIG instance, an MPS share, two CDI specs.
                assert len((await backend.inventory()).gpus[1].mig_devices) == 1
                assert len(await MpsAgentClient(socket).list_shares()) == 1
                assert len(node_dirs.cdi_files()) == 2
                api.create(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"name": "ours"},
                        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE,
                                 "generation": 1, "resourceSliceCount": 1}, "devices": []},
                    }
                )  # fmt: skip
                report = await cleanup_node(
                    checkpoint_path=os.path.join(node_dirs.plugin, "checkpoint.json"),
                    cdi=CdiStore(node_dirs.cdi, cdi_kind_for_driver(DRIVER)),
                    backend=backend,
                    mps_socket=socket,
                    publisher=publisher,
                )
                assert report.problems == []
                assert len(report.mig_destroyed) == 1 and len(report.shares_released) == 1
                assert (await backend.inventory()).gpus[1].mig_devices == ()
                assert await MpsAgentClient(socket).list_shares() == []
            assert node_dirs.cdi_files() == []
            assert not os.path.exists(os.path.join(node_dirs.plugin, "checkpoint.json"))
            assert report.slices_deleted == ("ours",)
            assert api.objects("resourceslices") == []

    run_checked(scenario())


def test_cleanup_command_on_a_clean_node(node_dirs: NodeDirs) -> None:
    argv = ["cleanup", "--plugin-dir", node_dirs.plugin, "--cdi-root", node_dirs.cdi]
    assert main([*argv, "--kubeconfig", "none"]) == 0
