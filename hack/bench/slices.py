#!/usr/bin/env python3
"""Benchmark building and publishing the ResourceSlices of a big MIG node.

An 8 x H200-141GB node with MIG enabled on every GPU (every placement of
every profile published as a partitionable device, Kubernetes 1.36 rules),
published with the real publisher and official client over HTTP to the fake
API server from the tests. Printed: the time to build (and check against our
API rules), the first publish (creates), an unchanged republish (one LIST, no
write) and a republish after a change (every slice updated, generation + 1).

Usage:   .venv/bin/python hack/bench/slices.py [--gpus 8] [--model h200-141gb] [--rounds 5]
Target:  build + first publish under 1 s on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slices import build_slices, validate_pool
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.objects import node_object
from dra_driver.k8s.client import make_api_client
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.k8s.transport import api_transport
from tests.support.fakekube import FakeKubeApi

DRIVER = "gpu.fractional.dev"
NODE = "bench-node"


async def one_round(model: str, gpus: int) -> dict[str, float]:
    caps = Capabilities.for_version(36)
    with FakeKubeApi(kube_minor=36) as api:
        api.create(node_object(NODE))
        http = api_transport(make_api_client(None, host=api.url))
        publisher = SlicePublisher(http, driver_name=DRIVER, node_name=NODE)
        try:
            t0 = time.perf_counter()
            inventory = await FakeGpuBackend(f"{model}:{gpus}:mig", NODE).inventory()
            t1 = time.perf_counter()
            slices = build_slices(inventory, driver_name=DRIVER, node_name=NODE,
                                  settings=NodeSettings(), capabilities=caps)  # fmt: skip
            validate_pool([s.spec for s in slices], caps)
            t2 = time.perf_counter()
            first = await publisher.publish(slices)
            t3 = time.perf_counter()
            same = await publisher.publish(slices)
            t4 = time.perf_counter()
            changed = build_slices(
                dataclasses.replace(inventory, gpus=inventory.gpus[1:]),
                driver_name=DRIVER, node_name=NODE, settings=NodeSettings(), capabilities=caps,
            )  # fmt: skip
            t5 = time.perf_counter()
            after = await publisher.publish(changed)
            t6 = time.perf_counter()
        finally:
            await http.close()
    assert len(first.created) == len(slices) and not same.changed and after.generation == 2
    devices = sum(len(s.spec.get("devices", ())) for s in slices)
    return {
        "slices": len(slices),
        "devices": devices,
        "inventory": (t1 - t0) * 1000,
        "build": (t2 - t1) * 1000,
        "publish": (t3 - t2) * 1000,
        "republish_same": (t4 - t3) * 1000,
        "republish_changed": (t6 - t5) * 1000,
        "total_first": (t3 - t0) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--model", default="h200-141gb")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = [asyncio.run(one_round(args.model, args.gpus)) for _ in range(args.rounds)]
    first = rounds[0]
    print(
        f"{args.gpus} x {args.model}, MIG on, Kubernetes 1.36 rules: {first['slices']:.0f} slices,"
        f" {first['devices']:.0f} devices; median of {args.rounds} rounds, ms"
    )
    for key, label in (
        ("inventory", "fake inventory"),
        ("build", "build + validate slices"),
        ("publish", "first publish (creates)"),
        ("total_first", "inventory to published"),
        ("republish_same", "republish, unchanged"),
        ("republish_changed", "republish, changed"),
    ):
        print(f"  {label:<26} {statistics.median(r[key] for r in rounds):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
