#!/usr/bin/env python3
"""Benchmark NodePrepareResources + NodeUnprepareResources over the real socket.

The plugin runs in its own process (as on a node, apart from the kubelet),
with the fake GPU backend, an in-memory claim source, and its checkpoint and
CDI specs on the real disk (fsync included). The kubelet-like client, in this
process, runs C concurrent callers; each caller takes a claim, prepares it,
unprepares it, and moves on. Printed per concurrency level: prepare and
unprepare latency p50/p99 and claims/s (a claim counts once it is prepared
and unprepared).

Usage:       .venv/bin/python hack/bench/prepare.py [--claims N] [--concurrency 1,8,32]
Target here (2 cores): p99 under 20 ms at 8 callers, over 300 claims/s.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from dra_driver.core.ids import ClaimRef, ClaimUID
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.gpu.fake import FakeGpuBackend
from dra_driver.plugin.runtime import PluginConfig, PluginRuntime, run_until_signalled
from dra_driver.testing.kubelet import FakeKubelet
from dra_driver.testing.memory_claims import InMemoryClaimSource
from dra_driver.testing.objects import resource_claim, share

DRIVER = "gpu.fractional.dev"
NODE = "bench-node"
GPUS = 8


def make_claims(count: int) -> list[dict[str, Any]]:
    # Shares, so that any number of claims can be prepared at once.
    return [
        resource_claim(
            "bench",
            f"claim-{i}",
            node=NODE,
            devices=[share(f"gpu-{i % GPUS}")],
        )
        for i in range(count)
    ]


def serve(root: str, claims: list[dict[str, Any]], profile: str | None) -> None:
    config = PluginConfig(
        driver_name=DRIVER,
        node_name=NODE,
        registry_dir=os.path.join(root, "reg"),
        plugin_dir=os.path.join(root, "plugin"),
        cdi_root=os.path.join(root, "cdi"),
        boot_id_file=os.path.join(root, "boot_id"),
        # Time-sliced shares: this measures the engine and the socket, not MPS.
        settings=NodeSettings(default=GpuSettings(Sharing.TIMESLICING)),
    )
    runtime = PluginRuntime(
        config, FakeGpuBackend(f"h100-80gb:{GPUS}", NODE), InMemoryClaimSource(claims)
    )
    if profile is None:
        asyncio.run(run_until_signalled(runtime))
        return
    import cProfile  # noqa: PLC0415 - only when asked

    with cProfile.Profile() as profiler:
        asyncio.run(run_until_signalled(runtime))
    profiler.dump_stats(profile)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


async def run_level(
    registry: str, claims: list[dict[str, Any]], concurrency: int
) -> dict[str, float]:
    kubelet = FakeKubelet(registry)
    plugin = await kubelet.wait_for_plugin(DRIVER, timeout=30)
    refs = [
        ClaimRef(c["metadata"]["namespace"], c["metadata"]["name"], ClaimUID(c["metadata"]["uid"]))
        for c in claims
    ]
    prepare_ms: list[float] = []
    unprepare_ms: list[float] = []
    queue = list(refs)

    async def caller() -> None:
        while queue:
            ref = queue.pop()
            t0 = time.perf_counter()
            result = await plugin.prepare([ref])
            t1 = time.perf_counter()
            errors = await plugin.unprepare([ref])
            t2 = time.perf_counter()
            if result[ref.uid].error or errors[ref.uid]:
                raise RuntimeError(f"{ref}: {result[ref.uid].error or errors[ref.uid]}")
            prepare_ms.append((t1 - t0) * 1000)
            unprepare_ms.append((t2 - t1) * 1000)

    # Warm up the connection and the plugin's caches.
    for ref in refs[:20]:
        await plugin.prepare([ref])
        await plugin.unprepare([ref])
    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await kubelet.close()
    return {
        "concurrency": concurrency,
        "claims": len(refs),
        "prepare_p50": statistics.median(prepare_ms),
        "prepare_p99": percentile(prepare_ms, 99),
        "unprepare_p50": statistics.median(unprepare_ms),
        "unprepare_p99": percentile(unprepare_ms, 99),
        "claims_per_s": len(refs) / elapsed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=1000, help="claims per concurrency level")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated caller counts")
    parser.add_argument("--profile", help="write the plugin process's cProfile stats here")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    claims = make_claims(args.claims)

    rows = []
    with tempfile.TemporaryDirectory(prefix="dra-bench-", dir="/var/tmp") as root:
        with open(os.path.join(root, "boot_id"), "w", encoding="ascii") as handle:
            handle.write("bench\n")
        ctx = multiprocessing.get_context("spawn")
        plugin = ctx.Process(target=serve, args=(root, claims, args.profile), daemon=True)
        plugin.start()
        try:
            for level in levels:
                rows.append(asyncio.run(run_level(os.path.join(root, "reg"), claims, level)))
        finally:
            plugin.terminate()
            plugin.join(10)

    print(f"prepare+unprepare of one claim per call over the real socket, {os.cpu_count()} CPUs")
    header = "callers  claims  prepare p50/p99 ms  unprepare p50/p99 ms  claims/s"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['concurrency']:>7}  {r['claims']:>6}  "
            f"{r['prepare_p50']:>8.2f} / {r['prepare_p99']:<7.2f}  "
            f"{r['unprepare_p50']:>9.2f} / {r['unprepare_p99']:<8.2f}  {r['claims_per_s']:>8.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
