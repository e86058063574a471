#!/usr/bin/env python3
"""Packing quality: GPUs used / lower bound on a seeded mix of inference claims.

The mix: 40% 14Gi, 30% 28Gi, 15% 40Gi, 10% 6Gi, 5% 72Gi on 80Gi GPUs (fake A100
80GB: 81920Mi shareable; the H100 profile offers 81559Mi and is shown too). Claims
are placed as one burst, largest first; best fit and first fit beside whole-GPU
allocation (one GPU per claim). The lower bound is ceil(sum of memory / GPU memory).

Usage:   .venv/bin/python hack/bench/packing.py [--claims 2000] [--seeds 1,2,3]
Target:  best fit <= 1.05 x the lower bound (kube-scheduler first fit: about 1.10).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from dra_driver.allocator.simulate import build_cluster, format_report, generate, simulate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--gpus", default="a100-80gb:8,h100-80gb:8")
    args = parser.parse_args()
    nodes = math.ceil(args.claims / 2 / 8)  # ~0.3 GPU per claim: room to spare
    for gpus in args.gpus.split(","):
        slices = build_cluster(nodes, gpus)
        for seed in (int(s) for s in args.seeds.split(",")):
            memory = generate(args.claims, seed)
            reports = [
                simulate(slices, memory, policy="best-fit"),
                simulate(slices, memory, policy="first-fit"),
                simulate(slices, memory, policy="first-fit", batch=False),
            ]
            print(f"--- {gpus}, seed {seed} (last first-fit row: arrival order, no batching)")
            print(format_report(reports))


if __name__ == "__main__":
    main()
