"""The GPU check's parts that need no process: the CUDA client's library lookup, flags."""

from __future__ import annotations

import importlib
import json
import pathlib
import sys

import pytest

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
