"""The GPU check's parts that need no process: the CUDA client's library lookup, flags,
and the pure judgements of the ``tenant`` and ``mig-compute-mode`` steps."""

from __future__ import annotations

import importlib
import json
import pathlib
import sys

import pytest

from dra_driver.app.gpu_check.decide import (
    GIB,
    Outcome,
    TenantFinding,
    judge_compute_mode,
    judge_tenant,
    judge_tenant_listing,
    judge_tenant_quit,
    judge_tenant_set,
)
from dra_driver.base.errors import ConfigError
from dra_driver.cli import build_parser
from dra_driver.cli.gpu_check import cmd_gpu_check
from dra_driver.gpu import cuda_client


def test_the_client_finds_libcudart_in_the_wheels_layout(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nvidia-cuda-runtime-cu12 12.9.79 ships nvidia/cuda_runtime/lib/libcudart.so.12
    (a namespace package ``nvidia``, no __init__.py)."""
    lib = tmp_path / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    importlib.invalidate_caches()
    assert cuda_client.wheel_cudart() == str(lib)


def test_the_client_without_libcudart_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cuda_client, "wheel_cudart", lambda: None)
    assert cuda_client.main(["--below", "1", "--above", "2"]) == 1
    assert "pip install nvidia-cuda-runtime-cu12" in json.loads(capsys.readouterr().out)["error"]


def test_a_library_that_does_not_load_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    assert cuda_client.main(["--below", "1", "--above", "2", "--cudart", "/nonexistent.so"]) == 1
    assert "cannot load /nonexistent.so" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--sm-percent", "150"], "--sm-percent must be 1 to 100 (got 150)"),
        (["--memory-limit-mib", "0"], "--memory-limit-mib at least 1 (got 0)"),
        (["--step-timeout", "soon"], "--step-timeout"),
    ],
)
def test_bad_flags_are_named(flags: list[str], words: str) -> None:
    args = build_parser().parse_args(["gpu-check", *flags])
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        cmd_gpu_check(args)


def test_a_tenant_listing_counts_only_when_it_reached_the_daemon() -> None:
    assert judge_tenant_listing("list", 0, "shares,0,123\n", "shares").could
    assert not judge_tenant_listing("list", 0, "", "shares").could  # exit 0, nothing listed
    refused = judge_tenant_listing("list", 1, "Cannot find MPS control daemon", "shares")
    assert not refused.could
    assert refused.evidence == "exit status 1, does not name shares"


def test_a_tenant_set_is_judged_by_the_daemons_listing_not_the_exit_status() -> None:
    wanted = (2 * GIB, 100.0)
    assert judge_tenant_set((GIB, 10.0), wanted, wanted, 1).could  # changed, whatever it said
    assert not judge_tenant_set((GIB, 10.0), (GIB, 10.0), wanted, 0).could  # said yes, no change
    assert not judge_tenant_set(None, None, wanted, 1).could


def test_a_tenant_quit_counts_when_the_daemon_exited() -> None:
    assert judge_tenant_quit(0, daemon_exited=True).could
    assert not judge_tenant_quit(0, daemon_exited=False).could


def test_what_a_tenant_could_do_is_a_failure_under_a_security_banner() -> None:
    can = TenantFinding("quit the daemon", True, "exit status 0; the daemon exited")
    cannot = TenantFinding("list the daemon's servers", False, "exit status 1")
    outcome, lines = judge_tenant([cannot, can])
    assert outcome is Outcome.FAIL
    assert lines[0] == lines[-1]
    assert lines[0].startswith("!! SECURITY") and "can quit the daemon !!" in lines[0]
    assert "tenant CAN quit the daemon: exit status 0; the daemon exited" in lines
    assert judge_tenant([cannot]) == (
        Outcome.PASS,
        ["tenant cannot list the daemon's servers: exit status 1"],
    )


@pytest.mark.parametrize(
    ("before", "after", "took", "words"),
    [
        ("DEFAULT", "EXCLUSIVE_PROCESS", True, "accepted"),
        ("DEFAULT", "DEFAULT", False, "refused"),  # nvidia-smi may refuse and exit 0
        (None, None, False, "mode None -> None"),
    ],
)
def test_a_compute_mode_is_judged_by_the_mode_read_back(
    before: str | None, after: str | None, took: bool, words: str
) -> None:
    got, line = judge_compute_mode("the GPU", before, after, "All done.")
    assert got is took
    assert words in line and "it said: All done." in line
