"""The kubelet plugin's claim reporting flags, and the reporter the plugin tells."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.base.errors import ConfigError
from dra_driver.cli import build_parser, claim_reporting
from dra_driver.core.prepare import ClaimOperation
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim
from dra_driver.observability.claim_log import LOGGER
from dra_driver.observability.metrics_server import PREFIX as P
from dra_driver.observability.metrics_server import new_registry
from dra_driver.plugin.claim_reporting import ClaimReporter, DeviceHealthChange
from tests.support.eventually import eventually
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.transport import UNUSED_HOST, transport_to


def test_defaults_write_status_and_rate_limit_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLAIM_STATUS", raising=False)
    monkeypatch.delenv("EVENT_INTERVAL", raising=False)
    args = build_parser().parse_args(["kubelet-plugin"])
    assert (args.claim_status, args.event_interval) == ("auto", "60")
    reporter = claim_reporting(args, transport_to(UNUSED_HOST), DRIVER, NODE)
    assert reporter.status_writer is not None
    assert reporter.status_writer.field_manager == f"{DRIVER}/{NODE}"
    assert reporter.events is not None and reporter.events.instance == NODE


def test_claim_status_off_and_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAIM_STATUS", "off")
    monkeypatch.setenv("EVENT_INTERVAL", "5")
    args = build_parser().parse_args(["kubelet-plugin"])
    reporter = claim_reporting(args, transport_to(UNUSED_HOST), DRIVER, NODE)
    assert reporter.status_writer is None
    assert reporter.events is not None and reporter.events.interval_s == 5.0


def test_bad_event_interval_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVENT_INTERVAL", raising=False)
    args = build_parser().parse_args(["kubelet-plugin", "--event-interval", "soon"])
    with pytest.raises(ConfigError, match="--event-interval"):
        claim_reporting(args, transport_to(UNUSED_HOST), DRIVER, NODE)


class HeardReporter(ClaimReporter):
    """The reporter the flags make, noting what it is told."""

    def __init__(self, reporter: ClaimReporter) -> None:
        super().__init__(
            driver_name=reporter.driver_name,
            node_name=reporter.node_name,
            status=reporter.status_writer,
            events=reporter.events,
        )
        self.claims: list[str] = []
        self.devices: list[str] = []

    def claim_done(self, op: ClaimOperation) -> None:
        self.claims.append(f"{op.operation} {op.ref.name}")
        super().claim_done(op)

    def devices_health_changed(self, changes: Sequence[DeviceHealthChange]) -> None:
        self.devices += [f"{c.device_name} {c.status}" for c in changes]
        super().devices_health_changed(changes)


def test_the_plugin_tells_the_reporter_the_log_and_the_metrics(
    node_dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    args = build_parser().parse_args(["kubelet-plugin", "--claim-status", "off"])
    reporter = HeardReporter(claim_reporting(args, transport_to(UNUSED_HOST), DRIVER, NODE))
    metrics = new_registry("kubelet-plugin")
    claim = resource_claim("ns", "whole", devices=[Allocated("gpu-0")])
    backend = FakeGpuBackend("h100-80gb:1", NODE)
    parts = PluginParts(
        node_dirs.config(),
        backend,
        InMemoryClaimSource([claim]),
        None,
        reporting=reporter,
        metrics=metrics,
    )
    caplog.set_level(logging.INFO, logger=LOGGER)

    def health(status: str) -> float | None:
        labels = {"device": "gpu-0", "gpu_uuid": gpu_uuid, "status": status}
        return metrics.get_sample_value(P + "device_health", labels)

    async def scenario() -> None:
        runtime = await start_plugin(parts)
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            ref = claim_ref(claim)
            assert (await plugin.prepare([ref]))[ref.uid].error == ""
            assert reporter.claims == ["prepare whole"]
            assert any(r.name == LOGGER and "whole" in r.getMessage() for r in caplog.records)
            labels = {"operation": "prepare", "outcome": "ok"}
            assert metrics.get_sample_value(P + "claim_operations_total", labels) == 1
            # Device health: the reporter hears every device at start, then each change;
            # the metrics follow.
            assert reporter.devices == ["gpu-0 Healthy"]
            assert health("Healthy") == 1
            backend.inject_xid(0, 79)  # fallen off the bus: fatal
            await eventually(lambda: health("Unhealthy") == 1, "device_health follows")
            assert reporter.devices == ["gpu-0 Healthy", "gpu-0 Unhealthy"]
        finally:
            await kubelet.close()
            await runtime.stop()

    gpu_uuid = run_checked(backend.inventory()).gpus[0].uuid
    run_checked(scenario())
