"""The compute mode around an MPS daemon: EXCLUSIVE_PROCESS on a whole GPU, recorded
first; a MIG instance's left as it is, with a warning saying what that allows."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.previous_mode import enter_exclusive_process, restore_previous_mode

GPU = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
MIG = "MIG-00000000-aaaa-bbbb-cccc-444444444444"


def test_a_whole_gpu_enters_exclusive_process_and_gets_its_mode_back(tmp_path: Path) -> None:
    modes = FakeComputeMode({GPU: "PROHIBITED"})
    record = str(tmp_path / "previous-mode")
    asyncio.run(enter_exclusive_process(modes, GPU, record))
    assert modes.modes[GPU] == "EXCLUSIVE_PROCESS"
    asyncio.run(restore_previous_mode(modes, GPU, record))
    assert modes.history == [(GPU, "EXCLUSIVE_PROCESS"), (GPU, "PROHIBITED")]


def test_a_mig_instance_keeps_its_mode_and_the_log_says_what_that_allows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    modes = FakeComputeMode()
    with caplog.at_level(logging.WARNING, logger="dra_driver.mpsagent.previous_mode"):
        asyncio.run(enter_exclusive_process(modes, MIG, str(tmp_path / "previous-mode")))
    assert modes.history == []
    (warning,) = [r.getMessage() for r in caplog.records]
    assert MIG in warning and "without EXCLUSIVE_PROCESS" in warning
    assert "plain CUDA process with the whole instance" in warning
