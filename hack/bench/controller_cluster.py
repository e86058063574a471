#!/usr/bin/env python3
"""The controller path against the native path on a real API server, side by side.

A real control plane (kube-apiserver, kube-scheduler, kube-controller-manager; no
kubelet is needed) and a kubeconfig that may create Nodes, ResourceSlices,
DeviceClasses, Namespaces and pods. The benchmark creates 2 x NODES kubelet-less Node
objects (Ready, no taints), each with the ResourceSlice the driver's plugin would
publish for 8 fake H100-80GB (the real slice builder, the cluster's release): NODES
with their GPUs published for the kube-scheduler (``allocator: scheduler``, consumable
capacity) and NODES for the controller (``allocator: controller``). It starts
``dra-driver controller`` as a process of its own with the chart's flags (batch window
0.2 s, no ``Allocated`` Events, a Lease of its own), and creates the chart's
DeviceClasses where the cluster lacks them.

Each run has two phases, one per path, in alternating order (run 1 native first, run
2 the controller path first, ...), each in a namespace of its own with four
ResourceClaimTemplates (4, 10, 20 and 40 Gi of memory as a capacity request; the
native ones also select ``allocator == "scheduler"`` devices, the controller path's
ask ``share.gpu.fractional.dev``). A phase creates PODS pods as a burst (8 client
threads), each with a claim from a template drawn with a fixed seed, and waits until
every pod is bound. Printed per phase:

* pods bound per second (pods over the time from the first create to the last bind);
* p50 / p99 of each pod's create -> its claim allocated, and create -> bound (from
  watches of the pods and claims, this process's clock);
* the API server's writes per pod by verb, resource and subresource: the difference
  of ``apiserver_request_total`` (``kubectl get --raw /metrics``) from just before
  the first create to 2 s after the last bind, Leases left out; the pods' own create
  is the benchmark's;
* GPUs used against the lower bound (the shares' memory over one GPU's) and the
  bound that counts shares over half a GPU;
* the controller's CPU seconds during the phase and its RSS (peak), on either path
  (on the native path it only watches).

Between phases the pods are force-deleted (no kubelet ends them) and the namespace
is deleted and waited for, so the controller manager's deallocations fall outside the
next phase's window. Everything made is removed at the end, also on failure.

Usage:   .venv/bin/python hack/bench/controller_cluster.py --kubeconfig PATH
             [--nodes 50] [--pods 600] [--runs 1] [--first-run 1] [--json FILE]
Needs:   kubectl on PATH (the metrics), hack/bin/helm or helm on PATH (the chart's
         DeviceClasses). On the project's one-node cluster see
         ../shared/cluster/README.md (API_QPS=500 lifts the scheduler's and controller
         manager's client limits).
"""

# ruff: noqa: PLC0415 - kubernetes and the driver's modules load after the arguments.
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import controller as fake_bench  # noqa: E402  (the fake-server benchmark's arithmetic)

from tests.support.processes import stop_process  # noqa: E402

DRIVER = "gpu.fractional.dev"
NATIVE_CLASS = "gpu.fractional.dev"
SHARE_CLASS = "share.gpu.fractional.dev"
MARK = "fractional.dev/bench"
"""Label of the Nodes (and value of the Namespaces' label) this benchmark makes."""
LEASE = "fgd-bench-controller"
PATHS = ("native", "controller")
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
SETTLE_S = 2.0
"""After the last bind: the Events and writes in flight land before the metrics are read."""
JsonObj = dict[str, Any]


# -- the pure parts -----------------------------------------------------------------------


_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def request_totals(metrics: str) -> Counter[tuple[str, str, str]]:
    """``apiserver_request_total`` summed over codes and versions, by (verb, resource,
    subresource), from the API server's Prometheus text."""
    totals: Counter[tuple[str, str, str]] = Counter()
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        totals[key] += int(float(match["value"]))
    return totals


def writes_between(
    before: Counter[tuple[str, str, str]], after: Counter[tuple[str, str, str]]
) -> dict[str, int]:
    """The writes the API server answered between two readings, by ``VERB resource[/sub]``;
    Leases (leader election and node heartbeats: not the pods') left out."""
    writes: dict[str, int] = {}
    for (verb, resource, sub), count in sorted(after.items()):
        if verb not in WRITE_VERBS or resource == "leases":
            continue
        grown = count - before.get((verb, resource, sub), 0)
        if grown > 0:
            writes[f"{verb} {resource}" + (f"/{sub}" if sub else "")] = grown
    return writes


def rate(created: Iterable[float], done: Iterable[float]) -> float:
    """Per second: how many are done over the time from the first created to the last done."""
    return fake_bench.throughput(list(created), list(done))


def template_name(memory: str) -> str:
    return f"share-{memory.lower()}"


def claim_template(path: str, memory: str) -> JsonObj:
    """A template asking ``memory`` of a GPU as a capacity request, on ``path``."""
    exactly: JsonObj = {"capacity": {"requests": {"memory": memory}}}
    if path == "native":
        allocator = f'device.attributes["{DRIVER}"].allocator == "scheduler"'
        exactly |= {
            "deviceClassName": NATIVE_CLASS,
            "selectors": [{"cel": {"expression": allocator}}],
        }
    else:
        exactly["deviceClassName"] = SHARE_CLASS
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(memory)},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def pod_object(name: str, memory: str, image: str) -> JsonObj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name(memory)}],
        },
    }


def owner_pod(claim: Mapping[str, Any]) -> str | None:
    """The pod a template's claim belongs to (its controlling ownerReference)."""
    for ref in (claim.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Pod" and ref.get("controller"):
            return str(ref.get("name"))
    return None


def gpus_used(claims: Iterable[Mapping[str, Any]]) -> int:
    """Distinct devices the claims' allocations landed on."""
    devices = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            devices.add((result["pool"], result["device"]))
    return len(devices)


# -- the cluster side ---------------------------------------------------------------------


@dataclass
class Cluster:
    """The official client, and what this benchmark made (removed by :meth:`clean`)."""

    kubeconfig: str
    api: Any = None
    core: Any = None
    custom: Any = None
    nodes: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    minor: int = 36

    def __post_init__(self) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=self.kubeconfig)
        self.api.configuration.connection_pool_maxsize = 16
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        version = client.VersionApi(self.api).get_code()
        self.minor = int(re.sub(r"\D", "", version.minor))

    def kubectl(self, *args: str) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, *args],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def metrics(self) -> Counter[tuple[str, str, str]]:
        return request_totals(self.kubectl("get", "--raw", "/metrics"))

    def resource(self, plural: str, body: JsonObj, namespace: str | None = None) -> None:
        group, version = body["apiVersion"].split("/")
        if namespace is None:
            self.custom.create_cluster_custom_object(group, version, plural, body)
        else:
            self.custom.create_namespaced_custom_object(group, version, namespace, plural, body)

    # --- nodes and slices ---

    def add_node(self, name: str, allocator: str) -> int:
        """A kubelet-less Ready Node and the slice the plugin would publish for it; the
        memory of one of its shareable GPUs."""
        from dra_driver.base.quantity import parse_quantity
        from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
        from dra_driver.core.slices import build_slices
        from dra_driver.fakes.gpu import build_inventory, load_spec

        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", MARK: allocator}
        node = self.core.create_node({"metadata": {"name": name, "labels": labels}})
        self.nodes.append(name)
        resources = {"cpu": "64", "memory": "512Gi", "pods": "250"}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "a benchmark's node (no kubelet)",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
        self.core.patch_node_status(
            name,
            {"status": {"capacity": resources, "allocatable": resources, "conditions": [ready]}},
        )
        memory = 0
        for desired in build_slices(
            build_inventory(load_spec("h100-80gb:8"), name),
            driver_name=DRIVER,
            node_name=name,
            settings=NodeSettings(default=GpuSettings(allocator=Allocator(allocator))),
            capabilities=Capabilities.for_version(self.minor),
        ):
            spec = dict(desired.spec)
            spec["pool"] = {**spec["pool"], "generation": 1}
            for device in spec.get("devices") or []:
                value = ((device.get("capacity") or {}).get("memory") or {}).get("value")
                if device.get("allowMultipleAllocations") and value:
                    memory = max(memory, int(parse_quantity(str(value))))
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
            self.resource(
                "resourceslices",
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{name}-{desired.key}", "ownerReferences": [owner]},
                    "spec": spec,
                },
            )
        return memory

    def ensure_classes(self) -> None:
        """The chart's DeviceClasses the cluster lacks (made from the chart as shipped)."""
        import yaml
        from kubernetes.client.exceptions import ApiException

        helm = os.path.join(ROOT, "hack", "bin", "helm")
        helm = helm if os.path.exists(helm) else shutil.which("helm") or ""
        if not helm:
            raise RuntimeError("helm not found in hack/bin/ or on PATH (hack/install-helm.sh)")
        chart = os.path.join(ROOT, "deploy", "helm", "fractional-gpu-dra")
        rendered = subprocess.run(
            [helm, "template", "fgd", chart, "--namespace", "fractional-gpu-dra",
             "--set", f"driverName={DRIVER}"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        for doc in yaml.safe_load_all(rendered):
            if not doc or doc["kind"] != "DeviceClass":
                continue
            if doc["metadata"]["name"] not in (NATIVE_CLASS, SHARE_CLASS):
                continue
            try:
                self.resource("deviceclasses", doc)
            except ApiException as err:
                if err.status != 409:
                    raise
            else:
                self.classes.append(doc["metadata"]["name"])

    # --- namespaces and pods ---

    def add_namespace(self, name: str, path: str) -> None:
        self.core.create_namespace({"metadata": {"name": name, "labels": {MARK: path}}})
        self.namespaces.append(name)
        for memory in fake_bench.SHARES:
            self.resource("resourceclaimtemplates", claim_template(path, memory), name)

    def drop_namespace(self, name: str, timeout_s: float = 600) -> None:
        """Force-delete its pods (no kubelet ends them), delete it, wait until it is gone."""
        from kubernetes.client.exceptions import ApiException

        pods = self.core.list_namespaced_pod(name).items
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda p: self._force_delete(name, p.metadata.name), pods))
        try:
            self.core.delete_namespace(name)
        except ApiException as err:
            if err.status != 404:
                raise
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(name)
            except ApiException as err:
                if err.status == 404:
                    if name in self.namespaces:
                        self.namespaces.remove(name)
                    return
                raise
            time.sleep(1)
        raise RuntimeError(f"namespace {name} not gone after {timeout_s:.0f} s")

    def _force_delete(self, namespace: str, pod: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise

    def clean(self) -> None:
        """Remove everything this benchmark made; report, never raise, what would not go."""
        for namespace in list(self.namespaces):
            try:
                self.drop_namespace(namespace)
            except Exception as err:  # cleanup goes on with the rest
                print(f"cleanup: namespace {namespace}: {err}", file=sys.stderr)
        for node in self.nodes:
            try:
                self.kubectl("delete", "resourceslices", "--ignore-not-found", "--wait=false",
                             "--field-selector", f"spec.nodeName={node}")  # fmt: skip
                self.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false")
            except Exception as err:
                print(f"cleanup: node {node}: {err}", file=sys.stderr)
        for name in self.classes:
            try:
                self.kubectl("delete", "deviceclass", name, "--ignore-not-found")
            except Exception as err:
                print(f"cleanup: DeviceClass {name}: {err}", file=sys.stderr)
        try:
            self.kubectl("delete", "lease", LEASE, "-n", "default", "--ignore-not-found")
        except Exception as err:
            print(f"cleanup: Lease {LEASE}: {err}", file=sys.stderr)


class Watcher:
    """When each pod of a namespace was first seen bound and each claim first seen
    allocated (by its pod), from watches in threads of their own."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.bound: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self.claims: dict[str, JsonObj] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._pods, args=(cluster, namespace), daemon=True),
            threading.Thread(target=self._claims, args=(cluster, namespace), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _pods(self, cluster: Cluster, namespace: str) -> None:
        from kubernetes import watch

        def watched() -> None:
            for event in watch.Watch().stream(
                cluster.core.list_namespaced_pod, namespace, timeout_seconds=5
            ):
                pod = event["object"]
                if pod.spec.node_name and pod.metadata.name not in self.bound:
                    self.bound[pod.metadata.name] = time.monotonic()

        self._keep_watching(watched, "pods")

    def _claims(self, cluster: Cluster, namespace: str) -> None:
        from kubernetes import watch

        def watched() -> None:
            stream = watch.Watch().stream(
                cluster.custom.list_namespaced_custom_object,
                "resource.k8s.io", "v1", namespace, "resourceclaims", timeout_seconds=5,
            )  # fmt: skip
            for event in stream:
                claim = event["object"]
                pod = owner_pod(claim)
                if pod is None or event["type"] == "DELETED":
                    continue
                self.claims[pod] = claim
                if (claim.get("status") or {}).get("allocation") and pod not in self.allocated:
                    self.allocated[pod] = time.monotonic()

        self._keep_watching(watched, "claims")

    def _keep_watching(self, watched: Callable[[], None], what: str) -> None:
        """``watched`` (a list and a watch) again until stopped; a failed one (the API
        server short of CPU answers 504 "Too large resource version") is said and
        started again at once, from a fresh list."""
        while not self._stop.is_set():
            try:
                watched()
            except Exception as err:  # said, and the watch starts again
                print(f"  (the watch of {what} failed and starts again: {err})", flush=True)
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()


# -- one phase ----------------------------------------------------------------------------


def proc_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return fake_bench.cpu_ticks(f.read())


def proc_status(pid: int) -> str:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return f.read()


@dataclass(frozen=True)
class Phase:
    """One path's share of a run."""

    path: str
    label: str
    pods: int
    image: str
    gpu_memory: int
    """Bytes of one shareable GPU (the lower bound's unit)."""
    controller: Supervised
    timeout_s: float


def phase(cluster: Cluster, spec: Phase) -> JsonObj:
    path, pods, image, gpu_memory = spec.path, spec.pods, spec.image, spec.gpu_memory
    controller, timeout_s, label = spec.controller, spec.timeout_s, spec.label
    namespace = f"bench-{path}-{label}"
    cluster.add_namespace(namespace, path)
    watcher = Watcher(cluster, namespace)
    mix = fake_bench.share_mix(pods)
    names = [f"pod-{i:04d}" for i in range(pods)]
    created: dict[str, float] = {}
    time.sleep(1)  # the watches are open
    before = cluster.metrics()
    ticks = controller.ticks()
    restarts = controller.restarts

    def create(i: int) -> None:
        cluster.core.create_namespaced_pod(namespace, pod_object(names[i], mix[i], image))
        created[names[i]] = time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(pods)))
    deadline = time.monotonic() + timeout_s
    while len(watcher.bound) < pods and time.monotonic() < deadline:
        controller.check()
        time.sleep(0.1)
    time.sleep(SETTLE_S)
    after = cluster.metrics()
    hz = os.sysconf("SC_CLK_TCK")
    cpu_s = (controller.ticks() - ticks) / hz
    controller.check()
    status = controller.status()
    watcher.stop()
    bound = {n: t for n, t in watcher.bound.items() if n in created}
    allocated = {n: t for n, t in watcher.allocated.items() if n in created}
    writes = writes_between(before, after)
    shares = [fake_bench.gibibytes(m) for n, m in zip(names, mix, strict=True) if n in bound]
    claims = [c for n, c in watcher.claims.items() if n in bound]
    return {
        "path": path,
        "pods": pods,
        "bound": len(bound),
        "bound_per_s": rate(created.values(), bound.values()),
        "allocated_per_s": rate(created.values(), allocated.values()),
        "created_s": max(created.values()) - min(created.values()),
        "allocation_p50_s": fake_bench.percentile(
            [allocated[n] - created[n] for n in allocated], 0.5
        ),
        "allocation_p99_s": fake_bench.percentile(
            [allocated[n] - created[n] for n in allocated], 0.99
        ),
        "bound_p50_s": fake_bench.percentile([bound[n] - created[n] for n in bound], 0.5),
        "bound_p99_s": fake_bench.percentile([bound[n] - created[n] for n in bound], 0.99),
        "writes_per_pod": {k: v / pods for k, v in writes.items()},
        "writes_total_per_pod": sum(writes.values()) / pods,
        "gpus_used": gpus_used(claims),
        "gpus_lower_bound": fake_bench.lower_bound(shares, gpu_memory),
        "gpus_pairing_bound": fake_bench.pairing_bound(shares, gpu_memory),
        "controller_cpu_s": cpu_s,
        "controller_restarts": controller.restarts - restarts,
        "controller_rss_mb": fake_bench.status_kib(status, "VmRSS") / 1024,
        "controller_peak_rss_mb": fake_bench.status_kib(status, "VmHWM") / 1024,
        "load": os.getloadavg()[0],
        "namespace": namespace,
    }


def report(run: Mapping[str, Any]) -> str:
    shown = ", ".join(f"{k} {v:.2f}" for k, v in run["writes_per_pod"].items())
    return "\n".join(
        [
            f"  {run['path']:<10} bound {run['bound']} of {run['pods']}"
            f"   (load average {run['load']:.2f})",
            f"    pods bound/s       {run['bound_per_s']:.1f} (claims allocated/s"
            f" {run['allocated_per_s']:.1f}; pods created in {run['created_s']:.1f} s)",
            f"    allocation p50/p99 {run['allocation_p50_s']:.2f} /"
            f" {run['allocation_p99_s']:.2f} s"
            f"   (bound p50/p99 {run['bound_p50_s']:.2f} / {run['bound_p99_s']:.2f} s)",
            f"    writes per pod     {run['writes_total_per_pod']:.2f}: {shown}",
            f"    GPUs used          {run['gpus_used']} (lower bound {run['gpus_lower_bound']},"
            f" {run['gpus_pairing_bound']} counting the shares over half a GPU)",
            f"    controller         {run['controller_cpu_s']:.1f} s CPU, RSS"
            f" {run['controller_rss_mb']:.0f} MB (peak {run['controller_peak_rss_mb']:.0f} MB)"
            f"; restarted {run['controller_restarts']} times",
        ]
    )


# -- the benchmark ------------------------------------------------------------------------


class Supervised:
    """The controller process, started again when it exits, as its Deployment's pod is
    (a leader that cannot renew its Lease in time exits on purpose: on a machine short
    of CPU that happens). Counts its restarts and the CPU of the processes it ran."""

    def __init__(self, kubeconfig: str, log_path: str) -> None:
        self._kubeconfig, self._log = kubeconfig, log_path
        self.proc = start_controller(kubeconfig, log_path)
        self.restarts = 0
        self._spent_ticks = 0
        """CPU ticks of the processes that exited."""
        self._last_ticks = 0
        """The running process's CPU ticks when last read."""

    def check(self) -> None:
        """Start it again if it exited (its CPU until then is kept)."""
        if self.proc.poll() is None:
            return
        print(f"  (the controller exited with {self.proc.returncode}; started again)", flush=True)
        self._spent_ticks += self._last_ticks
        self.proc = start_controller(self._kubeconfig, self._log)
        self.restarts += 1

    def ticks(self) -> int:
        """CPU ticks of every process it ran so far."""
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            self._last_ticks = proc_ticks(self.proc.pid)  # exited: its last reading stands
        return self._spent_ticks + self._last_ticks

    def status(self) -> str:
        return proc_status(self.proc.pid)


def start_controller(kubeconfig: str, log_path: str) -> subprocess.Popen[bytes]:
    """``dra-driver controller`` with the chart's settings (its log in a file)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "dra_driver", "controller", "--kubeconfig", kubeconfig,
                "--driver-name", DRIVER, "--lease-name", LEASE, "--lease-namespace", "default",
                "--pod-name", "bench-controller", "--batch-window", "0.2", "--log-level", "INFO",
            ],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def wait_leading(cluster: Cluster, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    leases = client.CoordinationV1Api(cluster.api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the controller exited with {proc.returncode}")
        try:
            lease = leases.read_namespaced_lease(LEASE, "default")
            if lease.spec is not None and lease.spec.holder_identity == "bench-controller":
                return
        except ApiException as err:
            if err.status != 404:
                raise
        time.sleep(0.5)
    raise RuntimeError("the controller did not take its Lease")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, default=50, help="Nodes per path")
    parser.add_argument("--pods", type=int, default=600, help="pods per path and run")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--first-run",
        type=int,
        default=1,
        help="the first run's number (a series resumed: odd runs start with the native path)",
    )
    parser.add_argument("--image", default="local.test/busybox:1.35", help="never pulled")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a phase waits")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--log", default="/var/tmp/bench-controller-cluster.log",
                        help="the controller's log")  # fmt: skip
    args = parser.parse_args()
    if shutil.which("kubectl") is None:
        parser.error("kubectl not found on PATH (it reads the API server's /metrics)")
    cluster = Cluster(args.kubeconfig)
    runs: list[JsonObj] = []
    controller: Supervised | None = None
    try:
        cluster.ensure_classes()
        started = time.monotonic()
        memory = 0
        for path, allocator in (("native", "scheduler"), ("controller", "controller")):
            for i in range(args.nodes):
                memory = max(memory, cluster.add_node(f"bench-{path}-{i:04d}", allocator))
        print(f"{2 * args.nodes} nodes and their slices in {time.monotonic() - started:.1f} s"
              f" (1.{cluster.minor}; one GPU {memory / 1024**3:.1f} GiB)", flush=True)  # fmt: skip
        controller = Supervised(args.kubeconfig, args.log)
        wait_leading(cluster, controller.proc)
        time.sleep(2)  # its informers listed everything
        for r in range(args.first_run - 1, args.first_run - 1 + args.runs):
            order = PATHS if r % 2 == 0 else tuple(reversed(PATHS))
            print(f"run {r + 1}: {args.nodes} nodes per path x 8 GPUs, {args.pods} pods"
                  f" per path", flush=True)  # fmt: skip
            for path in order:
                spec = Phase(path, str(r + 1), args.pods, args.image, memory, controller,
                             args.timeout)  # fmt: skip
                run = phase(cluster, spec)
                run["run"] = r + 1
                print(report(run), flush=True)
                runs.append(run)
                cluster.drop_namespace(run["namespace"])
    finally:
        stop_process(controller.proc if controller is not None else None, 30)
        cluster.clean()
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
