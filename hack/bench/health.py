#!/usr/bin/env python3
"""Benchmark device health: how fast an XID reaches the kubelet and the scheduler.

The real plugin runtime (in process, fake backend) publishes its ResourceSlices
with the real publisher and official client over HTTP to the fake API server
from the tests (Kubernetes 1.36 rules: device taints kept). A kubelet-like
client registers over the real sockets and watches the DRAResourceHealth
stream (v1); a thread watches the node's ResourceSlices over HTTP as an
informer would. Each round injects XID 79 (fatal) on one GPU, rotating over
the GPUs, and times until every device of that GPU is

* Unhealthy on the health stream (XID → stream), and
* tainted ``<driver>/unhealthy=xid-79`` in a slice the watch saw (XID → taint);

then resets the GPU (two liveness probes, called at once) and times the way
back (reset → stream healthy, reset → taint removed). ``--via-file`` injects
through the fault directory (``dra_driver/fakes/gpu_faults.py``) instead, as
the e2e test does: add its 0.5 s poll (0.25 s on average).

Everything shares one process (plugin, kubelet client, API server, watch):
the figures include their contention for the GIL, which separate processes
on a node would not have.

Usage:   .venv/bin/python hack/bench/health.py [--rounds 50] [--warmup 3] [--via-file]
Target:  none set; the figures are reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from dra_driver.app.plugin import Plugin, PluginConfig, PluginParts, SliceOptions, start_plugin
from dra_driver.core.settings import NodeSettings
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.gpu_faults import POLL_S
from dra_driver.fakes.kubelet import FakeKubelet, health_reports
from dra_driver.fakes.objects import node_object
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.client import make_api_client
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.k8s.transport import api_transport
from tests.support.fakekube import FakeKubeApi

DRIVER = "gpu.fractional.dev"
NODE = "bench-node"
TAINT_KEY = f"{DRIVER}/unhealthy"
XID = 79
TIMEOUT_S = 30.0
NODES = (
    ("8 x H200, MIG on", "h200-141gb:8:mig"),
    ("2 x H100", "h100-80gb:2"),
)

Seen = frozenset[str]


class Timeline:
    """What one observer saw, with when: (monotonic time, devices unhealthy or tainted)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.entries: list[tuple[float, Seen]] = []
        self._changed = asyncio.Event()

    def record(self, seen: Seen) -> None:
        """From the loop or from another thread."""
        self.entries.append((time.monotonic(), seen))
        self.loop.call_soon_threadsafe(self._changed.set)

    async def first(self, check: Callable[[Seen], bool], after: int) -> float:
        """When an entry from index ``after`` on first passed ``check``."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for when, seen in self.entries[after:]:
                if check(seen):
                    return when
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"not seen in {TIMEOUT_S:.0f}s; last: {self.entries[-1:]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)


def watch_taints(url: str, timeline: Timeline, stop: threading.Event) -> None:
    """Follow the node's ResourceSlices over HTTP; record the devices with our XID taint."""
    query = urllib.parse.urlencode({"watch": "true", "fieldSelector": f"spec.nodeName={NODE}"})
    tainted: dict[str, Seen] = {}
    last: Seen | None = None
    with urllib.request.urlopen(f"{url}/apis/resource.k8s.io/v1/resourceslices?{query}") as resp:
        for line in resp:
            if stop.is_set():
                return
            if not line.strip():
                continue
            event = json.loads(line)
            obj = event["object"]
            name = obj["metadata"]["name"]
            if event["type"] == "DELETED":
                tainted.pop(name, None)
            else:
                tainted[name] = frozenset(
                    d["name"]
                    for d in obj["spec"].get("devices") or []
                    if any(t.get("key") == TAINT_KEY for t in d.get("taints") or [])
                )
            now = frozenset().union(*tainted.values())
            if now != last:
                timeline.record(now)
                last = now


async def follow_stream(stream: AsyncIterator[Any], timeline: Timeline) -> None:
    async for message in stream:
        reports = health_reports(message)
        timeline.record(frozenset(n for n, r in reports.items() if r.health == "Unhealthy"))


@dataclasses.dataclass
class Result:
    label: str
    devices: int
    slices: int
    xid_stream: list[float] = dataclasses.field(default_factory=list)
    xid_taint: list[float] = dataclasses.field(default_factory=list)
    reset_stream: list[float] = dataclasses.field(default_factory=list)
    reset_taint: list[float] = dataclasses.field(default_factory=list)

    def columns(self) -> tuple[list[float], list[float], list[float], list[float]]:
        return self.xid_stream, self.xid_taint, self.reset_stream, self.reset_taint


def node_dirs() -> tuple[str, dict[str, str]]:
    """A short temporary root (socket paths are limited) with the plugin's directories."""
    root = tempfile.mkdtemp(prefix="dra-bench-", dir="/tmp")
    dirs = {name: os.path.join(root, name) for name in ("reg", "plugin", "cdi")}
    for path in dirs.values():
        os.makedirs(path)
    dirs["boot_id"] = os.path.join(root, "boot_id")
    with open(dirs["boot_id"], "w", encoding="ascii") as handle:
        handle.write("bench\n")
    dirs["health"] = os.path.join(dirs["plugin"], "fake-health")
    return root, dirs


async def bench_node(label: str, gpus: str, rounds: int, warmup: int, via_file: bool) -> Result:
    root, dirs = node_dirs()
    loop = asyncio.get_running_loop()
    with FakeKubeApi(kube_minor=36) as api:
        api.create(node_object(NODE))
        client = api_transport(make_api_client(None, host=api.url))
        publisher = SlicePublisher(client, driver_name=DRIVER, node_name=NODE)
        backend = FakeGpuBackend(gpus, NODE, health_dir=dirs["health"] if via_file else None)
        config = PluginConfig(
            driver_name=DRIVER,
            node_name=NODE,
            registry_dir=dirs["reg"],
            plugin_dir=dirs["plugin"],
            cdi_root=dirs["cdi"],
            boot_id_file=dirs["boot_id"],
            inventory_interval=0,
            settings=NodeSettings(),
            health_probe_interval=3600,  # the rounds probe by hand
        )
        probe = functools.partial(probe_capabilities, client, DRIVER, NODE)
        parts = PluginParts(config, backend, InMemoryClaimSource(), SliceOptions(publisher, probe))
        stop = threading.Event()
        kubelet = FakeKubelet(dirs["reg"])
        stream, taints = Timeline(loop), Timeline(loop)
        follower: asyncio.Task[None] | None = None
        runtime = await start_plugin(parts)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            follower = asyncio.create_task(follow_stream(plugin.watch_health("v1"), stream))
            threading.Thread(target=watch_taints, args=(api.url, taints, stop), daemon=True).start()
            await stream.first(lambda seen: True, 0)  # the first report
            await taints.first(lambda seen: True, 0)  # the first publish
            result = Result(label=label, devices=0, slices=0)
            rounds_of = Rounds(
                runtime, backend, stream, taints, dirs["health"] if via_file else None
            )
            for i in range(warmup + rounds):
                times = await rounds_of.one(i)
                if i >= warmup:
                    for values, ms in zip(result.columns(), times, strict=True):
                        values.append(ms)
            objects = api.objects("resourceslices")  # all published by now
            result.slices = len(objects)
            result.devices = sum(len(s["spec"].get("devices") or []) for s in objects)
            return result
        finally:
            stop.set()
            if follower is not None:
                follower.cancel()
                await asyncio.gather(follower, return_exceptions=True)
            await kubelet.close()
            await runtime.stop()
            await client.close()
            shutil.rmtree(root, ignore_errors=True)


@dataclasses.dataclass
class Rounds:
    runtime: Plugin
    backend: FakeGpuBackend
    stream: Timeline
    taints: Timeline
    health_dir: str | None
    """Inject through this fault directory (else in process)."""

    async def one(self, i: int) -> tuple[float, float, float, float]:
        """XID then reset on GPU ``i`` (modulo their number): the four latencies, ms."""
        monitor = self.runtime.health_monitor
        gpus = (await self.backend.inventory()).gpus
        index = i % len(gpus)
        gpu = gpus[index]
        hit = frozenset(d.device_name for d in monitor.devices() if d.gpu_uuid == gpu.uuid)

        def sick(seen: Seen) -> bool:
            return hit <= seen

        def well(seen: Seen) -> bool:
            return not hit & seen

        at = len(self.stream.entries), len(self.taints.entries)
        t0 = time.monotonic()
        if self.health_dir is not None:
            # At a random moment of the directory's poll, as a drop from outside would be.
            await asyncio.sleep(random.uniform(0, POLL_S))
            t0 = time.monotonic()
            await asyncio.to_thread(drop, self.health_dir, f"xid-{i}.json", gpu.device_name)
        else:
            self.backend.inject_xid(index, XID)
        xid_stream = await self.stream.first(sick, at[0]) - t0
        xid_taint = await self.taints.first(sick, at[1]) - t0

        at = len(self.stream.entries), len(self.taints.entries)
        t1 = time.monotonic()
        self.backend.inject_reset(index)
        await monitor.probe_once()  # the GPU is resetting
        await monitor.probe_once()  # it answers: the reset is seen
        reset_stream = await self.stream.first(well, at[0]) - t1
        reset_taint = await self.taints.first(well, at[1]) - t1
        return xid_stream * 1e3, xid_taint * 1e3, reset_stream * 1e3, reset_taint * 1e3


def drop(directory: str, name: str, gpu: str) -> None:
    path = os.path.join(directory, name)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump({"gpu": gpu, "xid": XID}, handle)
    os.replace(path + ".tmp", path)


def p50_p99(values: list[float]) -> str:
    p99 = statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else 0
    return f"{statistics.median(values):6.1f} /{p99:6.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="XIDs per node (counted)")
    parser.add_argument("--warmup", type=int, default=3, help="XIDs per node before counting")
    parser.add_argument("--via-file", action="store_true", help="inject through the fault dir")
    parser.add_argument("--log-level", default="ERROR", help="the plugin's log level")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level)
    results = [
        asyncio.run(bench_node(label, gpus, args.rounds, args.warmup, args.via_file))
        for label, gpus in NODES
    ]
    how = "through the fault directory" if args.via_file else "in process"
    print(
        f"XID {XID} injected {how}, {args.rounds} rounds per node (after {args.warmup} warm-up),"
        " a GPU reset between; Kubernetes 1.36 rules; p50 / p99, ms"
    )
    header = (
        f"{'node':<18} {'devices':>7} {'slices':>6}  {'XID -> stream':>15}  {'XID -> taint':>15}"
        f"  {'reset -> stream':>15}  {'reset -> untaint':>16}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.label:<18} {r.devices:>7} {r.slices:>6}  {p50_p99(r.xid_stream):>15}"
            f"  {p50_p99(r.xid_taint):>15}  {p50_p99(r.reset_stream):>15}"
            f"  {p50_p99(r.reset_taint):>16}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
