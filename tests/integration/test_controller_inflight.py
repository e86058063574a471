"""A claim's in-flight record on the real write path (the controller against the fake API
server): an allocation write refused once (a conflict, the claim not found, the server
unavailable) is decided and written again, and afterwards nothing is held for it but
its allocation, counted once, in the kept allocator state and in one built anew."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.controller.inflight import Phase
from tests.support.controller_env import (
    GI,
    allocation_of,
    make_claim,
    make_pod,
    running,
    seed_cluster,
    settled,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

CAPACITY = 81559 * 1024**2
"""The fake H100's memory."""


@pytest.mark.parametrize("status", [409, 404, 503], ids=["conflict", "not-found", "unavailable"])
def test_a_refused_allocation_write_leaves_only_the_allocation_held(
    fake_kube: FakeKubeApi, status: int
) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    uid = make_claim(fake_kube, "c1", "10Gi")["metadata"]["uid"]
    fake_kube.fail_next("PATCH", "/resourceclaims/c1/status", status)

    async def scenario() -> None:
        async with running(fake_kube) as controller:
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: allocation_of(fake_kube, "c1") is not None)
            await settled(controller)
            caches = controller.caches
            inflight = caches.inflight
            await eventually(lambda: inflight.phase(uid) is Phase.ECHOED)
            assert not inflight.holds and not inflight.refused
            assert dict(inflight.written_nodes) == {uid: "node-a"}
            kept = sum(d.free for d in caches.ledger.state().free_memory())
            caches.ledger.invalidate()
            rebuilt = sum(d.free for d in caches.ledger.state().free_memory())
            assert kept == rebuilt == CAPACITY - 10 * GI

    asyncio.run(scenario())
    status_writes = [p for m, p in fake_kube.requests if m == "PATCH" and p.endswith("c1/status")]
    assert len(status_writes) == 2  # the refused one, then the one that landed
