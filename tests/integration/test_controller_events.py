"""The controller's Events wait behind its claim writes: in a burst the allocations land
first and the Events after (dra_driver/k8s/event_queue.py), and every Event lands."""

from __future__ import annotations

import asyncio

from tests.support.controller_env import (
    events_for,
    make_claim,
    make_pod,
    running,
    seed_cluster,
    settled,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

CLAIMS = 40
WRITE_DELAY_S = 0.05
"""Every write held this long: the claim writes of the burst overlap."""


def _answered(api: FakeKubeApi, method: str, suffix: str) -> list[float]:
    return [
        a.at
        for a in api.answer_log
        if a.request.method == method and a.request.path.endswith(suffix) and a.code < 300
    ]


def test_a_bursts_events_come_after_its_allocations() -> None:
    with FakeKubeApi(write_delay_s=WRITE_DELAY_S, validate_schema=False) as api:
        seed_cluster(api, {"node-a": "h100-80gb:8"})
        for i in range(CLAIMS):
            make_claim(api, f"c{i}", "10Gi")

        async def scenario() -> None:
            async with running(api, allocation_events=True) as controller:
                await settled(controller)  # the claims were seen, without pods
                for i in range(CLAIMS):
                    make_pod(api, f"p{i}", f"c{i}")
                await eventually(
                    lambda: len(_answered(api, "POST", "/events")) >= CLAIMS, timeout=30
                )
                assert controller.events.queue is not None
                assert controller.events.queue.dropped == 0

        asyncio.run(scenario())
        allocations = _answered(api, "PATCH", "/status")
        events = _answered(api, "POST", "/events")
        assert len(allocations) == CLAIMS
        assert min(events) >= max(allocations), "an Event was written before an allocation"
        assert all(events_for(api, f"c{i}", "Allocated") for i in range(CLAIMS))
