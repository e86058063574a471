"""A flag's environment twin is checked as strictly as the flag (its choices), through
the flags :func:`add_flag` registered, not argparse's private action list."""

from __future__ import annotations

import pytest

from dra_driver.cli import build_parser


def test_an_env_value_outside_the_choices_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOG_LEVEL", "LOUD")
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args(["version"])
    assert ended.value.code == 2
    assert "LOG_LEVEL='LOUD' is not a valid --log-level" in capsys.readouterr().err


def test_an_env_value_among_the_choices_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("TENANCY", "cooperative")
    assert build_parser().parse_args(["version"]).log_level == "DEBUG"
    assert build_parser().parse_args(["kubelet-plugin"]).tenancy == "cooperative"
