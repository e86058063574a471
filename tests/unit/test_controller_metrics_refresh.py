"""The controller's cluster gauges are recomputed for scrapes, not per change: a scrape
asks for the next snapshot (dra_driver/controller/metrics.py)."""

from __future__ import annotations

from prometheus_client import generate_latest

from dra_driver.allocator import DeviceMemory
from dra_driver.controller.metrics import PREFIX, ControllerMetrics


def test_a_scrape_serves_the_snapshot_and_asks_for_the_next() -> None:
    metrics = ControllerMetrics()
    assert not metrics.wanted  # nobody scraped: nothing to recompute
    metrics.set_cluster([DeviceMemory("node-a", "node-a", "gpu-0", 80, 30)], 2)
    text = generate_latest(metrics.registry).decode()
    assert metrics.wanted
    assert f"{PREFIX}_claims_pending 2.0" in text
    assert f'{PREFIX}_gpu_free_memory_bytes{{device="gpu-0",node="node-a"}} 30.0' in text


def test_dropped_events_are_counted() -> None:
    metrics = ControllerMetrics()
    metrics.event_dropped()
    metrics.event_dropped()
    assert f"{PREFIX}_events_dropped_total 2.0" in generate_latest(metrics.registry).decode()
