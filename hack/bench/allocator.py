#!/usr/bin/env python3
"""Allocator throughput: many claims against one incrementally updated AllocatorState.

A cluster of NODES nodes x 8 fake H100s (Kubernetes 1.36 slices, controller-managed),
CLAIMS mixed claims (the inference mix of memory shares, plus whole-GPU-sized,
two-GPU and four-GPU claims) placed one after another with best fit (or
``--policy first-fit``). Printed: the time to build the state, claims/s, devices
examined (placement computed) per claim, and alone keys walked per multi-device
claim (devices looked at to rank nodes: a few nodes' worth, not the cluster). With
``--quota`` every claim is checked against a VRAM quota of its namespace (all claims
are in one namespace): claims past the quota are refused, and counted.

Usage:   .venv/bin/python hack/bench/allocator.py [--nodes 1000] [--claims 10000]
                                                 [--two-gpu 0.01] [--four-gpu 0]
                                                 [--policy best-fit] [--quota 200000Gi]
Target:  over 1,000 claims/s at 1,000 nodes x 8 GPUs, 10,000 claims.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from dra_driver.allocator import AllocatorState, VramQuota
from dra_driver.allocator.simulate import (
    DRIVER,
    GI,
    POLICIES,
    build_cluster,
    claim_object,
    device_class,
    generate,
)
from dra_driver.base.quantity import parse_quantity


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--two-gpu", type=float, default=0.01, help="share of 2-device claims")
    parser.add_argument("--four-gpu", type=float, default=0.0, help="share of 4-device claims")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="best-fit")
    parser.add_argument("--quota", help="VRAM quota of the claims' namespace, e.g. 200000Gi")
    args = parser.parse_args()
    quota = None
    if args.quota:
        limit = int(parse_quantity(args.quota))
        quota = VramQuota("sim", limit, "gpu.fractional.dev/vram-quota")

    t0 = time.perf_counter()
    slices = build_cluster(args.nodes, "h100-80gb:8")
    t1 = time.perf_counter()
    state = AllocatorState(
        slices=slices, classes=[device_class()], allocated_claims=[], driver_name=DRIVER
    )
    t2 = time.perf_counter()
    rng = random.Random(5)
    memory = generate(args.claims, 5, "14Gi:40,28Gi:30,40Gi:15,6Gi:10,72Gi:5,79Gi:2")
    claims = []
    multi = 0
    for n, amount in enumerate(memory):
        claim = claim_object(n, amount)
        roll = rng.random()
        # A model split over two (four) GPUs of one node.
        count = 2 if roll < args.two_gpu else 4 if roll < args.two_gpu + args.four_gpu else 1
        if count > 1:
            claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = count
            multi += 1
        claims.append(claim)
    policy = POLICIES[args.policy]
    ids = iter(range(1 << 62))
    placed = 0
    over_quota = 0
    first_examined = 0
    t3 = time.perf_counter()
    for n, claim in enumerate(claims):
        outcome = state.allocate(
            claim, policy=policy, share_id=lambda: f"s-{next(ids)}", quota=quota
        )
        placed += outcome.allocation is not None
        over_quota += outcome.failure == "quota"
        if n == 0:
            first_examined = state.examined
    t4 = time.perf_counter()
    seconds = t4 - t3
    print(f"cluster: {args.nodes} nodes x 8 GPUs = {len(state.devices)} devices")
    print(f"slices built in {t1 - t0:.2f} s, state parsed in {t2 - t1:.2f} s")
    print(
        f"{args.claims} claims ({args.two_gpu:.0%} two-GPU, {args.four_gpu:.0%} four-GPU,"
        f" {args.policy}), {placed} placed,"
        f" in {seconds:.2f} s: {args.claims / seconds:.0f} claims/s"
        f" (first claim incl. CEL matching of every device: {first_examined} examined)"
    )
    print(f"devices examined per claim: {state.examined / args.claims:.1f}")
    if multi:
        print(f"alone keys walked per multi-device claim: {state.walked / multi:.1f}")
    if quota is not None:
        print(
            f"quota {args.quota}: {over_quota} claims refused for it,"
            f" {float(state.memory_held('sim')) / GI:.0f}Gi held"
        )
    print(f"memory placed: {sum(memory) / GI:.0f}Gi")


if __name__ == "__main__":
    main()
