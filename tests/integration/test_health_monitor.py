"""The health monitor: the fake backend's events and probe, listeners, the kubelet's health
streams over the real socket, and device taints published to the fake API."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from dra_driver.app.plugin import PluginParts, SliceOptions, start_plugin
from dra_driver.core.health import (
    DeviceHealth,
    HealthSettings,
    Status,
    TaintEffect,
)
from dra_driver.core.model import HealthEvent
from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.objects import node_object
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.kubeletplugin.health import Health
from dra_driver.plugin.health_monitor import HealthMonitor, report_timeout
from dra_driver.plugin.publishing import SlicePublishing
from tests.support.chart import chart_api, plugin_transport
from tests.support.clock import Clock
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi
from tests.support.health_stream import until_health
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked, serving

KEY = f"{DRIVER}/unhealthy"
T0 = 1_700_000_000.0
RECOVERY = 300.0


def hub_health(monitor: HealthMonitor) -> dict[str, tuple[Health, str]]:
    return {d.device_name: (d.health, d.message) for d in monitor.hub.snapshot()[1]}


async def fake_monitor(
    gpus: str = "h100-80gb:2,h100-80gb:1:mig", **settings: Any
) -> tuple[FakeGpuBackend, HealthMonitor, Clock]:
    backend = FakeGpuBackend(gpus, NODE)
    clock = Clock(T0)
    monitor = HealthMonitor(
        backend,
        await backend.inventory(),
        driver_name=DRIVER,
        pool_name=NODE,
        settings=HealthSettings(recovery_s=RECOVERY, **settings),
        clock=clock,
    )
    return backend, monitor, clock


async def probing_monitor(
    gpus: str, *, probe_interval: float
) -> tuple[FakeGpuBackend, HealthMonitor]:
    """A monitor on the real clock with default settings; ``probe_interval`` 0: no probe."""
    backend = FakeGpuBackend(gpus, NODE)
    monitor = HealthMonitor(
        backend,
        await backend.inventory(),
        driver_name=DRIVER,
        pool_name=NODE,
        settings=HealthSettings(),
        probe_interval=probe_interval,
    )
    return backend, monitor


# --- the monitor, driven by hand (fake clock) -------------------------------------------


def test_changes_reach_listeners_the_hub_and_publishing_once() -> None:
    async def scenario() -> None:
        backend, monitor, clock = await fake_monitor()
        heard: list[Sequence[DeviceHealth]] = []
        monitor.listeners.append(heard.append)
        republished: list[int] = []
        monitor.republish = lambda: republished.append(1)

        await monitor.handle_event(backend.inject_xid(0, 54, "aux power"))
        assert [[(d.device_name, d.status, d.reason) for d in batch] for batch in heard] == [
            [("gpu-0", Status.UNHEALTHY, "xid-54")]
        ]
        assert republished == [1]
        health, message = hub_health(monitor)["gpu-0"]
        assert health is Health.UNHEALTHY and message.startswith("xid-54: XID 54: aux power")
        assert monitor.taints() == {
            "gpu-0": [{"key": KEY, "value": "xid-54", "effect": "NoSchedule"}]
        }
        states = monitor.hub.snapshot()[1]
        assert {s.timeout_seconds for s in states} == {report_timeout(30.0)} == {90}
        assert {s.pool_name for s in states} == {NODE}

        # The same again, an application XID, an ignored one: nothing to spread.
        await monitor.handle_event(backend.inject_xid(0, 54, "aux power"))
        await monitor.handle_event(backend.inject_xid(1, 13))
        assert len(heard) == 1 and republished == [1]

        clock.now += RECOVERY - 1
        await monitor.tick()
        assert len(heard) == 1
        clock.now += 1
        await monitor.tick()
        assert [(d.device_name, d.status) for d in heard[-1]] == [("gpu-0", Status.HEALTHY)]
        assert republished == [1, 1] and monitor.taints() == {}
        await backend.close()

    run_checked(scenario())


def test_a_failing_listener_does_not_stop_the_others() -> None:
    async def scenario() -> None:
        backend, monitor, _ = await fake_monitor()
        heard: list[Sequence[DeviceHealth]] = []

        def broken(changed: Sequence[DeviceHealth]) -> None:
            raise RuntimeError("listener bug")

        monitor.listeners += [broken, heard.append]
        await monitor.handle_event(backend.inject_xid(1, 79))
        assert [d.device_name for d in heard[0]] == ["gpu-1"]
        await backend.close()

    run_checked(scenario())


def test_snapshot_listeners_hear_every_device_on_each_change() -> None:
    async def scenario() -> None:
        backend, monitor, _ = await fake_monitor("h100-80gb:2")
        changed: list[Sequence[DeviceHealth]] = []
        every: list[Sequence[DeviceHealth]] = []
        monitor.listeners.append(changed.append)
        monitor.snapshot_listeners.append(every.append)
        await monitor.handle_event(backend.inject_xid(1, 79))
        assert [[d.device_name for d in batch] for batch in changed] == [["gpu-1"]]
        assert [[(d.device_name, d.status) for d in batch] for batch in every] == [
            [("gpu-0", Status.HEALTHY), ("gpu-1", Status.UNHEALTHY)]
        ]
        await monitor.handle_event(backend.inject_xid(1, 79))  # no change: nobody told
        assert len(every) == 1
        await backend.close()

    run_checked(scenario())


def test_probe_finds_a_lost_gpu_and_its_return_is_a_reset() -> None:
    async def scenario() -> None:
        backend, monitor, _ = await fake_monitor(fatal_effect=TaintEffect.NO_EXECUTE)
        backend.mark_lost(1)
        await monitor.probe_once()
        (lost,) = [d for d in monitor.devices() if d.status is not Status.HEALTHY]
        assert (lost.device_name, lost.reason, lost.fatal) == ("gpu-1", "gpu-lost", True)
        assert "GPU is lost: it has fallen off the bus" in lost.message
        assert monitor.taints()["gpu-1"][0]["effect"] == "NoExecute"
        await monitor.handle_event(backend.inject_xid(1, 79))
        backend.restore(1)
        await monitor.probe_once()
        assert {d.status for d in monitor.devices()} == {Status.HEALTHY}
        await backend.close()

    run_checked(scenario())


def test_fatal_xid_clears_when_the_gpu_is_reset() -> None:
    async def scenario() -> None:
        backend, monitor, clock = await fake_monitor()
        mig_gpu = (await backend.inventory()).gpus[2]
        await monitor.handle_event(backend.inject_xid(2, 48))
        sick = {d.device_name for d in monitor.devices() if d.status is Status.UNHEALTHY}
        assert sick and all(name.startswith("gpu-2-mig-") for name in sick)
        clock.now += 10 * RECOVERY
        await monitor.tick()
        assert {d.device_name for d in monitor.devices() if d.fatal} == sick  # no timeout
        assert backend.inject_reset(2) == mig_gpu.uuid
        await monitor.probe_once()  # resetting: unreachable for a moment
        assert {d.reason for d in monitor.devices() if d.device_name in sick} == {"xid-48"}
        await monitor.probe_once()  # back: the reset is seen
        assert {d.status for d in monitor.devices()} == {Status.HEALTHY}
        await backend.close()

    run_checked(scenario())


def test_probe_off_still_reports_every_30_seconds() -> None:
    async def scenario() -> None:
        backend, monitor = await probing_monitor("l4", probe_interval=0)
        assert (monitor.probe_enabled, monitor.interval, monitor.timeout_seconds) == (
            False,
            30.0,
            90,
        )
        backend.mark_lost(0)
        await monitor.check_once()  # no probe: nothing seen
        assert {d.status for d in monitor.devices()} == {Status.HEALTHY}
        await backend.close()

    run_checked(scenario())


def test_run_consumes_events_and_checks_periodically() -> None:
    async def scenario() -> None:
        backend, monitor = await probing_monitor("h100-80gb:2", probe_interval=0.02)
        task = asyncio.create_task(monitor.run())
        try:
            backend.inject(HealthEvent((await backend.inventory()).gpus[0].uuid, 95))
            await eventually(lambda: hub_health(monitor)["gpu-0"][0] is Health.UNHEALTHY, "XID")
            backend.mark_lost(1)
            await eventually(lambda: hub_health(monitor)["gpu-1"][0] is Health.UNHEALTHY, "probe")
            version = monitor.hub.snapshot()[0]
            await eventually(lambda: monitor.hub.snapshot()[0] > version + 2, "fresh reports")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await backend.close()

    run_checked(scenario())


# --- the kubelet's health streams over the real socket ----------------------------------


@pytest.mark.parametrize("version", ["v1alpha1", "v1"])
def test_health_stream_reports_xid_and_recovery(node_dirs: NodeDirs, version: str) -> None:
    async def scenario() -> None:
        async with serving(node_dirs, InMemoryClaimSource(), gpus="h100-80gb:3") as (
            runtime,
            plugin,
        ):
            backend = runtime.backend
            monitor = runtime.health_monitor
            assert isinstance(backend, FakeGpuBackend) and monitor is not None
            stream = plugin.watch_health(version)
            reports = await until_health(stream, "gpu-1", "Healthy")
            assert sorted(reports) == ["gpu-0", "gpu-1", "gpu-2"]
            assert {r.pool_name for r in reports.values()} == {NODE}
            assert {r.timeout_seconds for r in reports.values()} == {90}

            backend.inject_xid(1, 79, "GPU has fallen off the bus")
            reports = await until_health(stream, "gpu-1", "Unhealthy")
            assert reports["gpu-1"].message == (
                "xid-79: XID 79 (GPU has fallen off the bus) (needs a GPU reset)"
            )
            assert reports["gpu-1"].last_updated >= int(time.time()) - 5
            assert {reports[n].health for n in ("gpu-0", "gpu-2")} == {"Healthy"}

            backend.inject_reset(1)
            await monitor.probe_once()
            await monitor.probe_once()
            reports = await until_health(stream, "gpu-1", "Healthy")
            assert reports["gpu-1"].message == ""
            await stream.aclose()

    run_checked(scenario())


# --- device taints in the published ResourceSlices --------------------------------------


def ours(api: FakeKubeApi) -> list[dict[str, Any]]:
    return [s for s in api.objects("resourceslices") if s["spec"]["nodeName"] == NODE]


def generations(api: FakeKubeApi) -> set[int]:
    return {s["spec"]["pool"]["generation"] for s in ours(api)}


def taints_of(api: FakeKubeApi, device: str) -> list[dict[str, Any]]:
    for obj in ours(api):
        for found in obj["spec"].get("devices", ()):
            if found["name"] == device:
                return list(found.get("taints", ()))
    raise AssertionError(f"device {device} is not published")


async def published_again(publishing: SlicePublishing, trigger: Callable[[], object]) -> None:
    """Run ``trigger`` and wait for the publish it causes (changed or not)."""
    before = publishing.last_result
    trigger()
    await eventually(lambda: publishing.last_result is not before, "a publish")


@pytest.mark.parametrize("minor", [34, 36], ids=["k8s-1.34", "k8s-1.36"])
def test_taints_are_published_and_removed_with_generation_bumps(
    node_dirs: NodeDirs, minor: int
) -> None:
    async def scenario() -> None:
        with chart_api(kube_minor=minor) as api:  # the plugin as its ServiceAccount
            api.create(node_object(NODE))
            client = plugin_transport(api)
            publisher = SlicePublisher(client, driver_name=DRIVER, node_name=NODE)
            config = dataclasses.replace(
                node_dirs.config(), health=HealthSettings(fatal_effect=TaintEffect.NO_EXECUTE)
            )
            backend = FakeGpuBackend("h100-80gb:2", NODE)
            runtime = await start_plugin(
                PluginParts(
                    config,
                    backend,
                    InMemoryClaimSource(),
                    SliceOptions(
                        publisher, functools.partial(probe_capabilities, client, DRIVER, NODE)
                    ),
                )
            )
            try:
                publishing, monitor = runtime.publishing, runtime.health_monitor
                assert publishing is not None and monitor is not None
                await eventually(lambda: publishing.last_result is not None, "the first publish")
                assert generations(api) == {1}
                keeps_taints = minor >= 36

                await published_again(publishing, lambda: backend.inject_xid(0, 48))
                if keeps_taints:
                    assert generations(api) == {2}
                    (taint,) = taints_of(api, "gpu-0")
                    assert (taint["key"], taint["value"], taint["effect"]) == (
                        KEY,
                        "xid-48",
                        "NoExecute",
                    )
                    assert taint["timeAdded"]  # the server's
                else:  # 1.34: the cluster drops taints, so none are sent and nothing changes
                    assert generations(api) == {1} and taints_of(api, "gpu-0") == []
                assert taints_of(api, "gpu-1") == []

                # A republish for another reason (the kubelet registered us again) finds
                # nothing to write: the server's timeAdded is not a difference.
                stored = ours(api)
                await published_again(publishing, publishing.on_registered)
                assert ours(api) == stored

                backend.inject_reset(0)
                await monitor.probe_once()  # resetting: still the same taint
                await monitor.probe_once()  # back
                await eventually(lambda: taints_of(api, "gpu-0") == [], "the taint's removal")
                assert generations(api) == ({3} if keeps_taints else {1})
            finally:
                await runtime.stop()

    run_checked(scenario())


def test_server_set_taint_times_are_no_difference_and_are_kept() -> None:
    """A restarted publisher (nothing sent yet) finds the stored taints equal to its own,
    and rewriting a slice for another reason keeps each remaining taint's timeAdded."""
    old = "2020-01-01T00:00:00Z"

    async def scenario() -> None:
        with chart_api(kube_minor=36) as api:  # the plugin as its ServiceAccount
            node_uid = api.create(node_object(NODE))["metadata"]["uid"]
            client = plugin_transport(api)
            inventory = await FakeGpuBackend("h100-80gb:2", NODE).inventory()

            def desired(*tainted: str) -> list[Any]:
                taint = {"key": KEY, "value": "xid-48", "effect": "NoSchedule"}
                return build_slices(
                    inventory,
                    driver_name=DRIVER,
                    node_name=NODE,
                    settings=NodeSettings(),
                    capabilities=Capabilities.for_version(36),
                    taints={name: [taint] for name in tainted},
                )

            def publisher() -> SlicePublisher:
                return SlicePublisher(client, driver_name=DRIVER, node_name=NODE, node_uid=node_uid)

            first = publisher()
            assert (await first.publish(desired("gpu-0"))).generation == 1
            (stored,) = ours(api)
            stored["spec"]["devices"][0]["taints"][0]["timeAdded"] = old  # added long ago
            api.update(stored)

            restarted = publisher()
            again = await restarted.publish(desired("gpu-0"))
            assert not again.changed and again.generation == 1
            more = await restarted.publish(desired("gpu-0", "gpu-1"))
            assert more.updated and more.generation == 2
            assert taints_of(api, "gpu-0")[0]["timeAdded"] == old
            assert taints_of(api, "gpu-1")[0]["timeAdded"] != old

    run_checked(scenario())


def test_the_plugins_health_listeners_hear_changes(node_dirs: NodeDirs) -> None:
    async def scenario() -> None:
        heard: list[Sequence[DeviceHealth]] = []
        parts = node_dirs.parts(InMemoryClaimSource(), gpus="l4:2")
        parts = dataclasses.replace(parts, health_listeners=[heard.append])
        runtime = await start_plugin(parts)
        try:
            assert isinstance(runtime.backend, FakeGpuBackend)
            runtime.backend.inject_xid(1, 95)
            await eventually(lambda: heard, "the listener")
            assert [(d.device_name, d.reason, d.fatal) for d in heard[0]] == [
                ("gpu-1", "xid-95", True)
            ]
        finally:
            await runtime.stop()

    run_checked(scenario())
