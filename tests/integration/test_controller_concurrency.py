"""The controller's writes are in flight side by side: a slow API server (every write
held 50 ms, each on its own connection's thread, as a slow etcd round trip) delays each
claim by its own round trips, not by those of every claim ahead of it.

One at a time, 100 claims of two writes and an Event each would take at least
100 x 3 x 50 ms = 15 s (10 s without the Events); with 32 claims in flight, the
allocations of 100 claims take a few round trips' worth.
"""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

from dra_driver.base.quantity import parse_quantity
from tests.support.controller_env import (
    allocation_of,
    make_claim,
    make_pod,
    running,
    seed_cluster,
    settled,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

WRITE_DELAY_S = 0.05
CLAIMS = 100
BUDGET_S = 3.0
"""Well under 100 x 50 ms (5 s for one write per claim, one claim at a time). A bound
with room for a loaded CI machine (about 1.3 s on two idle cores): what pins the
concurrency itself is :data:`MIN_WRITES_IN_FLIGHT`, which does not depend on speed."""
MIN_WRITES_IN_FLIGHT = 8
"""Writes the slow server must have held at one moment: one at a time would be 1."""
GPU_MEMORY = Fraction(81559 * 1024**2)  # the fake H100's


def _allocated(api: FakeKubeApi) -> list[dict[str, object]]:
    return [c for c in api.objects("ResourceClaim") if (c.get("status") or {}).get("allocation")]


def _allocations_written(api: FakeKubeApi) -> int:
    """Claims whose allocation the API server has answered (cheaper to poll than copying
    every claim out of the store, which would slow the run it measures)."""
    return len(
        {
            a.request.path
            for a in api.answer_log
            if a.request.method == "PATCH" and a.request.path.endswith("/status") and a.code == 200
        }
    )


def test_a_hundred_claims_on_a_slow_api_server_are_allocated_in_a_few_round_trips() -> None:
    # The schema check of each write is other tests' business: here it would only add
    # the fake's CPU (a millisecond a write, in this process) to what is measured.
    with FakeKubeApi(write_delay_s=WRITE_DELAY_S, validate_schema=False) as api:
        seed_cluster(api, {"node-a": "h100-80gb:8", "node-b": "h100-80gb:8"})
        for i in range(CLAIMS):
            make_claim(api, f"c{i}", "10Gi")
        took: list[float] = []

        async def scenario() -> None:
            async with running(api) as controller:
                await settled(controller)  # the claims were seen, without pods
                started = time.monotonic()
                for i in range(CLAIMS):
                    make_pod(api, f"p{i}", f"c{i}")
                await eventually(lambda: _allocations_written(api) >= CLAIMS, timeout=30)
                took.append(time.monotonic() - started)
                await settled(controller)

        asyncio.run(scenario())
        peak = api.peak_writes_in_flight
        assert peak >= MIN_WRITES_IN_FLIGHT, f"at most {peak} writes were in flight at once"
        assert took[0] < BUDGET_S, f"{CLAIMS} claims took {took[0]:.2f}s"
        # Correct as well as quick: no GPU given more than its memory, each claim two
        # writes (finalizer, allocation) and no re-read.
        used: dict[tuple[str, str], Fraction] = {}
        for claim in _allocated(api):
            (result,) = claim["status"]["allocation"]["devices"]["results"]  # type: ignore[index]
            key = (result["pool"], result["device"])
            used[key] = used.get(key, Fraction(0)) + parse_quantity(
                result["consumedCapacity"]["memory"]
            )
        assert all(v <= GPU_MEMORY for v in used.values()), used
        claim_requests = [(m, p) for m, p in api.requests if "/resourceclaims/" in p]
        assert len([r for r in claim_requests if r[0] == "PATCH"]) == 2 * CLAIMS
        assert not [r for r in claim_requests if r[0] == "GET"]
        assert all(allocation_of(api, f"c{i}") for i in range(CLAIMS))
