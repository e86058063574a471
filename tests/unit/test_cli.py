"""``dra-driver``: every flag has an environment twin; the subcommands' entry behaviour."""

from __future__ import annotations

import argparse
import logging
from typing import Any

import pytest

from dra_driver import __version__
from dra_driver.cli import COMMANDS, build_parser, env_name, main


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]


def _flag(action: argparse.Action) -> str:
    (flag,) = [s for s in action.option_strings if s.startswith("--")]
    return flag


def _flag_cases() -> list[Any]:
    cases = []
    for command, parser in _subcommands(build_parser()).items():
        for action in _options(parser):
            cases.append(pytest.param(command, _flag(action), id=f"{command}-{_flag(action)}"))
    return cases


FLAG_CASES = _flag_cases()


def _action(command: str, flag: str) -> argparse.Action:
    (action,) = [
        a for a in _options(_subcommands(build_parser())[command]) if flag in a.option_strings
    ]
    return action


def _valid_value(action: argparse.Action, avoid: object) -> str:
    """A value the flag accepts that differs from its default where possible."""
    if action.choices is not None:
        choices = [str(c) for c in action.choices]
        return next((c for c in choices if c != avoid), choices[0])
    return f"/from-env/{action.dest}"


def test_there_are_flags_and_subcommands() -> None:
    assert set(_subcommands(build_parser())) == {
        "cleanup",
        "mps-agent",
        "kubelet-plugin",
        "controller",
        "render-slices",
        "demo",
        "gpu-check",
        "simulate",
        "version",
    }
    flags = {(c.values[0], c.values[1]) for c in FLAG_CASES}
    assert ("kubelet-plugin", "--node-name") in flags
    assert ("kubelet-plugin", "--cdi-root") in flags
    assert ("version", "--log-level") in flags


def test_every_subcommand_has_a_runner() -> None:
    assert set(COMMANDS) == set(_subcommands(build_parser()))


def test_top_level_has_no_untwinned_options() -> None:
    assert _options(build_parser()) == []


@pytest.mark.parametrize(("command", "flag"), FLAG_CASES)
def test_env_twin(command: str, flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_name(flag)
    assert env == flag[2:].replace("-", "_").upper()
    monkeypatch.delenv(env, raising=False)
    default = _action(command, flag).default
    value = _valid_value(_action(command, flag), default)

    monkeypatch.setenv(env, value)
    action = _action(command, flag)
    args = build_parser().parse_args([command])
    assert getattr(args, action.dest) == value
    assert action.help is not None and f"[env {env}" in action.help


def _two_values(action: argparse.Action) -> tuple[str, str]:
    if action.choices is None:
        return f"/from-env/{action.dest}", f"/from-flag/{action.dest}"
    choices = [str(c) for c in action.choices]
    return choices[0], choices[-1]


@pytest.mark.parametrize(
    ("command", "flag"),
    [c for c in FLAG_CASES if len(set(_two_values(_action(*c.values)))) == 2],
)
def test_flag_wins_over_env(command: str, flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from_env, from_flag = _two_values(_action(command, flag))
    monkeypatch.setenv(env_name(flag), from_env)
    action = _action(command, flag)
    assert build_parser().parse_args([command]).__dict__[action.dest] == from_env
    args = build_parser().parse_args([command, flag, from_flag])
    assert getattr(args, action.dest) == from_flag


def _choice_flags() -> list[Any]:
    return [c for c in FLAG_CASES if _action(c.values[0], c.values[1]).choices is not None]


@pytest.mark.parametrize(("command", "flag"), _choice_flags())
def test_invalid_choice_on_the_command_line(command: str, flag: str) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([command, flag, "no-such-choice"])
    assert info.value.code == 2


@pytest.mark.parametrize(("command", "flag"), _choice_flags())
def test_invalid_choice_in_the_env_twin(
    command: str, flag: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name(flag), "no-such-choice")
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([command])
    assert info.value.code == 2


# --- main ---------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"dra-driver {__version__}\n"


def test_plugin_without_node_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for env in ("NODE_NAME", "LOG_LEVEL", "DRIVER_NAME"):
        monkeypatch.delenv(env, raising=False)
    with caplog.at_level(logging.ERROR, logger="dra_driver"):
        assert main(["kubelet-plugin"]) == 2
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "--node-name" in errors[0].getMessage()
    assert "NODE_NAME" in errors[0].getMessage()


def test_plugin_with_bad_driver_name(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    with caplog.at_level(logging.ERROR, logger="dra_driver"):
        code = main(["kubelet-plugin", "--node-name", "n", "--driver-name", "bad driver"])
    assert code == 2
    assert "invalid CDI kind" in caplog.text


def test_unknown_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# --- render-slices and demo ----------------------------------------------------------


def test_render_slices_prints_valid_yaml(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    monkeypatch.delenv("LOG_LEVEL", raising=False)
    argv = ["render-slices", "--fake-gpus", "h100-80gb:1,h100-80gb:1:mig", "--node-name", "n1"]
    assert main([*argv, "--kube-version", "1.36"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in docs] == [
        "n1-gpu-fractional-dev-counters-0",
        "n1-gpu-fractional-dev-devices-0",
        "n1-gpu-fractional-dev-gpu-1",
    ]
    assert all(d["spec"]["nodeName"] == "n1" for d in docs)
    assert main([*argv, "--kube-version", "1.34", "--sharing", "exclusive"]) == 0
    (only,) = list(yaml.safe_load_all(capsys.readouterr().out))
    (gpu,) = only["spec"]["devices"]
    assert gpu["name"] == "gpu-0" and "allowMultipleAllocations" not in gpu


def test_demo_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "kubelet uses v1.DRAPlugin" in out
    assert "MPS 10Gi, 25% SMs" in out and "MPS 30Gi, 50% SMs" in out
    assert "MIG 1g.10gb (created)" in out and "time-sliced" in out and "whole GPU" in out
    assert "it is allocated to node node-b" in out
    assert "holds 2 namespace(s)" in out
    # Two claims share one MIG instance (made on demand) with different limits.
    assert "MPS 2Gi, 30% SMs in MIG 1g.10gb" in out and "MPS 4Gi, 60% SMs in MIG 1g.10gb" in out
    assert "MPS daemon for MIG instance MIG-" in out
    assert "holds 2 share(s) under legacy MPS" in out  # a MIG instance's daemon: legacy
    assert "repeated prepare returns the recorded result: yes" in out
    assert "25 MIG placements" in out
    assert "gpu-1: 40Gi + 28Gi + 10Gi" in out  # the allocator's best fit
    assert "CDI specs left: 0, MPS namespaces left: 0, MIG instances left: 0" in out
