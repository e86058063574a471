#!/usr/bin/env python3
"""Packing quality: GPUs used against the lower bound and the exact optimum.

The mix: 40% 14Gi, 30% 28Gi, 15% 40Gi, 10% 6Gi, 5% 72Gi, on two GPU profiles: the
fake A100 80GB (81920Mi shareable) and the fake H100 80GB (81559Mi: two 40Gi claims
do not fit one). Each seed's claims go through the real allocator four ways: as one
burst placed largest first (the controller's batching window) and in arrival order
(online, no batching), each with best fit and first fit; whole-GPU allocation (one
GPU per claim) is shown beside them.

Two references per seed:
* BOUND, ceil(sum of memory / GPU memory): cheap, but not reachable in general;
* OPT, the fewest GPUs that can hold the claims at all: an integer program over
  every way to fill one GPU (one variable per pattern, i.e. per multiset of claim
  sizes that fits; minimise the GPUs used such that every size's claims are
  covered), solved with scipy.optimize.milp. Its LP relaxation is printed too.
  Needs the ``bench`` extra (scipy); without it OPT is left out and the line says
  how to install it.

On this mix BOUND is out of reach: 14Gi and 28Gi claims fill an 80Gi GPU to at most
70Gi unless 6Gi claims fill the gap, and those are only 10% of the claims; the ratio
to OPT is the measure of the policy.

Usage:   .venv/bin/python hack/bench/packing.py [--claims 2000] [--seeds 1,2,3]
                                               [--gpus a100-80gb:8,h100-80gb:8]
                                               [--time-limit 60]
         pip install -e '.[bench]'   (scipy, for the OPT column)
Target:  best fit <= 1.05 x the lower bound (kube-scheduler first fit: about 1.10),
         where the optimum allows it.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from dra_driver.allocator.simulate import GI, Report, build_cluster, generate, simulate

INSTALL_HINT = "OPT needs scipy: pip install -e '.[bench]' (or pip install 'scipy>=1.11')"
MAX_PATTERNS = 200_000


@dataclass(frozen=True)
class Optimum:
    gpus: int
    """The fewest GPUs (proven), or the best found when ``proven`` is false."""
    lp: float
    """The LP relaxation: no packing uses fewer GPUs than its ceiling."""
    proven: bool
    patterns: int
    seconds: float


def patterns(sizes: Sequence[int], capacity: int) -> list[tuple[int, ...]]:
    """Every non-empty choice of claim counts per size (``sizes`` order) that fits one GPU."""
    out: list[tuple[int, ...]] = []
    counts: list[int] = []

    def fill(at: int, left: int) -> None:
        if len(out) > MAX_PATTERNS:
            return
        if at == len(sizes):
            if any(counts):
                out.append(tuple(counts))
            return
        for n in range(left // sizes[at] + 1):
            counts.append(n)
            fill(at + 1, left - n * sizes[at])
            counts.pop()

    fill(0, capacity)
    return out


def exact_optimum(memory: Sequence[int], capacity: int, time_limit: float) -> Optimum | None:
    """The fewest GPUs of ``capacity`` bytes that hold ``memory`` (claims larger than a GPU
    are left out, as the allocator cannot place them); None without scipy or when the
    sizes allow too many patterns."""
    try:
        import numpy as np  # noqa: PLC0415 (optional: the bench extra)
        from scipy.optimize import LinearConstraint, milp  # noqa: PLC0415
    except ImportError:
        return None
    demand = Counter(m for m in memory if m <= capacity)
    sizes = sorted(demand)
    start = time.perf_counter()
    found = patterns(sizes, capacity)
    if not found or len(found) > MAX_PATTERNS:
        return None
    a = np.array(found, dtype=float).T  # sizes x patterns
    need = np.array([demand[s] for s in sizes], dtype=float)
    cover = LinearConstraint(a, lb=need, ub=np.inf)
    cost = np.ones(len(found))
    lp = milp(cost, constraints=cover, integrality=np.zeros(len(found)))
    ip = milp(
        cost, constraints=cover, integrality=np.ones(len(found)), options={"time_limit": time_limit}
    )
    if ip.x is None or lp.x is None:
        return None
    return Optimum(
        gpus=round(ip.fun),
        lp=float(lp.fun),
        proven=ip.status == 0,
        patterns=len(found),
        seconds=time.perf_counter() - start,
    )


def _ratio(gpus: int, reference: int | None) -> str:
    return f"{gpus / reference:.3f}" if reference else "-"


def table(rows: Sequence[tuple[str, Report]], opt: Optimum | None) -> str:
    first = rows[0][1]
    bound = first.lower_bound
    best = opt.gpus if opt else None
    lines = [
        f"{'ORDER':<8} {'POLICY':<10} {'PLACED':>9} {'GPUS':>5} {'BOUND':>5} {'OPT':>5}"
        f" {'/BOUND':>7} {'/OPT':>6} {'UTIL':>6} {'FRAG':>6} {'CLAIMS/S':>9}"
    ]
    for order, r in rows:
        lines.append(
            f"{order:<8} {r.policy:<10} {r.placed:>5}/{r.claims:<3} {r.gpus_used:>5} {bound:>5}"
            f" {best if best else '-':>5} {_ratio(r.gpus_used, bound):>7}"
            f" {_ratio(r.gpus_used, best):>6} {r.utilisation:>6.1%} {r.fragmentation:>6.1%}"
            f" {r.claims_per_second:>9.0f}"
        )
    whole_util = first.memory_requested / (first.whole_gpu * first.gpu_memory)
    lines.append(
        f"{'-':<8} {'whole-GPU':<10} {first.whole_gpu:>5}/{first.claims:<3} {first.whole_gpu:>5}"
        f" {bound:>5} {best if best else '-':>5} {_ratio(first.whole_gpu, bound):>7}"
        f" {_ratio(first.whole_gpu, best):>6} {whole_util:>6.1%}"
    )
    lines.append(
        f"{first.gpus_total} GPUs of {first.gpu_memory / GI:.2f}Gi shareable memory each;"
        f" BOUND = ceil({first.memory_requested / GI:.1f}Gi / {first.gpu_memory / GI:.2f}Gi)"
    )
    if opt is None:
        lines.append(INSTALL_HINT)
    else:
        lines.append(
            f"OPT: {'optimal' if opt.proven else 'best found, not proven (time limit)'};"
            f" LP relaxation {opt.lp:.1f} (so no packing uses fewer than"
            f" {math.ceil(opt.lp - 1e-6)}); {opt.patterns} patterns, {opt.seconds:.2f} s"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--gpus", default="a100-80gb:8,h100-80gb:8")
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds for each integer program"
    )
    args = parser.parse_args()
    nodes = math.ceil(args.claims / 2 / 8)  # ~0.3 GPU per claim: room to spare
    summary = []
    for gpus in args.gpus.split(","):
        slices = build_cluster(nodes, gpus)
        for seed in (int(s) for s in args.seeds.split(",")):
            memory = generate(args.claims, seed)
            rows = [
                ("burst", simulate(slices, memory, policy="best-fit")),
                ("burst", simulate(slices, memory, policy="first-fit")),
                ("arrival", simulate(slices, memory, policy="best-fit", batch=False)),
                ("arrival", simulate(slices, memory, policy="first-fit", batch=False)),
            ]
            opt = exact_optimum(memory, rows[0][1].gpu_memory, args.time_limit)
            print(f"--- {gpus}, seed {seed}: {args.claims} claims")
            print(table(rows, opt))
            summary.append((gpus, seed, rows, opt))
    print("\n--- summary: GPUs used (ratio to OPT)")
    print(
        f"{'GPUS':<14} {'SEED':>4} {'BOUND':>5} {'LP':>7} {'OPT':>5}"
        f" {'BEST-FIT BURST':>15} {'BEST-FIT ONLINE':>16} {'FIRST-FIT ONLINE':>17}"
    )
    for gpus, seed, rows, opt in summary:
        best = opt.gpus if opt else None

        def cell(r: Report, width: int, best: int | None = best) -> str:
            return f"{f'{r.gpus_used} ({_ratio(r.gpus_used, best)})':>{width}}"

        print(
            f"{gpus:<14} {seed:>4} {rows[0][1].lower_bound:>5}"
            f" {f'{opt.lp:.1f}' if opt else '-':>7} {best if best else '-':>5}"
            f" {cell(rows[0][1], 15)} {cell(rows[2][1], 16)} {cell(rows[3][1], 17)}"
        )
    if any(opt is None for *_, opt in summary):
        print(INSTALL_HINT)


if __name__ == "__main__":
    main()
