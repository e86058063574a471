"""The kubelet plugin's disruption-guard flags and the guard they build."""

from __future__ import annotations

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.cli import build_parser, claim_reporting
from dra_driver.cli.plugin import disruption_guard
from dra_driver.core.claim_writes import GuardMode
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.official import Configuration
from dra_driver.plugin.disruption_guard import DisruptionGuard
from tests.support.node import DRIVER, NODE


def _guard(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> DisruptionGuard | None:
    for name in ("DISRUPTION_GUARD", "DISRUPTION_GUARD_INTERVAL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["kubelet-plugin", *argv])
    api = KubeClient(Configuration())
    make = disruption_guard(args, api, DRIVER, NODE, claim_reporting(args, api, DRIVER, NODE))
    if make is None:
        return None
    guard = make(_prepared, _count)
    assert guard.prepared is _prepared and guard.on_count is _count
    return guard


def _prepared() -> dict[ClaimUID, ClaimRef]:
    return {}


def _count(pods: int) -> None:
    pass


def test_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _guard(monkeypatch) is None


def test_flags_and_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    guard = _guard(monkeypatch, DISRUPTION_GUARD="all", DISRUPTION_GUARD_INTERVAL="5")
    assert guard is not None
    assert (guard.mode, guard.interval_s, guard.node_name) == (GuardMode.ALL, 5.0, NODE)
    assert guard.events is not None
    guard = _guard(monkeypatch, "--disruption-guard", "annotated")
    assert guard is not None and guard.mode is GuardMode.ANNOTATED


def test_bad_values_name_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="--disruption-guard-interval"):
        _guard(monkeypatch, "--disruption-guard", "all", "--disruption-guard-interval", "soon")
    with pytest.raises(SystemExit):
        _guard(monkeypatch, DISRUPTION_GUARD="yes")
