"""The kubelet plugin's claim reporting flags, and the reporter attached to the runtime."""

from __future__ import annotations

import pytest

from dra_driver.app.plugin import PluginRuntime
from dra_driver.base.errors import ConfigError
from dra_driver.cli import build_parser, claim_reporting
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.official import Configuration
from dra_driver.observability.claim_log import ClaimLog
from dra_driver.observability.plugin_metrics import PluginMetrics
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked


def test_defaults_write_status_and_rate_limit_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLAIM_STATUS", raising=False)
    monkeypatch.delenv("EVENT_INTERVAL", raising=False)
    args = build_parser().parse_args(["kubelet-plugin"])
    assert (args.claim_status, args.event_interval) == ("auto", "60")
    reporter = claim_reporting(args, KubeClient(Configuration()), DRIVER, NODE)
    assert reporter.status_writer is not None
    assert reporter.status_writer.field_manager == f"{DRIVER}/{NODE}"
    assert reporter.events is not None and reporter.events.instance == NODE


def test_claim_status_off_and_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAIM_STATUS", "off")
    monkeypatch.setenv("EVENT_INTERVAL", "5")
    args = build_parser().parse_args(["kubelet-plugin"])
    reporter = claim_reporting(args, KubeClient(Configuration()), DRIVER, NODE)
    assert reporter.status_writer is None
    assert reporter.events is not None and reporter.events.interval_s == 5.0


def test_bad_event_interval_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EVENT_INTERVAL", raising=False)
    args = build_parser().parse_args(["kubelet-plugin", "--event-interval", "soon"])
    with pytest.raises(ConfigError, match="--event-interval"):
        claim_reporting(args, KubeClient(Configuration()), DRIVER, NODE)


def test_the_runtime_tells_the_reporter_the_log_and_the_metrics(node_dirs: NodeDirs) -> None:
    args = build_parser().parse_args(["kubelet-plugin", "--claim-status", "off"])
    reporter = claim_reporting(args, KubeClient(Configuration()), DRIVER, NODE)
    metrics = PluginMetrics()
    runtime = PluginRuntime(
        node_dirs.config(),
        FakeGpuBackend("h100-80gb:1", NODE),
        InMemoryClaimSource([]),
        None,
        reporting=reporter,
        metrics=metrics,
    )

    async def scenario() -> None:
        await runtime.start()
        try:
            assert runtime.driver is not None and runtime.health_monitor is not None
            observers = runtime.driver.observers
            assert observers[-1] is reporter and metrics in observers
            assert any(isinstance(o, ClaimLog) for o in observers)
            listeners = runtime.health_monitor.listeners
            assert reporter.devices_health_changed in listeners
            assert len(listeners) == 2  # metrics and reporter
        finally:
            await runtime.stop()

    run_checked(scenario())
