"""The pure helpers of hack/bench/prepare.py: steal, the runs' tally, CPU in the waves."""

from __future__ import annotations

import importlib.util
import os
import time
from types import ModuleType
from typing import Any

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = os.path.join(ROOT, "hack", "bench", "prepare.py")
    spec = importlib.util.spec_from_file_location("bench_prepare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_machine_ticks_reads_the_eight_kinds_of_cpu_time(bench: ModuleType) -> None:
    ticks = bench.machine_ticks()
    assert len(ticks) == 8
    assert all(t >= 0 for t in ticks)


def test_steal_is_counted_against_all_of_the_machines_time(bench: ModuleType) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    before = [100, 0, 50, 1000, 5, 0, 2, 10]
    # 300 ticks go by: 60 user, 20 system, 190 idle, 30 stolen.
    after = [160, 0, 70, 1190, 5, 0, 2, 40]
    seconds, share = bench.stolen(before, after)
    assert seconds == pytest.approx(30 / tick)
    assert share == pytest.approx(0.1)
    assert bench.stolen(before, before) == (0.0, 0.0)


def run(prepare_p99: float, unprepare_p99: float, plugin: float, agent: float) -> dict[str, Any]:
    return {
        "prepare_p99": prepare_p99,
        "unprepare_p99": unprepare_p99,
        "rss_start": (plugin - 4, agent - 0.5),
        "rss_end": (plugin, agent),
    }


def test_met_counts_tallies_each_target_and_its_range(bench: ModuleType) -> None:
    line = bench.met_counts([run(45.0, 20.0, 67.0, 30.0), run(52.5, 31.0, 71.0, 29.0)])
    assert "prepare p99 <= 50 in 1 of 2 (range 45.0-52.5)" in line
    assert "unprepare p99 <= 30 in 1 of 2 (range 20.0-31.0)" in line
    assert "plugin RSS <= 70 in 1 of 2 (range 67.0-71.0)" in line
    assert "mps-agent RSS <= 35 in 2 of 2 (range 29.0-30.0)" in line


def test_add_spent_sums_each_process_over_the_waves(bench: ModuleType) -> None:
    total: dict[str, float] = {}
    bench.add_spent(total, {"plugin": 1.0, "agent": 2.0}, {"plugin": 1.5, "agent": 2.25})
    bench.add_spent(total, {"plugin": 3.0, "agent": 4.0}, {"plugin": 3.25, "agent": 4.0})
    assert total == {"plugin": 0.75, "agent": 0.25}
    # A process first seen after the wave started (no reading before) adds nothing.
    bench.add_spent(total, {}, {"fake MPS": 9.0})
    assert total["fake MPS"] == 0.0


def test_wave_floor_spreads_the_waves_cpu_over_the_cores(bench: ModuleType) -> None:
    per_claim = {"plugin": 4.0, "agent": 1.0, "API server*": 1.0}
    # 10 claims x 6 ms of CPU on 2 cores: 30 ms at the least.
    assert bench.wave_floor_ms(per_claim, 10, 2) == pytest.approx(30.0)
    assert bench.wave_floor_ms(per_claim, 10, 1) == pytest.approx(60.0)


def test_the_kubelets_cpu_leaves_out_the_readings_own(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the other processes' CPU costs this process CPU too (the MPS modes read
    the agent's daemons, four times a round): not the kubelet's."""

    def slow_read(pid: int, children: bool = False) -> float:
        end = time.process_time() + 0.02
        while time.process_time() < end:  # a read that takes 20 ms of CPU
            pass
        return 0.0

    monkeypatch.setattr(bench, "cpu_s", slow_read)
    first = bench.cpu_now(1, None, 2)
    second = bench.cpu_now(1, None, 2)
    assert second["kubelet"] - first["kubelet"] < 0.01  # two reads: 40 ms, left out
