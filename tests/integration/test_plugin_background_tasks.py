"""The plugin's background tasks live as long as it does: one that dies stops the plugin."""

from __future__ import annotations

import functools
import logging
import os

import pytest

from dra_driver.app.plugin import (
    BackgroundTaskFailed,
    Plugin,
    PluginParts,
    SliceOptions,
    run_until_signalled,
    start_plugin,
)
from dra_driver.cli import main
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.objects import node_object
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.plugin.health_monitor import HealthMonitor
from dra_driver.plugin.publishing import SlicePublishing
from tests.support.chart import chart_api, plugin_token, plugin_transport
from tests.support.fakekube import FakeKubeApi
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked


async def _publisher_explodes(self: SlicePublishing) -> None:
    raise RuntimeError("the publisher exploded")


async def _health_returns(self: HealthMonitor) -> None:
    return None


def _parts(dirs: NodeDirs, api: FakeKubeApi) -> tuple[PluginParts, SlicePublisher]:
    client = plugin_transport(api)
    publisher = SlicePublisher(client, driver_name=DRIVER, node_name=NODE)
    options = SliceOptions(
        publisher=publisher, probe=functools.partial(probe_capabilities, client, DRIVER, NODE)
    )
    parts = PluginParts(
        dirs.config(), FakeGpuBackend("h100-80gb:1", NODE), InMemoryClaimSource(), options
    )
    return parts, publisher


class Started:
    """Starts the plugin for :func:`run_until_signalled`, and keeps it to be looked at."""

    def __init__(self, parts: PluginParts) -> None:
        self.parts = parts
        self.plugins: list[Plugin] = []

    async def __call__(self) -> Plugin:
        plugin = await start_plugin(self.parts)
        self.plugins.append(plugin)
        return plugin


def test_a_failed_slice_publisher_stops_the_plugin(
    node_dirs: NodeDirs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(SlicePublishing, "run", _publisher_explodes)
    with chart_api() as api:  # the plugin runs as its ServiceAccount
        api.create(node_object(NODE))
        parts, _ = _parts(node_dirs, api)
        started = Started(parts)
        with pytest.raises(BackgroundTaskFailed, match="slice-publisher failed") as raised:
            run_checked(run_until_signalled(started))
    assert isinstance(raised.value.cause, RuntimeError)
    (plugin,) = started.plugins
    assert plugin.failure is raised.value
    # Stopped: the other tasks cancelled (run_checked: none leaked), the sockets gone.
    assert not os.path.exists(plugin.sockets.dra)
    assert not os.path.exists(plugin.sockets.registration)
    assert plugin.readiness().ready is False
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("background task slice-publisher failed" in m for m in errors), errors
    assert any("the plugin stops" in m for m in errors), errors


def test_a_task_that_ends_stops_the_plugin(
    node_dirs: NodeDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HealthMonitor, "run", _health_returns)
    started = Started(node_dirs.parts(InMemoryClaimSource(), gpus="l4:1"))
    with pytest.raises(BackgroundTaskFailed, match="device-health ended"):
        run_checked(run_until_signalled(started))
    (plugin,) = started.plugins
    assert not os.path.exists(plugin.sockets.dra)


def test_the_kubelet_plugin_command_exits_with_an_error(
    node_dirs: NodeDirs, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(SlicePublishing, "run", _publisher_explodes)
    with chart_api() as api:  # the plugin runs as its ServiceAccount
        api.create(node_object(NODE))
        argv = [
            "kubelet-plugin",
            f"--node-name={NODE}",
            f"--driver-name={DRIVER}",
            f"--kubeconfig={node_dirs.kubeconfig(api.url, plugin_token(api))}",
            f"--registry-dir={node_dirs.registry}",
            f"--plugin-dir={node_dirs.plugin}",
            f"--cdi-root={node_dirs.cdi}",
            f"--boot-id-file={node_dirs.boot_id_file}",
            "--fake-gpus=l4:1",
            "--health-probe-interval=0",
        ]
        assert main(argv) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("slice-publisher failed" in m and "the plugin stops" in m for m in errors), errors
