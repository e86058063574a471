"""The packing simulation on small seeded runs, and the incremental allocator state."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from dra_driver.allocator import AllocatorState, allocate, best_fit, first_fit
from dra_driver.allocator.simulate import (
    DRIVER,
    GI,
    build_cluster,
    claim_object,
    device_class,
    generate,
    order_batch,
    simulate,
)
from dra_driver.cli import main

SLICES = build_cluster(8, "a100-80gb:8")


def test_lower_bound_whole_gpu_and_metrics() -> None:
    memory = generate(120, seed=3)
    report = simulate(SLICES, memory)
    assert report.placed == report.claims == 120
    assert report.gpu_memory == 80 * GI
    assert report.memory_requested == sum(memory)
    assert report.lower_bound == math.ceil(sum(memory) / (80 * GI))
    assert report.whole_gpu == 120  # every claim fits one GPU: one GPU each
    assert report.lower_bound <= report.gpus_used < report.whole_gpu
    assert report.stranded == report.gpus_used * 80 * GI - sum(memory)


def test_best_fit_no_worse_than_first_fit_and_deterministic() -> None:
    memory = generate(150, seed=7)
    best = simulate(SLICES, memory, policy="best-fit")
    first = simulate(SLICES, memory, policy="first-fit")
    assert best.gpus_used <= first.gpus_used
    assert generate(150, seed=7) == memory != generate(150, seed=8)
    again = simulate(SLICES, memory, policy="best-fit")
    assert (again.gpus_used, again.stranded) == (best.gpus_used, best.stranded)


def test_order_batch_largest_first() -> None:
    assert order_batch([6, 72, 14, 40, 14]) == [72, 40, 14, 14, 6]


@pytest.mark.parametrize("policy", [best_fit, first_fit])
def test_state_matches_one_shot_allocate(policy: object) -> None:
    """The incremental state places every claim where a fresh ``allocate`` would."""
    slices = build_cluster(3, "a100-80gb:2")
    memory = generate(30, seed=11, mix="14Gi:4,28Gi:3,40Gi:2,6Gi:1,72Gi:1")
    state = AllocatorState(
        slices=slices, classes=[device_class()], allocated_claims=[], driver_name=DRIVER
    )
    ids = (f"s-{n}" for n in itertools.count())
    allocated: list[dict[str, Any]] = []
    for n, amount in enumerate(memory):
        claim = claim_object(n, amount)
        fresh = allocate(
            claim,
            slices=slices,
            classes=[device_class()],
            allocated_claims=allocated,
            driver_name=DRIVER,
            policy=policy,  # type: ignore[arg-type]
            share_id=lambda: "x",
        )
        mine = state.allocate(claim, policy=policy, share_id=lambda: next(ids))  # type: ignore[arg-type]
        assert (fresh.allocation is None) == (mine.allocation is None)
        if mine.allocation is None:
            continue
        assert fresh.allocation is not None
        assert [(r.pool, r.device) for r in fresh.allocation.results] == [
            (r.pool, r.device) for r in mine.allocation.results
        ]
        allocated.append(
            {"status": {"allocation": mine.allocation.to_status("2026-01-01T00:00:00Z")}}
        )
    assert state.examined < len(memory) * 6


def test_cli_simulate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--nodes", "4", "--claims", "40", "--policy", "both"]) == 0
    out = capsys.readouterr().out
    assert "best-fit" in out and "first-fit" in out and "whole-GPU" in out
