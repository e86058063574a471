"""The per-namespace VRAM quota, end to end: the controller against the fake API."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    QUOTA,
    allocation_of,
    events_for,
    make_claim,
    make_namespace,
    make_pod,
    running,
    seed_cluster,
    set_quota,
    settled,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)
"""The controller runs as its ServiceAccount under the chart's RBAC."""


def cannot_allocate(api: FakeKubeApi, claim: str, namespace: str) -> list[str]:
    return [e["message"] for e in events_for(api, claim, "CannotAllocate", namespace)]


def claim_names(api: FakeKubeApi, namespace: str) -> list[str]:
    return [c["metadata"]["name"] for c in api.objects("ResourceClaim", namespace)]


def test_quota_refuses_with_an_event_and_a_raised_quota_allocates(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:2"})
    make_namespace(fake_kube, "team-a", "20Gi")
    make_claim(fake_kube, "c1", "10Gi", "team-a")
    make_claim(fake_kube, "c2", "15Gi", "team-a")
    make_claim(fake_kube, "other", "30Gi")  # namespace default: no quota, not charged

    async def scenario() -> None:
        # No periodic retry in this test: only the Namespace watch can bring c2 back.
        async with running(fake_kube, retry_unfit_s=600, resync_s=600) as controller:
            make_pod(fake_kube, "p1", "c1", "team-a")
            await eventually(lambda: allocation_of(fake_kube, "c1", "team-a") is not None)
            make_pod(fake_kube, "p2", "c2", "team-a")
            await eventually(lambda: cannot_allocate(fake_kube, "c2", "team-a"))
            make_pod(fake_kube, "p3", "other")
            await eventually(lambda: allocation_of(fake_kube, "other") is not None)
            await settled(controller)
            assert allocation_of(fake_kube, "c2", "team-a") is None
            set_quota(fake_kube, "team-a", "25Gi")
            await eventually(lambda: allocation_of(fake_kube, "c2", "team-a") is not None)

    asyncio.run(scenario())
    (message,) = set(cannot_allocate(fake_kube, "c2", "team-a"))
    assert message == (
        f"namespace team-a: VRAM quota 20Gi (annotation {QUOTA}) exceeded:"
        " 10Gi in use, 15Gi asked, 10Gi left"
    )


def test_the_assume_cache_is_charged_under_a_burst(fake_kube: FakeKubeApi) -> None:
    """With the claim watch a second behind, only the controller's own writes show what
    the namespace already holds: exactly quota / claim size claims are allocated."""
    seed_cluster(fake_kube, {"node-a": "h100-80gb:2", "node-b": "h100-80gb:2"})
    make_namespace(fake_kube, "team-a", "40Gi")
    names = [f"c{n}" for n in range(10)]
    for name in names:
        make_claim(fake_kube, name, "10Gi", "team-a")

    async def scenario() -> None:
        async with running(fake_kube, claim_watch_lag_s=1.0) as controller:
            for name in names:
                make_pod(fake_kube, f"p-{name}", name, "team-a")
            await eventually(
                lambda: sum(bool(cannot_allocate(fake_kube, n, "team-a")) for n in names) == 6
            )
            await settled(controller)

    asyncio.run(scenario())
    allocated = [n for n in names if allocation_of(fake_kube, n, "team-a") is not None]
    assert len(allocated) == 4, allocated


def test_claims_being_deleted_are_charged_until_their_allocation_is_gone(
    fake_kube: FakeKubeApi,
) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_namespace(fake_kube, "team-a", "20Gi")
    make_claim(fake_kube, "old", "10Gi", "team-a")
    make_claim(fake_kube, "new", "15Gi", "team-a")

    async def scenario() -> None:
        async with running(fake_kube, retry_unfit_s=600, resync_s=600) as controller:
            make_pod(fake_kube, "p-old", "old", "team-a")
            await eventually(lambda: allocation_of(fake_kube, "old", "team-a") is not None)
            fake_kube.delete("ResourceClaim", "old", "team-a")  # finalizer: only marked
            await settled(controller)
            make_pod(fake_kube, "p-new", "new", "team-a")
            await eventually(lambda: cannot_allocate(fake_kube, "new", "team-a"))
            await settled(controller)
            assert allocation_of(fake_kube, "new", "team-a") is None
            old = fake_kube.get("ResourceClaim", "old", "team-a")
            assert old["metadata"]["deletionTimestamp"]
            old["status"] = {}  # the claim's user is gone: the allocation is cleared
            fake_kube.update_status(old)
            # The controller removes its finalizer, the claim goes, and "new" fits.
            await eventually(lambda: claim_names(fake_kube, "team-a") == ["new"])
            await eventually(lambda: allocation_of(fake_kube, "new", "team-a") is not None)

    asyncio.run(scenario())
    assert "10Gi in use, 15Gi asked" in cannot_allocate(fake_kube, "new", "team-a")[0]


def test_a_malformed_quota_fails_the_claim_not_the_controller(fake_kube: FakeKubeApi) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_namespace(fake_kube, "team-b", "lots")
    make_claim(fake_kube, "c1", "10Gi", "team-b")
    make_claim(fake_kube, "fine", "10Gi")

    async def scenario() -> None:
        async with running(fake_kube, retry_unfit_s=600, resync_s=600) as controller:
            make_pod(fake_kube, "p1", "c1", "team-b")
            await eventually(lambda: cannot_allocate(fake_kube, "c1", "team-b"))
            make_pod(fake_kube, "p2", "fine")
            await eventually(lambda: allocation_of(fake_kube, "fine") is not None)
            await settled(controller)
            assert allocation_of(fake_kube, "c1", "team-b") is None
            set_quota(fake_kube, "team-b", "10Gi")
            await eventually(lambda: allocation_of(fake_kube, "c1", "team-b") is not None)

    asyncio.run(scenario())
    (message,) = set(cannot_allocate(fake_kube, "c1", "team-b"))
    assert message.startswith(f"claim not allocated: namespace team-b: annotation {QUOTA}='lots'")
    assert "expected a memory quantity in bytes such as 40Gi" in message
