#!/usr/bin/env python3
"""The controller path at cluster scale: ``dra-driver controller`` against a fake API server.

The fake API server (the tests' ``FakeKubeApi``: Kubernetes 1.36 rules, every HTTP
write checked against the official schema, as a real server does) runs in a process of
its own and serves HTTPS with a self-signed CA. It holds NODES Nodes, each publishing
the driver's own ResourceSlices (the real slice builder, 1.36 capabilities) for 8 fake
H100s, controller-managed; one node in ten has one of its 8 in MIG mode (a MIG GPU is
never shared: it shows that the allocator passes it by). The controller is the real
``dra-driver controller`` process, reading a kubeconfig with the CA.

A run: CLAIMS claims of ``share.gpu.fractional.dev`` (no capacity request; a GpuShare
config of 4, 10, 20 or 40 Gi, drawn with a fixed seed), each with an unscheduled pod,
created in the fake's process straight into its store (the watch sees them as it sees
any write) either as a burst (all at once) or as a steady stream (``--rate`` per
second). Each run has a fresh API server and a fresh controller. Printed per run:

* claims allocated per second end to end: claims over the time from the first pod
  created to the last allocation written (the answer to the claim's ``/status``
  PATCH, from the fake's answer log);
* p50 / p99 of each claim's pod created -> allocation written;
* API requests per claim by kind, from the fake's request log (long watches and
  the Lease's renewals shown apart), and the claim writes per claim;
* when the pods were all created and when the first allocation was written;
* the controller's CPU seconds per claim (``/proc/<pid>/stat``, during the run) and
  its RSS at the end (its peak, and once synced before the claims); beside it the
  fake API server's CPU per claim (making the claims and pods included); and each
  process's CPU per claim until the last allocation (what sets the rate and the
  latencies: the Events are sent after it);
* the GPUs the shares landed on against the lower bound (sum of shares / the memory
  of one GPU, rounded up);
* the load average beside each run (the machine is shared).

``--profile DIR`` runs the controller under ``cProfile`` (one file per run: read
with ``python -m pstats``). ``--no-schema`` (a diagnostic, not a figure to quote
against the targets) turns the fake's schema check off: on two cores the fake's own
CPU per claim is more than the controller's, and this shows how much of a run's
rate is the fake's.

The controller runs with the chart's defaults: no ``Allocated`` Event per claim
(``--allocation-events`` turns them on, and the run waits for them).
``hack/bench/controller_cluster.py`` measures against a real API server and scheduler,
beside the native path.

Usage:   .venv/bin/python hack/bench/controller.py [--nodes 50] [--claims 600]
             [--modes burst,stream] [--rate 200] [--quick] [--json FILE] [--profile DIR]
             [--allocation-events]
Targets (issue 24, 2 cores): >= 200 claims/s at 50 nodes x 8 GPUs, >= 100/s at 500
nodes; p99 create->allocated <= 2 s for a 600-claim burst at 50 nodes; <= 2 claim
writes per claim; GPUs used <= 1.1 x the lower bound; RSS <= 120 MB at 500 nodes and
5,000 claims.
"""

# ruff: noqa: PLC0415 - the fake's process imports the tests' fake; the driver does not.
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

from tests.support.processes import stop_process  # noqa: E402  (ROOT first)

DRIVER = "gpu.fractional.dev"
NAMESPACE = "bench"
GI = 1024**3
SHARES = ("4Gi", "10Gi", "20Gi", "40Gi")
SEED = 24
QUICK = {"nodes": 5, "claims": 30}
JsonObj = dict[str, Any]


# -- the pure arithmetic ------------------------------------------------------------------


def share_mix(count: int, seed: int = SEED) -> list[str]:
    """The memory of each claim's share, the same sequence for every run of a seed."""
    rng = random.Random(seed)
    return [rng.choice(SHARES) for _ in range(count)]


def gibibytes(quantity: str) -> int:
    """``"10Gi"`` -> bytes (the mix is in Gi only)."""
    if not quantity.endswith("Gi"):
        raise ValueError(f"{quantity!r} is not a quantity in Gi")
    return int(quantity[:-2]) * GI


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by the nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def throughput(created: Sequence[float], allocated: Sequence[float]) -> float:
    """Claims per second end to end: the claims allocated over the time from the first
    pod created to the last allocation written."""
    if not allocated or not created:
        return 0.0
    span = max(allocated) - min(created)
    return len(allocated) / span if span > 0 else float("inf")


def lower_bound(shares: Iterable[int], gpu_memory: int) -> int:
    """The fewest GPUs of ``gpu_memory`` bytes that could hold these shares."""
    return math.ceil(sum(shares) / gpu_memory)


def pairing_bound(shares: Iterable[int], gpu_memory: int) -> int:
    """A tighter lower bound than :func:`lower_bound`: no two shares of more than half a
    GPU fit on one, so there are at least as many GPUs as such shares (the mix's 40 Gi
    shares on 79.6 GiB H100s)."""
    held = list(shares)
    over_half = sum(1 for share in held if 2 * share > gpu_memory)
    return max(lower_bound(held, gpu_memory), over_half)


def request_kind(method: str, path: str, query: Mapping[str, Sequence[str]]) -> str:
    """``PATCH resourceclaims/status``, ``POST events``, ``WATCH pods``, ``LIST nodes``..."""
    parts = [p for p in path.split("/") if p]
    # /api/v1/... or /apis/<group>/<version>/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    if not rest:
        return f"{method} {path}"
    name = "/".join([rest[0], *rest[2:3]])
    if method == "GET" and len(rest) == 1:
        watching = (query.get("watch") or [""])[-1] in ("true", "1")
        return f"{'WATCH' if watching else 'LIST'} {name}"
    return f"{method} {name}"


def per_claim(kinds: Counter[str], claims: int) -> dict[str, float]:
    return {k: v / claims for k, v in sorted(kinds.items())} if claims else {}


CLAIM_WRITES = ("PATCH resourceclaims", "PATCH resourceclaims/status", "PUT resourceclaims")


def claim_writes(by_kind: Mapping[str, float]) -> float:
    """Writes of the claims themselves per claim (finalizer, allocation): Events and the
    Lease are not the claim's."""
    return sum(v for k, v in by_kind.items() if k in CLAIM_WRITES)


def cpu_ticks(stat: str) -> int:
    """utime + stime from a ``/proc/<pid>/stat`` line (fields 14 and 15; the command
    name in parentheses may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def status_kib(status: str, field: str) -> int:
    """A ``kB`` field (``VmRSS``, ``VmHWM``) of ``/proc/<pid>/status``."""
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/<pid>/status")


# -- the fake API server's process --------------------------------------------------------


def node_gpus(index: int) -> str:
    """8 H100s; one node in ten has one of them in MIG mode."""
    return "h100-80gb:7,h100-80gb:1:mig" if index % 10 == 0 else "h100-80gb:8"


def seed(api: Any, nodes: int) -> int:
    """Nodes, their slices, the class and the namespace; the memory of one shared GPU."""
    from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
    from dra_driver.core.slices import build_slices
    from dra_driver.fakes.gpu import build_inventory, load_spec
    from tests.support.controller_env import share_class

    gpu_memory = 0
    for i in range(nodes):
        node = f"node-{i:04d}"
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        for d in build_slices(
            build_inventory(load_spec(node_gpus(i)), node),
            driver_name=DRIVER,
            node_name=node,
            settings=NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER)),
            capabilities=Capabilities.for_version(36),
        ):
            spec = dict(d.spec)
            for device in spec.get("devices") or []:
                if device.get("allowMultipleAllocations"):
                    memory = (device.get("capacity") or {}).get("memory", {}).get("value", "0")
                    from dra_driver.base.quantity import parse_quantity

                    gpu_memory = max(gpu_memory, int(parse_quantity(str(memory))))
            api.create(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{node}-{DRIVER}-{d.key}"},
                    "spec": spec,
                }
            )
    api.create(share_class())
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    return gpu_memory


def claim_and_pod(name: str, memory: str) -> tuple[JsonObj, JsonObj]:
    share = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuShare", "memory": memory}
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "share.gpu.fractional.dev"}}
                ],
                "config": [
                    {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": share}}
                ],
            }
        },
    }
    container = {"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
        "status": {"phase": "Pending"},
    }
    return claim, pod


def controller_ready(api: Any) -> bool:
    """The controller holds the Lease and watches every kind it lists."""
    watched = {
        request_kind(r.method, r.path, r.query).split(" ", 1)[1]
        for r in api.request_log
        if r.method == "GET" and (r.query.get("watch") or [""])[-1] in ("true", "1")
    }
    kinds = {"resourceclaims", "pods", "resourceslices", "deviceclasses", "nodes", "namespaces"}
    leases = [
        lease for lease in api.objects("Lease") if (lease.get("spec") or {}).get("holderIdentity")
    ]
    return kinds <= watched and bool(leases)


def allocated_at(answers: Iterable[Any], names: set[str], done: dict[str, float]) -> None:
    """Add to ``done`` claim name -> when its allocation was written (its first answered
    /status PATCH), from ``answers`` (the fake's answer log, or the part not read yet)."""
    for answer in answers:
        r = answer.request
        if r.method != "PATCH" or not r.path.endswith("/status") or answer.code >= 300:
            continue
        name = r.path.rsplit("/", 2)[-2]
        if name in names and name not in done:
            done[name] = answer.at


EVENTS_WAIT_S = 60.0
"""How long a run waits, after its last allocation, for the claims' Events."""
EVENTS_QUIET_S = 3.0
"""...and no longer than this without a new one (the controller dropped the rest)."""


def events_written(answers: Iterable[Any]) -> list[float]:
    """When each Event was written (its answered POST), from the fake's answer log."""
    return [
        a.at
        for a in answers
        if a.request.method == "POST" and a.request.path.endswith("/events") and a.code < 300
    ]


def wait_for_events(api: Any, wanted: int, deadline: float) -> list[float]:
    """When each Event was written, once ``wanted`` are (one per allocated claim), or at
    ``deadline``, or after :data:`EVENTS_QUIET_S` without a new one."""
    written: list[float] = []
    read = 0  # each poll reads only the answers not looked at yet
    last_new = time.monotonic()
    while len(written) < wanted:
        answers = api.answer_log
        new = events_written(answers[read:])
        read = len(answers)
        written += new
        now = time.monotonic()
        last_new = now if new else last_new
        if now >= deadline or now - last_new >= EVENTS_QUIET_S:
            break
        time.sleep(0.05)
    return written


def run_load(api: Any, spec: Mapping[str, Any], gpu_memory: int) -> JsonObj:
    count, rate, mode = int(spec["claims"]), float(spec["rate"]), str(spec["mode"])
    memory = share_mix(count)
    names = [f"claim-{i:05d}" for i in range(count)]
    api.clear_requests()
    controller_pid = int(spec["controller_pid"])
    hz = os.sysconf("SC_CLK_TCK")

    def ticks() -> tuple[int, int]:
        return (
            cpu_ticks(proc_file(controller_pid, "stat")),
            cpu_ticks(proc_file(os.getpid(), "stat")),
        )

    ticks_before = ticks()
    created: dict[str, float] = {}
    started = time.monotonic()
    for i, (name, amount) in enumerate(zip(names, memory, strict=True)):
        if mode == "stream":
            # One reading of the clock: read twice, a loaded machine passed ``due``
            # between the two and the sleep was negative (ValueError, the run lost).
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        claim, pod = claim_and_pod(name, amount)
        api.create(claim)
        api.create(pod)
        created[name] = time.monotonic()
    wanted = set(names)
    deadline = time.monotonic() + float(spec["timeout_s"])
    done: dict[str, float] = {}
    read = 0  # the answers looked at so far: each poll reads only the new ones
    while True:
        answers = api.answer_log
        allocated_at(answers[read:], wanted, done)
        read = len(answers)
        if len(done) >= count or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    # The CPU spent until the last allocation, before the Events (sent after it):
    # the cost of the path that sets claims/s and the latencies.
    ticks_allocated = ticks()
    # The Events are sent after the allocations: their cost is part of the run's.
    wanted_events = len(done) if spec.get("allocation_events") else 0
    events = wait_for_events(api, wanted_events, time.monotonic() + EVENTS_WAIT_S)
    time.sleep(0.3)  # the Events and finalizers in flight land in the log too
    latencies = [done[n] - created[n] for n in names if n in done]
    kinds: Counter[str] = Counter(request_kind(r.method, r.path, r.query) for r in api.request_log)
    devices: set[tuple[str, str]] = set()
    shares: list[int] = []
    for claim in api.objects("ResourceClaim", NAMESPACE, copies=False):  # read only
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        for result in allocation["devices"]["results"]:
            devices.add((result["pool"], result["device"]))
    shares = [gibibytes(m) for n, m in zip(names, memory, strict=True) if n in done]
    return {
        "claims": count,
        "allocated": len(done),
        "claims_per_s": throughput(list(created.values()), list(done.values())),
        "events_written": len(events),
        "events_done_s": max(events) - min(created.values()) if events else None,
        "allocations_done_s": max(done.values()) - min(created.values()) if done else None,
        "created_s": max(created.values()) - min(created.values()),
        "first_allocation_s": min(done.values()) - min(created.values()) if done else None,
        "allocating_cpu_ms_per_claim": [
            1000 * (after - before) / hz / max(1, len(done))
            for before, after in zip(ticks_before, ticks_allocated, strict=True)
        ],
        "p50_s": percentile(latencies, 0.5),
        "p99_s": percentile(latencies, 0.99),
        "requests_per_claim": per_claim(kinds, count),
        "gpus_used": len(devices),
        "gpus_lower_bound": lower_bound(shares, gpu_memory) if gpu_memory else 0,
        "gpus_pairing_bound": pairing_bound(shares, gpu_memory) if gpu_memory else 0,
    }


def serve_api(spec: Mapping[str, Any]) -> int:
    """The fake API server's process: seed, print the URL and CA as one JSON line, wait
    for the controller, then for one load line on stdin; print its figures as one line."""
    from tests.support.fakekube import FakeKubeApi
    from tests.support.tls import self_signed, server_context

    pair = self_signed(spec["tls_dir"])
    # A watch cache that keeps the whole run: a watcher never falls behind and relists
    # (a real one keeps minutes of history; the fake counts events).
    with FakeKubeApi(
        kube_minor=36,
        tls=server_context(pair),
        history_limit=10**7,
        validate_schema=bool(spec.get("schema", True)),
    ) as api:
        gpu_memory = seed(api, int(spec["nodes"]))
        print(json.dumps({"url": api.url, "ca": pair.cert}), flush=True)
        load = json.loads(sys.stdin.readline())
        deadline = time.monotonic() + 120
        while not controller_ready(api):
            if time.monotonic() > deadline:
                print(json.dumps({"error": "the controller did not start"}), flush=True)
                return 1
            time.sleep(0.05)
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()  # go
        print(json.dumps(run_load(api, load, gpu_memory)), flush=True)
        sys.stdin.read()  # until the benchmark closes it
    return 0


# -- the benchmark's driver ---------------------------------------------------------------


def read_line(proc: subprocess.Popen[str]) -> JsonObj:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the fake API server exited with {proc.wait()}")
    answer: JsonObj = json.loads(line)
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer


def send_line(proc: subprocess.Popen[str], obj: object) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(obj) + "\n")
    proc.stdin.flush()


def proc_file(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/{name}", encoding="ascii") as f:
        return f.read()


TRACED = """
import atexit, runpy, sys, tracemalloc
heap, frames, sys.argv = sys.argv[1], int(sys.argv[2]), ["dra_driver", *sys.argv[3:]]
tracemalloc.start(frames)
def dump():
    tracemalloc.take_snapshot().dump(heap)
    with open(heap + ".peak", "w") as f:
        f.write("%d %d\n" % tracemalloc.get_traced_memory())
atexit.register(dump)
runpy.run_module("dra_driver", run_name="__main__")
"""
"""The controller under tracemalloc (``--tracemalloc``): its heap written at exit."""


def start_controller(
    root: str,
    kubeconfig: str,
    label: str,
    profile: str | None,
    traced: str | None = None,
    *,
    allocation_events: bool = False,
) -> subprocess.Popen[bytes]:
    """``dra-driver controller`` (its log in a file, as a container's is); with
    ``allocation_events`` an ``Allocated`` Event per claim (the chart's default: none)."""
    runner = [sys.executable]
    if profile:
        os.makedirs(profile, exist_ok=True)
        runner += ["-m", "cProfile", "-o", os.path.join(profile, f"controller-{label}.prof")]
    if traced:
        os.makedirs(traced, exist_ok=True)
        runner += ["-c", TRACED, os.path.join(traced, f"controller-{label}.heap"), "4"]
    with open(os.path.join(root, f"controller-{label}.log"), "ab") as log:
        return subprocess.Popen(
            [
                *runner,
                *(() if traced else ("-m", "dra_driver")),
                *("controller", "--kubeconfig", kubeconfig),
                *("--driver-name", DRIVER, "--lease-namespace", "default"),
                *("--pod-name", "bench", "--log-level", "INFO"),
                *("--allocation-events", "true" if allocation_events else "false"),
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


@dataclass(frozen=True)
class RunSpec:
    nodes: int
    claims: int
    mode: str
    """``burst`` or ``stream``."""
    rate: float
    """Claims per second of a stream."""
    timeout_s: float
    schema: bool = True
    """The fake checks every write against the schema, as a real server does."""
    allocation_events: bool = False
    """The controller writes an ``Allocated`` Event per claim (off in the chart)."""


def one_run(root: str, run: RunSpec, profile: str | None, traced: str | None = None) -> JsonObj:
    from tests.support.node import write_kubeconfig

    nodes, claims, mode, rate = run.nodes, run.claims, run.mode, run.rate
    label = f"{nodes}n-{claims}c-{mode}"
    api = subprocess.Popen(
        [
            *(sys.executable, os.path.abspath(__file__)),
            "--serve-api",
            json.dumps(
                {"nodes": nodes, "tls_dir": os.path.join(root, label), "schema": run.schema}
            ),
        ],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    controller: subprocess.Popen[bytes] | None = None
    try:
        where = read_line(api)
        kubeconfig = os.path.join(root, label, "kubeconfig")
        write_kubeconfig(kubeconfig, where["url"], "bench-token", ca=where["ca"])
        controller = start_controller(
            root, kubeconfig, label, profile, traced, allocation_events=run.allocation_events
        )
        send_line(
            api,
            {
                "claims": claims,
                "mode": mode,
                "rate": rate,
                "timeout_s": run.timeout_s,
                "controller_pid": controller.pid,
                "allocation_events": run.allocation_events,
            },
        )
        read_line(api)  # ready
        ready_rss = status_kib(proc_file(controller.pid, "status"), "VmRSS") / 1024
        ticks = cpu_ticks(proc_file(controller.pid, "stat"))
        api_ticks = cpu_ticks(proc_file(api.pid, "stat"))
        send_line(api, "go")
        figures = read_line(api)
        hz = os.sysconf("SC_CLK_TCK")
        spent = (cpu_ticks(proc_file(controller.pid, "stat")) - ticks) / hz
        # The fake's own figure includes making the claims and pods and watching for
        # the allocations: an upper bound on what serving the controller cost it.
        api_spent = (cpu_ticks(proc_file(api.pid, "stat")) - api_ticks) / hz
        status = proc_file(controller.pid, "status")
        figures |= {
            "label": label,
            "nodes": nodes,
            "mode": mode,
            "schema": run.schema,
            "rate": rate if mode == "stream" else None,
            "cpu_ms_per_claim": 1000 * spent / claims,
            "api_cpu_ms_per_claim": 1000 * api_spent / claims,
            "ready_rss_mb": ready_rss,
            "rss_mb": status_kib(status, "VmRSS") / 1024,
            "peak_rss_mb": status_kib(status, "VmHWM") / 1024,
            "load": os.getloadavg()[0],
        }
        if controller.poll() is not None:
            raise RuntimeError(f"the controller exited with {controller.returncode}")
        return figures
    finally:
        stop_process(controller, 30)
        if api.poll() is None and api.stdin is not None:
            api.stdin.close()
        try:
            api.wait(30)
        except subprocess.TimeoutExpired:
            api.kill()
            api.wait()


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def report(run: Mapping[str, Any]) -> str:
    by_kind = run["requests_per_claim"]
    shown = ", ".join(
        f"{k} {v:.2f}"
        for k, v in by_kind.items()
        if not k.startswith(("WATCH", "LIST")) and "leases" not in k
    )
    bound = run["gpus_lower_bound"]
    ratio = run["gpus_used"] / bound if bound else 0.0
    pairing = run.get("gpus_pairing_bound") or 0
    optimum = run["gpus_used"] / pairing if pairing else 0.0
    stream = f" at {run['rate']:.0f}/s" if run["rate"] else ""
    allocating = run["allocating_cpu_ms_per_claim"]
    if not run["schema"]:
        stream += ", the fake's schema check off"
    return "\n".join(
        [
            f"{run['nodes']} nodes, {run['claims']} claims, {run['mode']}{stream}"
            f"   (load average {run['load']:.2f})",
            f"  allocated            {run['allocated']} of {run['claims']}",
            f"  claims/s             {run['claims_per_s']:.1f}",
            f"  pods created in      {seconds(run['created_s'])}; the first allocation"
            f" {seconds(run['first_allocation_s'])} after the first pod",
            f"  done                 allocations {seconds(run['allocations_done_s'])},"
            f" their Events {seconds(run['events_done_s'])} after the first pod"
            f" ({run['events_written']} Events written)",
            f"  latency p50 / p99    {1000 * run['p50_s']:.0f} / {1000 * run['p99_s']:.0f} ms",
            f"  requests per claim   {shown}",
            f"  claim writes/claim   {claim_writes(by_kind):.2f}",
            f"  controller CPU       {run['cpu_ms_per_claim']:.2f} ms per claim"
            f" (the fake API server's, load included: {run['api_cpu_ms_per_claim']:.2f});"
            f" until the last allocation {allocating[0]:.2f} (the fake's {allocating[1]:.2f})",
            f"  controller RSS       {run['rss_mb']:.0f} MB (peak {run['peak_rss_mb']:.0f} MB;"
            f" {run['ready_rss_mb']:.0f} MB synced, before the claims)",
            f"  GPUs used            {run['gpus_used']} (lower bound {bound}, {ratio:.3f}x;"
            f" at least {pairing} for the shares over half a GPU, {optimum:.3f}x)",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--claims", type=int, default=600)
    parser.add_argument("--modes", default="burst,stream", help="burst, stream or both")
    parser.add_argument("--rate", type=float, default=200.0, help="claims/s of the stream")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a run waits for its allocations"
    )
    parser.add_argument(
        "--no-schema",
        action="store_true",
        help="diagnostic: the fake skips its schema check of writes (less of its CPU)",
    )
    parser.add_argument(
        "--allocation-events",
        action="store_true",
        help="the controller writes an Allocated Event per claim (the chart's default: none)",
    )
    parser.add_argument("--quick", action="store_true", help="5 nodes, 30 claims (a test)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--profile", help="run the controller under cProfile; files here")
    parser.add_argument(
        "--tracemalloc",
        help="run the controller under tracemalloc; its heap at exit written here"
        " (read with tracemalloc.Snapshot.load)",
    )
    parser.add_argument("--serve-api", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_api:
        return serve_api(json.loads(args.serve_api))
    if args.quick:
        args.nodes, args.claims = QUICK["nodes"], QUICK["claims"]
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in ("burst", "stream"):
            parser.error(f"--modes: {mode!r} is neither burst nor stream")
    root = tempfile.mkdtemp(prefix="dra-bench-controller-", dir="/var/tmp")
    runs = []
    try:
        for mode in modes:
            spec = RunSpec(
                args.nodes,
                args.claims,
                mode,
                args.rate,
                args.timeout,
                not args.no_schema,
                args.allocation_events,
            )
            run = one_run(root, spec, args.profile, args.tracemalloc)
            print(report(run), flush=True)
            runs.append(run)
    finally:
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(runs, f, indent=1)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
