"""The controller's Prometheus endpoint, scraped over real HTTP after real allocations."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.app.controller import run_controller
from dra_driver.controller.metrics import PREFIX
from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    GI,
    controller_client,
    controller_config,
    make_claim,
    make_namespace,
    make_pod,
    seed_cluster,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)
"""The controller runs as its ServiceAccount under the chart's RBAC."""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
H100_SHAREABLE = 81559 * 2**20
"""What the fake H100 offers shares (its slices' ``memoryUsable``)."""


@pytest.fixture
def free_port() -> Iterator[int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    yield port


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((f"{PREFIX}_{name}", tuple(sorted(labels.items()))))


def test_metrics_endpoint_after_allocations(fake_kube: FakeKubeApi, free_port: int) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:2"})
    make_namespace(fake_kube, "team-a", "20Gi")
    for name, memory in (("c1", "10Gi"), ("c2", "20Gi"), ("c3", "30Gi")):
        make_claim(fake_kube, name, memory)
    make_claim(fake_kube, "over", "30Gi", "team-a")  # over the namespace's quota
    make_claim(fake_kube, "huge", "100Gi")  # bigger than any GPU
    make_claim(fake_kube, "idle", "1Gi")  # no pod: pending, not tried
    config = controller_config(metrics_port=free_port, metrics_address="127.0.0.1")
    seen: list[Samples] = []

    def current() -> Samples:
        seen.append(scrape(free_port))
        return seen[-1]

    async def scenario() -> None:
        stop = asyncio.Event()
        api = controller_client(fake_kube)
        task = asyncio.create_task(run_controller(config, stop, api_client=api))
        try:
            for name in ("c1", "c2", "c3", "huge"):
                make_pod(fake_kube, f"p-{name}", name)
            make_pod(fake_kube, "p-over", "over", "team-a")

            def done() -> bool:
                try:
                    samples = current()
                except urllib.error.URLError:  # not listening yet
                    return False
                return (
                    value(samples, "allocations_total") == 3
                    and (value(samples, "allocation_failures_total", reason="quota") or 0) >= 1
                    and (value(samples, "allocation_failures_total", reason="unfit") or 0) >= 1
                    and value(samples, "claims_pending") == 3
                )

            await eventually(done)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    samples = seen[-1]
    assert value(samples, "allocation_duration_seconds_count") == 3
    assert (value(samples, "allocation_duration_seconds_sum") or 0) > 0
    assert value(samples, "allocation_failures_total", reason="class-not-found") == 0
    # Best fit: c3 (30Gi) and c2 (20Gi) and c1 (10Gi) all fit on gpu-0 (60Gi in use).
    free = {
        labels: v
        for (name, labels), v in samples.items()
        if name == f"{PREFIX}_gpu_free_memory_bytes"
    }
    assert free == {
        (("device", "gpu-0"), ("node", "node-a")): H100_SHAREABLE - 60 * GI,
        (("device", "gpu-1"), ("node", "node-a")): H100_SHAREABLE,
    }
    with pytest.raises(urllib.error.URLError):  # the server stopped with the controller
        scrape(free_port)
