"""Claim status and Events from the kubelet plugin: real prepare over the real socket,
claims read from and written to the fake API server over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dra_driver.app.plugin import Plugin, PluginConfig, PluginParts, start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName, GpuUUID
from dra_driver.core.claim_writes import check_entry
from dra_driver.core.health import DeviceHealth, Status
from dra_driver.core.model import HealthEvent
from dra_driver.core.prepare import ClaimOperation, PlannedDevice
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import KUBELET_DRA_SERVICES, FakeKubelet, RegisteredPlugin
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim, share
from dra_driver.k8s.claim_status import ClaimStatusWriter
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.transport import ApiTransport
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.claim_reporting import COMPONENT, ClaimReporter
from tests.support.clock import Clock
from tests.support.fakekube import FakeKubeApi
from tests.support.mps import agent_config, agent_running
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.planned import exclusive

pytestmark = pytest.mark.chart(())
"""The plugin runs as its ServiceAccount under the chart's RBAC and admission policies."""


@dataclasses.dataclass(frozen=True)
class HealthChange:
    """A device's new health as a monitor other than ours may say it (plain strings)."""

    device_name: str
    gpu_uuid: str
    status: str
    reason: str = ""
    message: str = ""


OTHER = "net.example.com"
GPU_0 = exclusive("gpu-0", pool=NODE, gpu="GPU-0")
"""gpu-0 of the node, whole, as a plan puts it."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A claim as the checkpoint remembers it: the shape the reporter is given."""

    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]


def reporter(
    api: ApiTransport,
    clock: Clock,
    *,
    status: bool = True,
    interval_s: float = 60,
    activity: CallActivity | None = None,
) -> ClaimReporter:
    events = EventRecorder(
        api, component=COMPONENT, instance=NODE, interval_s=interval_s, aggregate=True, clock=clock
    )
    writer = ClaimStatusWriter(api, driver_name=DRIVER, node_name=NODE, sleep=_no_sleep)
    return ClaimReporter(
        driver_name=DRIVER,
        node_name=NODE,
        status=writer if status else None,
        events=events,
        activity=activity,
    )


async def _no_sleep(_: float) -> None:
    return None


@contextlib.asynccontextmanager
async def plugin_with(
    dirs: NodeDirs, api: ApiTransport, observer: ClaimReporter
) -> AsyncIterator[tuple[Plugin, RegisteredPlugin]]:
    """A plugin on MPS-shared fake GPUs reading claims from the fake API, ``observer`` told,
    with its mps-agent (the fake MPS control daemon)."""
    claims = KubernetesClaimSource(api, request_timeout_s=5)
    parts = PluginParts(_mps_config(dirs), FakeGpuBackend("h100-80gb:2", NODE), claims)
    async with agent_running(agent_config(dirs)):
        runtime = await start_plugin(dataclasses.replace(parts, observers=[observer]))
        kubelet = FakeKubelet(dirs.registry, KUBELET_DRA_SERVICES)
        try:
            yield runtime, await kubelet.wait_for_plugin(DRIVER)
        finally:
            await kubelet.close()
            await runtime.stop()
            await observer.close()


@contextlib.asynccontextmanager
async def plugin_reporting_to(
    dirs: NodeDirs, api: ApiTransport, reporting: ClaimReporter
) -> AsyncIterator[tuple[Plugin, RegisteredPlugin]]:
    """A plugin wired as ``dra-driver kubelet-plugin`` wires it: ``reporting`` given to
    the plugin, so it hears the health monitor as well as the driver."""
    claims = KubernetesClaimSource(api, request_timeout_s=5)
    parts = PluginParts(
        _mps_config(dirs), FakeGpuBackend("h100-80gb:2", NODE), claims, reporting=reporting
    )
    async with agent_running(agent_config(dirs)):
        runtime = await start_plugin(parts)
        kubelet = FakeKubelet(dirs.registry, KUBELET_DRA_SERVICES)
        try:
            yield runtime, await kubelet.wait_for_plugin(DRIVER)
        finally:
            await kubelet.close()
            await runtime.stop()  # closes the reporter too


def _mps_config(dirs: NodeDirs) -> PluginConfig:
    """MPS-shared GPUs whose shares go to the agent of :func:`agent_config`."""
    return dataclasses.replace(
        dirs.config(),
        settings=NodeSettings(default=GpuSettings(Sharing.MPS)),
        mps_agent_socket=os.path.join(dirs.plugin, "mps-agent.sock"),
    )


def devices_of(fake: FakeKubeApi, name: str) -> list[dict[str, Any]]:
    status: dict[str, Any] = fake.get("ResourceClaim", name, "default").get("status") or {}
    devices: list[dict[str, Any]] = status.get("devices") or []
    return devices


def keys(devices: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    return [(d["driver"], d["pool"], d["device"], d.get("shareID", "")) for d in devices]


def conditions(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in entry["conditions"]}


def events_on(fake: FakeKubeApi, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in fake.objects("Event")
        if (e["involvedObject"]["kind"], e["involvedObject"]["name"]) == (kind, name)
    ]


def test_prepare_writes_status_devices_and_unprepare_removes_them(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    a = share("gpu-0", memory="10Gi", compute_percent=25)
    b = share("gpu-0", memory="20Gi")
    obj = resource_claim(
        "default", "two", devices=[a, b, Allocated("eth0", driver=OTHER, pool="net-pool")]
    )
    other_entry = {"driver": OTHER, "pool": "net-pool", "device": "eth0", "data": {"ip": "x"}}
    obj["status"]["devices"] = [other_entry]
    fake_kube.create(obj)
    whole = fake_kube.create(resource_claim("default", "whole", devices=[Allocated("gpu-1")]))
    observer = reporter(api, Clock())

    async def scenario() -> None:
        async with plugin_with(node_dirs, api, observer) as (_, plugin):
            results = await plugin.prepare([claim_ref(obj), claim_ref(whole)])
            assert not any(r.error for r in results.values()), results
            assert await observer.flush()
            written = devices_of(fake_kube, "two")
            assert written[0] == other_entry
            assert keys(written[1:]) == sorted(
                [
                    (DRIVER, NODE, "gpu-0", a.share_id or ""),
                    (DRIVER, NODE, "gpu-0", b.share_id or ""),
                ],
                key=lambda k: k[3],
            )
            by_share = {d["shareID"]: d for d in written[1:]}
            assert by_share[a.share_id]["data"]["memoryLimitBytes"] == 10 * 2**30
            assert by_share[a.share_id]["data"]["computePercent"] == 25
            assert by_share[b.share_id]["data"]["memoryLimit"] == "20Gi"
            for entry in written[1:]:
                assert check_entry(entry) == []
                assert conditions(entry)["Ready"]["status"] == "True"
                assert entry["data"]["mode"] == "mps"
            (exclusive,) = devices_of(fake_kube, "whole")
            assert keys([exclusive]) == [(DRIVER, NODE, "gpu-1", "")]
            assert exclusive["data"]["mode"] == "exclusive"

            # A repeated prepare writes nothing new.
            fake_kube.clear_requests()
            await plugin.prepare([claim_ref(obj)])
            assert await observer.flush()
            assert not [r for r in fake_kube.requests if r[0] == "PATCH"]

            await plugin.unprepare([claim_ref(obj), claim_ref(whole)])
            assert await observer.flush()
            assert devices_of(fake_kube, "two") == [other_entry]
            assert devices_of(fake_kube, "whole") == []

    run_checked(scenario())
    assert not fake_kube.objects("Event")


def test_overcommit_refusal_is_one_warning_event_counted_on_repeats(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    ok = fake_kube.create(resource_claim("default", "ok", devices=[share("gpu-0", memory="60Gi")]))
    big = fake_kube.create(
        resource_claim("default", "big", devices=[share("gpu-0", memory="60Gi")])
    )
    clock = Clock()
    observer = reporter(api, clock)

    async def scenario() -> None:
        async with plugin_with(node_dirs, api, observer) as (_, plugin):
            await plugin.prepare([claim_ref(ok)])
            for _ in range(3):  # the kubelet retries
                result = await plugin.prepare([claim_ref(big)])
                assert result[claim_ref(big).uid].error
            assert await observer.flush()
            (event,) = events_on(fake_kube, "ResourceClaim", "big")
            assert event["count"] == 1
            clock.now += 61
            await plugin.prepare([claim_ref(big)])
            assert await observer.flush()
            assert devices_of(fake_kube, "big") == []

    run_checked(scenario())
    (event,) = events_on(fake_kube, "ResourceClaim", "big")
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "Overcommit", 2)
    assert event["involvedObject"]["uid"] == big["metadata"]["uid"]
    assert event["reportingComponent"] == COMPONENT
    assert event["reportingInstance"] == NODE
    message = event["message"]
    assert f"prepare on node {NODE} failed" in message
    assert "gpu-0" in message and "1 share(s) already prepared" in message
    assert "60Gi" in message  # what is prepared and what was asked
    assert not events_on(fake_kube, "ResourceClaim", "ok")


def test_forbidden_status_write_warns_once_and_prepare_still_works(
    fake_kube: FakeKubeApi,
    api: ApiTransport,
    node_dirs: NodeDirs,
    caplog: pytest.LogCaptureFixture,
) -> None:
    claims = [
        fake_kube.create(resource_claim("default", f"c{n}", devices=[share("gpu-0")]))
        for n in range(3)
    ]
    fake_kube.fail_next("PATCH", "/status", 403)
    observer = reporter(api, Clock())

    async def scenario() -> None:
        async with plugin_with(node_dirs, api, observer) as (_, plugin):
            for claim in claims:
                result = await plugin.prepare([claim_ref(claim)])
                assert not result[claim_ref(claim).uid].error
                assert await observer.flush()
            await plugin.unprepare([claim_ref(c) for c in claims])
            assert await observer.flush()

    with caplog.at_level(logging.WARNING):
        run_checked(scenario())
    assert [r for r in fake_kube.requests if r[0] == "PATCH"] == [
        ("PATCH", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c0/status")
    ]
    warnings = [r for r in caplog.records if "forbidden" in r.getMessage()]
    assert len(warnings) == 1
    assert all(devices_of(fake_kube, c["metadata"]["name"]) == [] for c in claims)


def test_status_off_still_records_events(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    bad = fake_kube.create(
        resource_claim("default", "elsewhere", node="node-b", devices=[share("gpu-0")])
    )
    observer = reporter(api, Clock(), status=False)

    async def scenario() -> None:
        async with plugin_with(node_dirs, api, observer) as (_, plugin):
            await plugin.prepare([claim_ref(bad)])
            await plugin.prepare([ClaimRef("default", "missing", ClaimUID("nope"))])
            assert await observer.flush()

    run_checked(scenario())
    assert not [r for r in fake_kube.requests if r[0] == "PATCH"]
    (event,) = fake_kube.objects("Event")  # none for the claim that does not exist
    assert (event["reason"], event["involvedObject"]["name"]) == ("ClaimNotOnNode", "elsewhere")


def test_health_change_events_on_node_and_claims_and_conditions(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    on_gpu0 = fake_kube.create(resource_claim("default", "a", devices=[share("gpu-0")]))
    on_gpu1 = fake_kube.create(resource_claim("default", "b", devices=[Allocated("gpu-1")]))
    clock = Clock()
    observer = reporter(api, clock)

    async def scenario() -> None:
        async with plugin_with(node_dirs, api, observer) as (runtime, plugin):
            await plugin.prepare([claim_ref(on_gpu0), claim_ref(on_gpu1)])
            assert await observer.flush()
            assert runtime.inventory is not None
            uuid = runtime.inventory.gpus[0].uuid
            sick = HealthChange("gpu-0", uuid, "Unhealthy", "XidError", "XID 79")
            observer.device_health_changed(sick)
            observer.device_health_changed(sick)  # the same report again: nothing new
            assert await observer.flush()
            (entry,) = devices_of(fake_kube, "a")
            health = conditions(entry)["DeviceHealthy"]
            assert (health["status"], health["reason"], health["message"]) == (
                "False",
                "XidError",
                "XID 79",
            )
            assert conditions(entry)["Ready"]["status"] == "True"
            (other,) = devices_of(fake_kube, "b")
            assert conditions(other)["DeviceHealthy"]["status"] == "Unknown"
            # Flapping within the interval: the Unhealthy Event is not written again.
            observer.device_health_changed(HealthChange("gpu-0", uuid, "Healthy"))
            observer.device_health_changed(sick)
            assert await observer.flush()

    run_checked(scenario())
    node_events = events_on(fake_kube, "Node", NODE)
    assert sorted((e["reason"], e["type"], e["count"]) for e in node_events) == [
        ("DeviceHealthy", "Normal", 1),
        ("DeviceUnhealthy", "Warning", 1),
    ]
    unhealthy = next(e for e in node_events if e["reason"] == "DeviceUnhealthy")
    assert unhealthy["metadata"]["namespace"] == "default"
    assert "namespace" not in unhealthy["involvedObject"]
    assert "gpu-0" in unhealthy["message"] and "XidError: XID 79" in unhealthy["message"]
    claim_events = events_on(fake_kube, "ResourceClaim", "a")
    assert sorted(e["reason"] for e in claim_events) == ["DeviceHealthy", "DeviceUnhealthy"]
    assert not events_on(fake_kube, "ResourceClaim", "b")


def test_device_healthy_is_known_from_the_first_prepare(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    """Devices are healthy unless a fault says otherwise, without waiting for a change.

    gpu-0 never had a problem: its claim's DeviceHealthy is True at once (not
    Unknown/NotReported); gpu-1 had an XID before the prepare: False. No Event
    for the healthy device (nothing happened to it).
    """
    fine = fake_kube.create(resource_claim("default", "fine", devices=[share("gpu-0")]))
    sick = fake_kube.create(resource_claim("default", "sick", devices=[Allocated("gpu-1")]))
    observer = reporter(api, Clock())

    async def scenario() -> None:
        async with plugin_reporting_to(node_dirs, api, observer) as (runtime, plugin):
            assert runtime.inventory is not None and runtime.health_monitor is not None
            gpu1 = runtime.inventory.gpus[1].uuid
            await runtime.health_monitor.handle_event(HealthEvent(gpu1, 79, "fell off the bus"))
            results = await plugin.prepare([claim_ref(fine), claim_ref(sick)])
            assert not any(r.error for r in results.values()), results
            assert await observer.flush()
            (entry,) = devices_of(fake_kube, "fine")
            health = conditions(entry)["DeviceHealthy"]
            assert (health["status"], health["reason"]) == ("True", "Healthy")
            assert check_entry(entry) == []
            (other,) = devices_of(fake_kube, "sick")
            health = conditions(other)["DeviceHealthy"]
            assert (health["status"], health["reason"]) == ("False", "Xid79")

    run_checked(scenario())
    assert [e["reason"] for e in events_on(fake_kube, "Node", NODE)] == ["DeviceUnhealthy"]
    assert not events_on(fake_kube, "ResourceClaim", "fine")


def test_health_change_for_claims_prepared_before_a_restart(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """Claims the monitor passes in (from the checkpoint) are told too."""
    obj = fake_kube.create(resource_claim("default", "old", devices=[Allocated("gpu-0")]))

    observer = reporter(api, Clock())

    async def scenario() -> None:
        # Named by GPU only: every device of that GPU.
        change = HealthChange("", "GPU-0", "unknown", "", "lost contact")
        observer.device_health_changed(change, [Prepared(claim_ref(obj), (GPU_0,))])
        assert await observer.flush()
        await observer.close()

    run_checked(scenario())
    (entry,) = devices_of(fake_kube, "old")
    health = conditions(entry)["DeviceHealthy"]
    assert (health["status"], health["reason"], health["message"]) == (
        "Unknown",
        "Unknown",
        "lost contact",
    )
    (node_event,) = events_on(fake_kube, "Node", NODE)
    assert node_event["reason"] == "DeviceHealthUnknown"
    assert "every device (GPU GPU-0)" in node_event["message"]


def test_prepare_then_quick_unprepare_leaves_nothing(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """Status writes of one claim are applied in order, the newest wanted state last."""
    obj = fake_kube.create(resource_claim("default", "c", devices=[Allocated("gpu-0")]))
    ref = claim_ref(obj)
    observer = reporter(api, Clock())

    async def scenario() -> None:
        for _ in range(3):
            observer.claim_done(ClaimOperation("prepare", ref, 0.01, devices=(GPU_0,)))
            observer.claim_done(ClaimOperation("unprepare", ref, 0.01))
        assert await observer.flush()
        await observer.close()

    run_checked(scenario())
    assert devices_of(fake_kube, "c") == []
    assert len([r for r in fake_kube.requests if r[0] == "PATCH"]) <= 2


def status_patches(fake: FakeKubeApi) -> int:
    return len([r for r in fake.requests if r[0] == "PATCH" and r[1].endswith("/status")])


def test_status_writes_wait_for_the_calls_in_flight(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """A claim answered while others of its wave are still being prepared gets its
    status written once the wave is answered, not while it competes with them."""
    obj = fake_kube.create(resource_claim("default", "c", devices=[Allocated("gpu-0")]))
    activity = CallActivity()
    observer = reporter(api, Clock(), activity=activity)

    async def scenario() -> None:
        with activity.call():
            observer.claim_done(ClaimOperation("prepare", claim_ref(obj), 0.01, devices=(GPU_0,)))
            await asyncio.sleep(0.3)
            assert status_patches(fake_kube) == 0
        assert await observer.flush()
        assert status_patches(fake_kube) == 1
        await observer.close()

    run_checked(scenario())
    assert keys(devices_of(fake_kube, "c")) == [(DRIVER, NODE, "gpu-0", "")]


def test_a_node_that_never_rests_still_gets_its_status_written(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    obj = fake_kube.create(resource_claim("default", "c", devices=[Allocated("gpu-0")]))
    activity = CallActivity(max_wait_s=0.2)
    observer = reporter(api, Clock(), activity=activity)

    async def scenario() -> None:
        with activity.call():
            observer.claim_done(ClaimOperation("prepare", claim_ref(obj), 0.01, devices=(GPU_0,)))
            assert await observer.flush(timeout_s=3)
            assert status_patches(fake_kube) == 1
        await observer.close()

    run_checked(scenario())


def test_the_health_models_device_health_is_a_change(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """core.health.DeviceHealth (the health monitor's) is accepted as it is."""
    obj = fake_kube.create(resource_claim("default", "c", devices=[Allocated("gpu-0")]))
    observer = reporter(api, Clock())
    change = DeviceHealth(
        DeviceName("gpu-0"), GpuUUID("GPU-0"), Status.UNHEALTHY, "xid-79", "XID 79: fell off"
    )

    async def scenario() -> None:
        observer.claim_done(ClaimOperation("prepare", claim_ref(obj), 0.01, devices=(GPU_0,)))
        observer.device_health_changed(change)
        assert await observer.flush()
        await observer.close()

    run_checked(scenario())
    (entry,) = devices_of(fake_kube, "c")
    health = conditions(entry)["DeviceHealthy"]
    assert (health["status"], health["reason"]) == ("False", "Xid79")
    assert [e["reason"] for e in events_on(fake_kube, "ResourceClaim", "c")] == ["DeviceUnhealthy"]


def test_first_healthy_report_updates_conditions_without_events(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """As a health monitor listener: claims remembered from the checkpoint are told."""
    obj = fake_kube.create(resource_claim("default", "c", devices=[Allocated("gpu-0")]))

    observer = reporter(api, Clock())
    observer.remember([Prepared(claim_ref(obj), (GPU_0,))])
    healthy = DeviceHealth(DeviceName("gpu-0"), GpuUUID("GPU-0"), Status.HEALTHY)
    other = DeviceHealth(DeviceName("gpu-1"), GpuUUID("GPU-1"), Status.HEALTHY)

    async def scenario() -> None:
        observer.devices_health_changed([healthy, other])
        assert await observer.flush()
        await observer.close()

    run_checked(scenario())
    (entry,) = devices_of(fake_kube, "c")
    assert conditions(entry)["DeviceHealthy"]["status"] == "True"
    assert not fake_kube.objects("Event")
