"""The kubelet plugin's device-health flags, their env twins, and their errors."""

from __future__ import annotations

import argparse
import logging

import pytest

from dra_driver.cli import build_parser, main


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["kubelet-plugin", *argv])


def test_defaults() -> None:
    args = parse()
    assert args.health_probe_interval == "30"
    assert args.health_recovery_seconds == "300"
    assert args.fatal_xid_taint_effect == "NoSchedule"
    assert args.ignored_xids == ""


def test_env_twins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTH_PROBE_INTERVAL", "5")
    monkeypatch.setenv("HEALTH_RECOVERY_SECONDS", "60")
    monkeypatch.setenv("FATAL_XID_TAINT_EFFECT", "NoExecute")
    monkeypatch.setenv("IGNORED_XIDS", "13,31")
    args = parse()
    assert args.health_probe_interval == "5"
    assert args.health_recovery_seconds == "60"
    assert args.fatal_xid_taint_effect == "NoExecute"
    assert args.ignored_xids == "13,31"


def test_taint_effect_is_a_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--fatal-xid-taint-effect", "PreferNoSchedule")
    assert "--fatal-xid-taint-effect" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        (["--ignored-xids", "13,x"], {}, "--ignored-xids (IGNORED_XIDS): 'x' is not an XID"),
        ([], {"IGNORED_XIDS": "79,0"}, "--ignored-xids (IGNORED_XIDS): '0' is not an XID"),
        (["--health-probe-interval", "-1"], {}, "--health-probe-interval (HEALTH_PROBE_INTERVAL)"),
        (["--health-recovery-seconds", "soon"], {}, "--health-recovery-seconds"),
        (["--driver-name", "GPU.Example.com"], {}, "check --driver-name"),
    ],
    ids=["bad-xid", "xid-0-in-env", "negative-interval", "recovery-not-a-number", "taint-key"],
)
def test_bad_values_name_the_flag(
    argv: list[str],
    env: dict[str, str],
    named: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.ERROR, logger="dra_driver"):
        assert main(["kubelet-plugin", "--node-name", "n", *argv]) == 2
    assert named in caplog.text
