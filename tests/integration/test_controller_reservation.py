"""The controller's writes per pod: a claim that its pod owns (made from the pod's
ResourceClaimTemplate) is allocated and reserved for that pod in one ``/status`` write,
after the finalizer's, so the scheduler's PreBind has nothing left to write for it; no
``Allocated`` Event unless asked for; a claim shared by name is left to the scheduler
to reserve. Under the chart's RBAC (``resourceclaims/binding`` covers ``reservedFor``)."""

from __future__ import annotations

import asyncio
import json

import pytest

from dra_driver.controller.reconcile import FINALIZER
from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    JsonObj,
    allocation_of,
    events_for,
    make_claim,
    make_pod,
    running,
    seed_cluster,
    settled,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)


def _owned_by(api: FakeKubeApi, claim: str, pod: JsonObj) -> None:
    """Make ``claim`` the pod's own, as the controller manager makes a template's claim
    (an ownerReference with ``controller: true``)."""
    meta = pod["metadata"]
    api.patch(
        "ResourceClaim",
        claim,
        {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
            }
        },
        "default",
    )


def _claim_writes(api: FakeKubeApi) -> list[tuple[str, str, JsonObj]]:
    return [
        (r.method, r.path.rsplit("/resourceclaims/", 1)[1], json.loads(r.body))
        for r in api.request_log
        if r.method != "GET" and "/resourceclaims/" in r.path
    ]


def test_a_pods_own_claim_is_allocated_and_reserved_in_one_status_write(
    fake_kube: FakeKubeApi,
) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "p1-gpu", "10Gi")

    async def scenario() -> None:
        async with running(fake_kube) as controller:
            await settled(controller)
            fake_kube.clear_requests()
            # The pod first, then its claim's owner: as the controller manager creates
            # the claim after the pod, with the pod as its owner.
            pod = make_pod(fake_kube, "p1", "p1-gpu")
            _owned_by(fake_kube, "p1-gpu", pod)
            await eventually(lambda: allocation_of(fake_kube, "p1-gpu") is not None)
            await settled(controller)

    asyncio.run(scenario())
    pod = fake_kube.get("Pod", "p1", "default")["metadata"]
    claim = fake_kube.get("ResourceClaim", "p1-gpu", "default")
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "p1", "uid": pod["uid"]}]
    assert FINALIZER in claim["metadata"]["finalizers"]
    writes = _claim_writes(fake_kube)
    assert [(method, path) for method, path, _ in writes] == [
        ("PATCH", "p1-gpu"),  # the finalizer
        ("PATCH", "p1-gpu/status"),  # allocation and reservation together
    ], writes
    status = writes[1][2]["status"]
    assert set(status) == {"allocation", "reservedFor"}
    assert not events_for(fake_kube, "p1-gpu", "Allocated"), "no success Event by default"
    assert not [r for r in fake_kube.request_log if r.path.endswith("/events")]


def test_a_claim_named_by_pods_is_not_reserved_by_the_controller(fake_kube: FakeKubeApi) -> None:
    """Shared by ``resourceClaimName``: reserving it for every pending pod would hold it
    for pods that may never run; the scheduler reserves it as it binds each pod."""
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "shared", "10Gi")

    async def scenario() -> None:
        async with running(fake_kube) as controller:
            await settled(controller)
            make_pod(fake_kube, "p1", "shared")
            make_pod(fake_kube, "p2", "shared")
            await eventually(lambda: allocation_of(fake_kube, "shared") is not None)
            await settled(controller)

    asyncio.run(scenario())
    claim = fake_kube.get("ResourceClaim", "shared", "default")
    assert not claim["status"].get("reservedFor")


def test_the_allocated_event_when_asked_for(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "c1", "10Gi")

    async def scenario() -> None:
        async with running(fake_kube, allocation_events=True) as controller:
            await settled(controller)
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: bool(events_for(fake_kube, "c1", "Allocated")))

    asyncio.run(scenario())
    (event,) = events_for(fake_kube, "c1", "Allocated")
    assert "node-a" in event["message"]


def test_a_claim_that_fits_nowhere_still_gets_its_warning(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "huge", "500Gi")

    async def scenario() -> None:
        async with running(fake_kube) as controller:
            await settled(controller)
            make_pod(fake_kube, "p1", "huge")
            await eventually(lambda: bool(events_for(fake_kube, "huge", "CannotAllocate")))

    asyncio.run(scenario())
    assert allocation_of(fake_kube, "huge") is None
