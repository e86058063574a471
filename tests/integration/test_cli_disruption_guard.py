"""The kubelet plugin's disruption-guard flags and the guard they make."""

from __future__ import annotations

import pytest

from dra_driver.app.plugin import GuardOptions
from dra_driver.app.plugin_daemon import guard_options
from dra_driver.base.errors import ConfigError
from dra_driver.cli import build_parser, claim_reporting
from dra_driver.cli.plugin import disruption_guard
from dra_driver.core.claim_writes import GuardMode
from dra_driver.k8s.pods import PodApi
from tests.support.node import DRIVER, NODE
from tests.support.transport import UNUSED_HOST, transport_to


def _guard(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> GuardOptions | None:
    """The guard ``dra-driver kubelet-plugin`` makes from ``argv`` and ``env``."""
    for name in ("DISRUPTION_GUARD", "DISRUPTION_GUARD_INTERVAL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["kubelet-plugin", *argv])
    settings = disruption_guard(args)
    if settings is None:
        return None
    api = transport_to(UNUSED_HOST)
    reporter = claim_reporting(args, api, DRIVER, NODE)
    guard = guard_options(api, NODE, settings, reporter)
    assert guard.events is reporter.events  # its warnings are the plugin's Events
    return guard


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _guard(monkeypatch) is None


def test_flags_and_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = _guard(monkeypatch, DISRUPTION_GUARD="all", DISRUPTION_GUARD_INTERVAL="5")
    assert guard is not None
    assert (guard.mode, guard.interval_s) == (GuardMode.ALL, 5.0)
    assert isinstance(guard.pods, PodApi) and guard.pods.node_name == NODE
    assert guard.events is not None
    guard = _guard(monkeypatch, "--disruption-guard", "annotated")
    assert guard is not None and guard.mode is GuardMode.ANNOTATED


def test_bad_values_name_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="--disruption-guard-interval"):
        _guard(monkeypatch, "--disruption-guard", "all", "--disruption-guard-interval", "soon")
    with pytest.raises(SystemExit):
        _guard(monkeypatch, DISRUPTION_GUARD="yes")
