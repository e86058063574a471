"""Event recorder and claim status writer (dra_driver/k8s) against the fake API over HTTP."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.fakes.objects import Allocated, resource_claim
from dra_driver.k8s.claim_status import (
    ApplyResult,
    ClaimStatusWriter,
    apply_body,
    dropped_by_server,
    field_manager,
)
from dra_driver.k8s.events import EventRecorder, InvolvedObject, event_object
from dra_driver.k8s.transport import ApiTransport
from tests.support.clock import Clock
from tests.support.fakekube import FakeKubeApi
from tests.support.node import run_checked
from tests.support.transport import transport_to

DRIVER = "gpu.fractional.dev"
NODE = "node-a"
STATUS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1/status"
REF = ClaimRef("default", "c1", ClaimUID("uid-1"))

pytestmark = pytest.mark.chart(())
"""Events and claim status as the plugin writes them: its ServiceAccount, the chart's
RBAC and admission policies."""


def recorder(api: ApiTransport, clock: Clock, **kw: Any) -> EventRecorder:
    return EventRecorder(
        api, component="fractional-gpu-dra-kubelet-plugin", instance=NODE, clock=clock, **kw
    )


def events(fake: FakeKubeApi) -> list[dict[str, Any]]:
    return fake.objects("Event")


# --- Events ----------------------------------------------------------------------------


def test_event_on_a_claim_and_on_a_node() -> None:
    claim = event_object(
        InvolvedObject.claim(REF), "Overcommit", "m" * 2000, "Warning", "T", component="c"
    )
    assert claim["metadata"]["namespace"] == "default"
    assert claim["involvedObject"] == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "name": "c1",
        "namespace": "default",
        "uid": "uid-1",
    }
    assert len(claim["message"]) == 1024
    assert "reportingInstance" not in claim
    node = event_object(
        InvolvedObject.node("n" * 253), "DeviceUnhealthy", "x", "Warning", "T",
        component="c", instance="i" * 300,
    )  # fmt: skip
    assert node["metadata"]["namespace"] == "default"
    assert "namespace" not in node["involvedObject"]
    assert node["involvedObject"]["uid"] == "n" * 253
    assert len(node["metadata"]["name"]) <= 253
    assert len(node["reportingInstance"]) == 128
    assert node["source"] == {"component": "c", "host": "i" * 300}


def test_rate_limit_and_aggregation(fake_kube: FakeKubeApi, api: ApiTransport) -> None:
    clock = Clock()
    rec = recorder(api, clock, interval_s=60, aggregate=True)
    node = InvolvedObject.node(NODE)

    async def scenario() -> None:
        for _ in range(3):
            await rec.record(node, "DeviceUnhealthy", "gpu-0 is unhealthy", "Warning")
        clock.now += 61
        await rec.record(node, "DeviceUnhealthy", "gpu-0 is unhealthy", "Warning")
        await rec.record(node, "DeviceHealthy", "gpu-0 is healthy")  # another reason: written

    run_checked(scenario())
    got = sorted(events(fake_kube), key=lambda e: e["reason"])
    assert [(e["reason"], e["count"], e["type"]) for e in got] == [
        ("DeviceHealthy", 1, "Normal"),
        ("DeviceUnhealthy", 2, "Warning"),
    ]
    unhealthy = got[1]
    assert unhealthy["reportingComponent"] == "fractional-gpu-dra-kubelet-plugin"
    assert unhealthy["reportingInstance"] == NODE
    assert unhealthy["involvedObject"]["kind"] == "Node"
    assert [m for m, _ in fake_kube.requests].count("PATCH") == 1


def test_an_expired_event_is_written_again(fake_kube: FakeKubeApi, api: ApiTransport) -> None:
    clock = Clock()
    rec = recorder(api, clock, interval_s=1, aggregate=True)
    claim = InvolvedObject.claim(REF)

    async def scenario() -> None:
        await rec.record(claim, "Overcommit", "full", "Warning")
        (first,) = events(fake_kube)
        fake_kube.delete("Event", first["metadata"]["name"], "default")
        clock.now += 2
        await rec.record(claim, "Overcommit", "full", "Warning")

    run_checked(scenario())
    (second,) = events(fake_kube)
    assert second["count"] == 1


def test_forbidden_patch_turns_aggregation_off(
    fake_kube: FakeKubeApi, api: ApiTransport, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    rec = recorder(api, clock, interval_s=1, aggregate=True)
    claim = InvolvedObject.claim(REF)

    async def scenario() -> None:
        await rec.record(claim, "Overcommit", "full", "Warning")
        fake_kube.fail_next("PATCH", "/events/", 403)
        clock.now += 2
        await rec.record(claim, "Overcommit", "full", "Warning")
        clock.now += 2
        await rec.record(claim, "Overcommit", "full", "Warning")

    run_checked(scenario())
    assert len(events(fake_kube)) == 3
    assert [m for m, _ in fake_kube.requests] == ["POST", "PATCH", "POST", "POST"]
    assert "verb patch on events" in caplog.text


def test_forbidden_create_is_logged_once_and_stops_events(
    fake_kube: FakeKubeApi, api: ApiTransport, caplog: pytest.LogCaptureFixture
) -> None:
    rec = recorder(api, Clock())
    fake_kube.fail_next("POST", "/events", 403, times=5)

    async def scenario() -> None:
        with caplog.at_level(logging.WARNING, logger="dra_driver.k8s.events"):
            for n in range(3):
                rec.emit(InvolvedObject.claim(REF), "Overcommit", f"full {n}", "Warning")
                await rec.flush()

    run_checked(scenario())
    assert not rec.enabled
    assert len(fake_kube.requests) == 1
    forbidden = [r for r in caplog.records if "forbidden" in r.getMessage()]
    assert len(forbidden) == 1
    assert 'resources: ["events"]' in forbidden[0].getMessage()


def test_other_failures_are_logged_and_dropped(
    fake_kube: FakeKubeApi, api: ApiTransport, caplog: pytest.LogCaptureFixture
) -> None:
    rec = recorder(api, Clock())
    fake_kube.fail_next("POST", "/events", 500)

    async def scenario() -> None:
        await rec.record(InvolvedObject.claim(REF), "Overcommit", "a", "Warning")
        await rec.record(InvolvedObject.claim(REF), "Overcommit", "b", "Warning")

    run_checked(scenario())
    assert rec.enabled
    assert [e["message"] for e in events(fake_kube)] == ["b"]
    assert "could not write Event Overcommit" in caplog.text


def test_emit_never_blocks_and_bounds_what_is_in_flight(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    rec = recorder(api, Clock(), max_in_flight=2)

    async def scenario() -> None:
        for n in range(5):
            rec.emit(InvolvedObject.claim(REF), "Overcommit", f"m{n}", "Warning")
        assert not fake_kube.requests  # nothing written before the loop runs the tasks
        assert await rec.flush()
        await rec.close()

    run_checked(scenario())
    assert sorted(e["message"] for e in events(fake_kube)) == ["m0", "m1"]


def test_controller_wrapper_keeps_its_api(fake_kube: FakeKubeApi, api: ApiTransport) -> None:
    from dra_driver.controller.events import COMPONENT, ClaimEventRecorder
    from dra_driver.controller.events import event_object as controller_event

    claim = resource_claim("default", "c1", uid="uid-1")
    claim["metadata"]["resourceVersion"] = "7"
    obj = controller_event(claim, "Allocated", "ok", "Normal", "T")
    assert obj["involvedObject"]["resourceVersion"] == "7"
    assert obj["source"] == {"component": COMPONENT}
    clock = Clock()
    ctl = ClaimEventRecorder(api, interval_s=60, clock=clock)
    assert ctl.should_send(claim, "CannotAllocate", "x")
    assert not ctl.should_send(claim, "CannotAllocate", "x")
    run_checked(ctl.record(claim, "Allocated", "gpu-0"))
    (event,) = events(fake_kube)
    assert (event["reason"], event["involvedObject"]["uid"]) == ("Allocated", "uid-1")


# --- claim status writer ---------------------------------------------------------------


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def writer(api: ApiTransport, sleeps: Sleeps | None = None) -> ClaimStatusWriter:
    return ClaimStatusWriter(
        api, driver_name=DRIVER, node_name=NODE, sleep=sleeps or Sleeps(), backoff_s=0.5
    )


def ours(device: str = "gpu-0") -> dict[str, Any]:
    return {"driver": DRIVER, "pool": NODE, "device": device}


@pytest.fixture
def claim(fake_kube: FakeKubeApi) -> dict[str, Any]:
    return fake_kube.create(resource_claim("default", "c1", uid="uid-1"))


def test_apply_sends_server_side_apply(
    fake_kube: FakeKubeApi, api: ApiTransport, claim: dict[str, Any]
) -> None:
    assert run_checked(writer(api).apply(REF, [ours()])) is ApplyResult.WRITTEN
    (request,) = fake_kube.request_log
    assert (request.method, request.path) == ("PATCH", STATUS)
    assert request.content_type == "application/apply-patch+yaml"
    assert request.query["fieldManager"] == [f"{DRIVER}/{NODE}"]
    assert request.query["force"] == ["true"]
    devices = fake_kube.get("ResourceClaim", "c1", "default")["status"]["devices"]
    assert devices == [ours()]
    assert run_checked(writer(api).apply(REF, [])) is ApplyResult.WRITTEN
    assert "devices" not in fake_kube.get("ResourceClaim", "c1", "default")["status"]


def test_conflicts_and_unavailability_are_retried_with_backoff(
    fake_kube: FakeKubeApi, api: ApiTransport, claim: dict[str, Any]
) -> None:
    sleeps = Sleeps()
    fake_kube.fail_next("PATCH", "/status", 409)
    fake_kube.fail_next("PATCH", "/status", 500)
    assert run_checked(writer(api, sleeps).apply(REF, [ours()])) is ApplyResult.WRITTEN
    assert sleeps.calls == [0.5, 1.0]
    fake_kube.fail_next("PATCH", "/status", 503, times=4)
    assert run_checked(writer(api, sleeps).apply(REF, [ours()])) is ApplyResult.FAILED


@pytest.mark.parametrize(
    ("status", "result"),
    [(404, ApplyResult.GONE), (422, ApplyResult.REFUSED), (400, ApplyResult.REFUSED)],
)
def test_permanent_failures_are_not_retried(
    fake_kube: FakeKubeApi,
    api: ApiTransport,
    claim: dict[str, Any],
    status: int,
    result: ApplyResult,
) -> None:
    fake_kube.fail_next("PATCH", "/status", status)
    w = writer(api)
    assert run_checked(w.apply(REF, [ours()])) is result
    assert len(fake_kube.requests) == 1
    assert w.enabled


def test_a_replaced_claim_is_refused(fake_kube: FakeKubeApi, api: ApiTransport) -> None:
    fake_kube.create(resource_claim("default", "c1", uid="uid-2"))
    assert run_checked(writer(api).apply(REF, [ours()])) is ApplyResult.REFUSED
    assert "devices" not in fake_kube.get("ResourceClaim", "c1", "default")["status"]


def test_forbidden_is_logged_once_with_the_fix(
    fake_kube: FakeKubeApi,
    api: ApiTransport,
    claim: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = writer(api)
    fake_kube.fail_next("PATCH", "/status", 403)

    async def scenario() -> list[ApplyResult]:
        return [await w.apply(REF, [ours()]) for _ in range(3)]

    with caplog.at_level(logging.WARNING, logger="dra_driver.k8s.claim_status"):
        assert run_checked(scenario()) == [ApplyResult.DISABLED] * 3
    assert len(fake_kube.requests) == 1
    (record,) = caplog.records
    for fix in ("resourceclaims/status", "associated-node:patch", DRIVER, "--claim-status=off"):
        assert fix in record.getMessage()


def test_dropped_status_devices_are_detected() -> None:
    assert dropped_by_server(DRIVER, [ours()], {"status": {}})
    assert dropped_by_server(DRIVER, [ours()], {"status": {"devices": [{"driver": "other"}]}})
    assert not dropped_by_server(DRIVER, [ours()], {"status": {"devices": [ours()]}})
    assert not dropped_by_server(DRIVER, [], {"status": {}})


def test_field_manager_and_body() -> None:
    assert field_manager(DRIVER, "n" * 300) == f"{DRIVER}/{'n' * 300}"[:128]
    body = apply_body(REF, [ours()])
    assert body["metadata"] == {"name": "c1", "namespace": "default", "uid": "uid-1"}
    assert set(body) == {"apiVersion", "kind", "metadata", "status"}
    assert body["status"] == {"devices": [ours()]}


def test_writer_keeps_other_drivers_entries(fake_kube: FakeKubeApi, api: ApiTransport) -> None:
    other = {"driver": "net.example.com", "pool": NODE, "device": "eth0", "data": {"ip": "x"}}
    obj = resource_claim(
        "default",
        "c1",
        uid="uid-1",
        devices=[Allocated("gpu-0"), Allocated("eth0", driver="net.example.com")],
    )
    obj["status"]["devices"] = [other]
    fake_kube.create(obj)
    w = writer(api)
    assert run_checked(w.apply(REF, [ours()])) is ApplyResult.WRITTEN
    assert fake_kube.get("ResourceClaim", "c1", "default")["status"]["devices"] == [other, ours()]
    assert run_checked(w.apply(REF, [])) is ApplyResult.WRITTEN
    assert fake_kube.get("ResourceClaim", "c1", "default")["status"]["devices"] == [other]


def test_status_writes_go_two_at_a_time(fake_kube: FakeKubeApi) -> None:
    """A wave's writes all become due at once; at most ``max_in_flight`` are sent
    together."""
    running, most = [0], [0]

    async def slow_patch(ref: ClaimRef, entries: Any) -> dict[str, Any]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        await asyncio.sleep(0.02)
        running[0] -= 1
        return {"status": {"devices": list(entries)}}

    api = transport_to(fake_kube.url)
    writer = ClaimStatusWriter(api, driver_name=DRIVER, node_name="node-a", max_in_flight=2)
    writer._patch = slow_patch  # type: ignore[method-assign]
    refs = [ClaimRef("default", f"c{i}", ClaimUID(f"uid-{i}")) for i in range(6)]

    async def wave() -> list[ApplyResult]:
        return list(await asyncio.gather(*(writer.apply(r, []) for r in refs)))

    assert asyncio.run(wave()) == [ApplyResult.WRITTEN] * 6
    assert most[0] == 2
