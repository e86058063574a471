#!/usr/bin/env python3
"""NodePrepareResources / NodeUnprepareResources as a real kubelet measures them.

Runs against a real cluster whose node is this host (``../shared/cluster``, or any
node you can run processes on): it starts ``dra-driver mps-agent`` and ``dra-driver
kubelet-plugin`` here as host processes, registered with the node's kubelet in its
own plugin directories (fake GPU backend, ``--fake-gpus h100-80gb:N``, MPS protocol
v3, the packaged fake ``nvidia-cuda-mps-control``), creates the chart's
DeviceClasses where missing, then for each phase creates waves of pods, each with
its own claim from a ResourceClaimTemplate, waits for them to run, deletes them and
waits for the kubelet to unprepare every claim. The figures are the kubelet's own:
``dra_grpc_operations_duration_seconds`` (a histogram per driver and method, read
from ``/api/v1/nodes/NODE/proxy/metrics`` before and after each phase), so they
include the kubelet's gRPC client and the socket, as a node pays them.

Phases (``--phases``, default ``whole,mps``):

* ``whole``: a whole GPU per pod (the request names no capacity: no MPS client);
* ``mps``: a ``--share`` (default 4Gi) MPS v3 share per pod, with a quarter of the SMs
  (so four fit on a GPU: a wave spreads over several GPUs); one more share pod per GPU,
  pinned to it, started before the phase's first reading and deleted after its last,
  keeps every GPU's MPS daemon up, as on a node already serving MPS pods (``--cold``:
  without them, each wave's first share on a GPU starts its daemon);
* ``example``: dra-example-driver's kubelet plugin (``--example-driver PATH``, built by
  ``../shared/cluster/build-binaries.sh dra``) with one of its devices per pod: a
  Go driver on the same kubelet, for comparison.

Printed per run and phase: calls counted, the kubelet's mean prepare and
unprepare (ms), pod create-to-Running p50, how idle the machine was before the
phase's first wave; then the MPS/whole ratios and, with ``--runs N``, in how many
runs they met the target (MPS mean within 1.5x whole). Each phase waits (``--settle``,
at most 60 s) for the machine to be 80% idle before its first wave, and the phases
take turns going first, run by run: on a small node the run before, the pods'
teardown and the resident pods' start otherwise fall on one phase more than the other.

Usage:  .venv/bin/python hack/bench/kubelet_prepare.py --kubeconfig PATH [--node NAME]
        [--gpus 10] [--pods 10] [--waves 3] [--runs 1] [--phases whole,mps,example]
        [--image local.test/busybox:1.35] [--example-driver /tmp/perf/bin/dra-example-kubeletplugin]
        [--kubelet-url https://127.0.0.1:10250 --kubelet-cert C --kubelet-key K --kubelet-ca CA]
Needs root (the kubelet's directories) and no other plugin of the driver on the node
(``helm uninstall`` the chart first).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

from tests.support.processes import (  # noqa: E402  (ROOT first)
    live_socket,
    machine_ticks,
    stop_process,
)

DRIVER = "gpu.fractional.dev"
EXAMPLE_DRIVER = "gpu.example.com"
CHART_NAME = "fractional-gpu-dra"
"""The chart's app.kubernetes.io/name label (deploy/helm: fgd.name)."""
NAMESPACE = "fgd-bench-kubelet"
METRIC = "dra_grpc_operations_duration_seconds"
PREPARE = "NodePrepareResources"
UNPREPARE = "NodeUnprepareResources"
TARGET_RATIO = 1.5
SETTLED_IDLE = 0.8
"""How idle the machine must be (over 2 s) before a phase's first wave, by default."""
JsonObj = dict[str, Any]


# -- the pure part: the kubelet's histogram ------------------------------------------------


@dataclass(frozen=True)
class Totals:
    """A histogram's ``_sum`` (seconds) and ``_count`` for one driver and method."""

    seconds: float = 0.0
    calls: int = 0

    def minus(self, before: Totals) -> Totals:
        return Totals(self.seconds - before.seconds, self.calls - before.calls)

    @property
    def mean_ms(self) -> float:
        return 1000 * self.seconds / self.calls if self.calls else float("nan")


def kubelet_totals(text: str, driver: str) -> dict[str, Totals]:
    """Sum and count of ``dra_grpc_operations_duration_seconds`` per method (the
    method's last path element: ``NodePrepareResources``) for ``driver``, over
    every gRPC status code, from the kubelet's Prometheus text."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != METRIC:
            continue
        for sample in family.samples:
            if sample.labels.get("driver_name") != driver:
                continue
            method = sample.labels.get("method_name", "").rsplit("/", 1)[-1]
            if sample.name == METRIC + "_sum":
                sums[method] = sums.get(method, 0.0) + sample.value
            elif sample.name == METRIC + "_count":
                counts[method] = counts.get(method, 0.0) + sample.value
    return {m: Totals(sums.get(m, 0.0), int(counts.get(m, 0))) for m in set(sums) | set(counts)}


def delta(after: Mapping[str, Totals], before: Mapping[str, Totals], method: str) -> Totals:
    return after.get(method, Totals()).minus(before.get(method, Totals()))


@dataclass(frozen=True)
class PhaseResult:
    phase: str
    prepare: Totals
    unprepare: Totals
    running_s: list[float]
    idle_before: float = float("nan")
    """The machine's idle share over the seconds before the first wave (see :func:`settle`)."""

    def line(self) -> str:
        p50 = statistics.median(self.running_s) if self.running_s else float("nan")
        return (
            f"{self.phase:8} prepare {self.prepare.mean_ms:7.1f} ms mean"
            f" ({self.prepare.calls} calls)"
            f"  unprepare {self.unprepare.mean_ms:6.1f} ms mean ({self.unprepare.calls} calls)"
            f"  pod create->Running p50 {p50:5.1f} s  idle before {self.idle_before:4.0%}"
        )


def idle_share(before: Sequence[int], after: Sequence[int]) -> float:
    """The share of the machine's CPU time that was idle (idle and iowait, the 4th and
    5th kinds) between two :func:`machine_ticks` readings."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent)
    return (spent[3] + spent[4]) / total if total else 1.0


def settle(max_s: float, want: float = SETTLED_IDLE, window_s: float = 2.0) -> float:
    """Wait until the machine was ``want`` idle over ``window_s`` (what the phase before
    left running: pods' teardown, the resident pods' start), at most ``max_s``; the
    idle share last seen. Every phase then starts from a like machine."""
    deadline = time.monotonic() + max_s
    while True:
        before = machine_ticks()
        time.sleep(window_s)
        share = idle_share(before, machine_ticks())
        if share >= want or time.monotonic() >= deadline:
            return share


def ratios(run: Mapping[str, PhaseResult], phase: str, base: str) -> tuple[float, float] | None:
    """``phase``'s mean prepare and unprepare over ``base``'s, when both ran."""
    if phase not in run or base not in run:
        return None
    a, b = run[phase], run[base]
    return a.prepare.mean_ms / b.prepare.mean_ms, a.unprepare.mean_ms / b.unprepare.mean_ms


# -- the cluster ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeletEndpoint:
    """The kubelet's HTTPS port read directly (``--kubelet-url``)."""

    url: str
    cert: str
    key: str
    ca: str

    def metrics(self) -> str:
        context = ssl.create_default_context(cafile=self.ca or None)
        context.load_cert_chain(self.cert, self.key)
        with urllib.request.urlopen(self.url.rstrip("/") + "/metrics", context=context) as got:
            return str(got.read().decode())


class Cluster:
    """The official client, as a user's script has it."""

    def __init__(self, kubeconfig: str, kubelet: KubeletEndpoint | None) -> None:
        # Any: the script passes and reads plain dicts, as kubectl's YAML would be.
        self.api: Any = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        self.core: Any = client.CoreV1Api(self.api)
        self.custom: Any = client.CustomObjectsApi(self.api)
        self.kubelet = kubelet

    def kubelet_metrics(self, node: str) -> str:
        """The kubelet's ``/metrics``: through the API server's node proxy, or (where the
        API server refuses to proxy to the node's address, as it does for a loopback
        one) from the kubelet's own port with a client certificate it accepts."""
        if self.kubelet is not None:
            return self.kubelet.metrics()
        return str(self.core.connect_get_node_proxy_with_path(node, "metrics"))

    def chart_pods(self, node: str) -> list[str]:
        """The chart's pods on ``node`` (its kubelet plugin's or agent's would take the
        sockets this script's processes serve)."""
        pods = self.core.list_pod_for_all_namespaces(
            label_selector=f"app.kubernetes.io/name={CHART_NAME}",
            field_selector=f"spec.nodeName={node}",
        )
        return [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods.items]

    def create_class(self, obj: JsonObj) -> bool:
        """Create a DeviceClass; False when one of that name is already there."""
        try:
            self.custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", obj)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def delete_class(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)

    def create_template(self, name: str, request: JsonObj) -> None:
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}},
        }
        self.custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", body
        )

    def fresh_namespace(self) -> None:
        """Our namespace, created; waits out a previous run's one still Terminating."""
        deadline = time.monotonic() + 180
        while True:
            try:
                self.core.create_namespace({"metadata": {"name": NAMESPACE}})
                return
            except ApiException as err:
                if err.status != 409 or time.monotonic() > deadline:
                    raise
            time.sleep(1)

    def delete_namespace(self) -> None:
        with contextlib.suppress(Exception):
            self.core.delete_namespace(NAMESPACE)

    def slices_of(self, driver: str, node: str) -> list[JsonObj]:
        items = self.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
        return [
            s
            for s in items.get("items", [])
            if s["spec"].get("driver") == driver and s["spec"].get("nodeName") == node
        ]

    def delete_slices(self, driver: str, node: str) -> None:
        for item in self.slices_of(driver, node):
            with contextlib.suppress(Exception):
                self.custom.delete_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceslices", item["metadata"]["name"]
                )


def pod_body(name: str, node: str, template: str, image: str) -> JsonObj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "ctr",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }


def start_pods(
    cluster: Cluster, node: str, template: str | Mapping[str, str], image: str, names: list[str]
) -> list[float]:
    """Pods ``names``, each with its own claim from ``template`` (or from its own template,
    ``template[name]``); their create-to-Running seconds once all run."""
    started = {}
    for name in names:
        made = template if isinstance(template, str) else template[name]
        cluster.core.create_namespaced_pod(NAMESPACE, pod_body(name, node, made, image))
        started[name] = time.monotonic()
    running: dict[str, float] = {}
    deadline = time.monotonic() + 300
    while len(running) < len(names):
        if time.monotonic() > deadline:
            raise SystemExit(f"pods not Running after 300 s: {sorted(set(names) - set(running))}")
        for pod in cluster.core.list_namespaced_pod(NAMESPACE).items:
            name = pod.metadata.name
            if name in started and name not in running and pod.status.phase == "Running":
                running[name] = time.monotonic() - started[name]
            elif pod.status.phase == "Failed":
                raise SystemExit(f"pod {name} failed: {pod.status.message}")
        time.sleep(0.2)
    return list(running.values())


def delete_pods(cluster: Cluster, names: list[str]) -> None:
    """Delete pods ``names`` and wait until the API has none of them."""
    for name in names:
        cluster.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=1)
    deadline = time.monotonic() + 300
    left = set(names)
    while left & {p.metadata.name for p in cluster.core.list_namespaced_pod(NAMESPACE).items}:
        if time.monotonic() > deadline:
            raise SystemExit("pods not gone after 300 s")
        time.sleep(0.2)


def wait_calls(cluster: Cluster, node: str, driver: str, method: str, at_least: int) -> None:
    """The kubelet unprepares after the pod is gone from the API: wait for its count."""
    deadline = time.monotonic() + 120
    while (
        kubelet_totals(cluster.kubelet_metrics(node), driver).get(method, Totals()).calls < at_least
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"the kubelet made fewer than {at_least} {method} calls to {driver}")
        time.sleep(0.5)


def resident_templates(template: str, request: JsonObj, gpus: int) -> dict[str, JsonObj]:
    """A share request pinned to each of the node's ``gpus`` fake GPUs (by its index
    attribute), by template name."""
    return {
        f"{template}-resident-{i}": {
            **request,
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].index == {i}'}}],
        }
        for i in range(gpus)
    }


def run_phase(
    cluster: Cluster, args: argparse.Namespace, phase: str, driver: str, request: JsonObj
) -> PhaseResult:
    template = f"bench-{phase}"
    cluster.create_template(template, request)
    # A resident share on each GPU keeps its MPS daemon up, as on a node already serving
    # MPS pods: the waves then measure a share's own prepare, not a daemon's start (--cold
    # measures that). One on each GPU: a GPU takes 100/computePercent shares (4 at 25%),
    # so a wave spreads over several GPUs, and one resident on the first GPU left the
    # others' daemons to start with each wave and stop after it.
    residents = (
        resident_templates(template, request, args.gpus) if phase == "mps" and not args.cold else {}
    )
    for name, pinned in residents.items():
        cluster.create_template(name, pinned)
    resident = list(residents)
    start_pods(cluster, args.node, {n: n for n in resident}, args.image, resident)
    idle = settle(args.settle) if args.settle > 0 else float("nan")
    before = kubelet_totals(cluster.kubelet_metrics(args.node), driver)
    running: list[float] = []
    for wave in range(args.waves):
        names = [f"{template}-w{wave}-{i}" for i in range(args.pods)]
        running += start_pods(cluster, args.node, template, args.image, names)
        delete_pods(cluster, names)
    want = before.get(UNPREPARE, Totals()).calls + args.pods * args.waves
    wait_calls(cluster, args.node, driver, UNPREPARE, want)
    after = kubelet_totals(cluster.kubelet_metrics(args.node), driver)
    delete_pods(cluster, resident)
    return PhaseResult(
        phase, delta(after, before, PREPARE), delta(after, before, UNPREPARE), running, idle
    )


# -- the driver as host processes -----------------------------------------------------------


def chart_classes(driver: str) -> list[JsonObj]:
    helm = shutil.which("helm") or os.path.join(ROOT, "hack", "bin", "helm")
    chart = os.path.join(ROOT, "deploy", "helm", "fractional-gpu-dra")
    done = subprocess.run(
        [helm, "template", "fgd", chart, "--namespace", "fractional-gpu-dra",
         "--set", f"driverName={driver}"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(done.stdout) if d and d.get("kind") == "DeviceClass"]


def example_class() -> JsonObj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": EXAMPLE_DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{EXAMPLE_DRIVER}'"}}]},
    }


def agent_state_dir(work: str) -> str:
    """The mps-agent's state, the MPS daemons' pipe and log directories: on a tmpfs
    (/dev/shm) where there is one, as the chart's ``/run/fractional-gpu-dra/mps`` is on
    a node. On a disk filesystem every state file replaced by a rename costs a flush
    (ext4's ``auto_da_alloc``: 0.3 ms a fake daemon command here), which a node does
    not pay."""
    shm = "/dev/shm"
    base = os.path.join(shm, os.path.basename(work)) if os.path.isdir(shm) else work
    return os.path.join(base, "mps")


@contextlib.contextmanager
def host_driver(args: argparse.Namespace, work: str) -> Iterator[None]:
    """The mps-agent and kubelet plugin here, as ``tests/e2e`` host-process mode runs
    them (admin credentials: the figures are about the node's path, not RBAC)."""
    registry = os.path.join(args.kubelet_root, "plugins_registry")
    plugin_dir = os.path.join(args.kubelet_root, "plugins", DRIVER)
    if live_socket(os.path.join(registry, f"{DRIVER}-reg.sock")):
        raise SystemExit(f"a plugin of {DRIVER} already serves this kubelet: uninstall it first")
    common = ["--driver-name", DRIVER, "--plugin-dir", plugin_dir]
    procs: list[subprocess.Popen[bytes]] = []
    logs = open(os.path.join(work, "driver.log"), "ab")  # noqa: SIM115 (closed below)
    try:
        for argv in (
            ["mps-agent", *common, "--mps-control", "fake", "--mps-protocol", "v3",
             "--state-dir", agent_state_dir(work)],
            ["kubelet-plugin", *common, "--node-name", args.node, "--registry-dir", registry,
             "--cdi-root", args.cdi_root, "--backend", "fake",
             "--fake-gpus", f"h100-80gb:{args.gpus}", "--kubeconfig", args.kubeconfig,
             "--cdi-hook-path", "", "--mps-protocol", "v3"],
        ):  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "dra_driver", *argv],
                    stdout=logs, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
                )
            )  # fmt: skip
        yield
    finally:
        for proc in reversed(procs):
            stop_process(proc, 15)
        logs.close()


@contextlib.contextmanager
def example_driver(args: argparse.Namespace, work: str) -> Iterator[None]:
    with open(os.path.join(work, "example.log"), "ab") as logs:
        proc = subprocess.Popen(
            [args.example_driver, "--node-name", args.node, "--num-devices", "32",
             "--cdi-root", args.cdi_root, "--kubeconfig", args.kubeconfig],
            stdout=logs, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            yield
        finally:
            stop_process(proc, 15)


def wait_slices(cluster: Cluster, driver: str, node: str, work: str) -> None:
    deadline = time.monotonic() + 90
    while not cluster.slices_of(driver, node):
        if time.monotonic() > deadline:
            raise SystemExit(f"no ResourceSlice of {driver} on {node} after 90 s; logs in {work}")
        time.sleep(0.5)


PHASE_REQUESTS: dict[str, tuple[str, JsonObj]] = {
    "whole": (DRIVER, {"deviceClassName": DRIVER}),  # no capacity: all of one GPU
    "mps": (DRIVER, {"deviceClassName": DRIVER}),  # capacity added from --share
    "example": (EXAMPLE_DRIVER, {"deviceClassName": EXAMPLE_DRIVER}),
}


def request_of(phase: str, share: str) -> tuple[str, JsonObj]:
    driver, request = PHASE_REQUESTS[phase]
    if phase == "mps":
        request = {
            **request,
            "capacity": {"requests": {"memory": share, "computePercent": "25"}},
        }
    return driver, request


def one_run(
    cluster: Cluster, args: argparse.Namespace, phases: Sequence[str]
) -> dict[str, PhaseResult]:
    cluster.fresh_namespace()
    try:
        results = {}
        for phase in phases:
            driver, request = request_of(phase, args.share)
            results[phase] = run_phase(cluster, args, phase, driver, request)
            print("  " + results[phase].line(), flush=True)
        return results
    finally:
        cluster.delete_namespace()


def phase_order(phases: Sequence[str], run: int) -> list[str]:
    """The phases in the order given on even runs (0, 2, ...), reversed on odd ones: what
    a run's first phase meets (the run before it, the namespace's start) falls on each
    phase alike."""
    return list(phases) if run % 2 == 0 else list(reversed(phases))


def summary(runs: list[dict[str, PhaseResult]]) -> list[str]:
    lines = []
    met = {"prepare": 0, "unprepare": 0}
    for i, run in enumerate(runs, 1):
        got = ratios(run, "mps", "whole")
        if got is None:
            continue
        lines.append(f"run {i}: mps/whole prepare {got[0]:.2f}x, unprepare {got[1]:.2f}x")
        met["prepare"] += got[0] <= TARGET_RATIO
        met["unprepare"] += got[1] <= TARGET_RATIO
    if lines:
        lines.append(
            f"target mps within {TARGET_RATIO}x whole (kubelet mean): prepare met in"
            f" {met['prepare']}/{len(lines)} runs, unprepare in {met['unprepare']}/{len(lines)}"
        )
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", default="", help="this host's node (default: the only node)")
    parser.add_argument("--gpus", type=int, default=10, help="fake H100s (a wave of whole GPUs)")
    parser.add_argument("--pods", type=int, default=10, help="pods per wave")
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--settle",
        type=float,
        default=60.0,
        help=f"seconds a phase waits at most for the machine to be {SETTLED_IDLE * 100:.0f}%% idle "
        "before its first wave (0: no wait)",
    )
    parser.add_argument("--phases", default="whole,mps")
    parser.add_argument("--share", default="4Gi")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="no resident MPS share: each wave's first share starts its GPU's daemon",
    )
    parser.add_argument("--image", default="local.test/busybox:1.35")
    parser.add_argument("--example-driver", default="")
    parser.add_argument("--kubelet-root", default="/var/lib/kubelet")
    parser.add_argument("--cdi-root", default="/var/run/cdi")
    parser.add_argument(
        "--kubelet-url",
        default="",
        help="read the kubelet's metrics here (e.g. https://127.0.0.1:10250) instead of"
        " through the API server's node proxy, which refuses a loopback node address",
    )
    parser.add_argument("--kubelet-cert", default="", help="client certificate for --kubelet-url")
    parser.add_argument("--kubelet-key", default="")
    parser.add_argument("--kubelet-ca", default="", help="CA of the kubelet's serving certificate")
    args = parser.parse_args()
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(PHASE_REQUESTS)
    if unknown or ("example" in phases and not args.example_driver):
        parser.error(f"phases are {sorted(PHASE_REQUESTS)}; 'example' needs --example-driver")
    if "whole" in phases and args.pods > args.gpus:
        parser.error(f"a wave of {args.pods} whole-GPU pods needs --gpus >= {args.pods}")
    if args.kubelet_url and not (args.kubelet_cert and args.kubelet_key):
        parser.error("--kubelet-url needs --kubelet-cert and --kubelet-key")
    args.phases = phases
    return args


def main() -> None:
    args = parse_args()
    phases = args.phases
    kubelet = None
    if args.kubelet_url:
        kubelet = KubeletEndpoint(
            args.kubelet_url, args.kubelet_cert, args.kubelet_key, args.kubelet_ca
        )
    cluster = Cluster(args.kubeconfig, kubelet)
    if not args.node:
        nodes = [n.metadata.name for n in cluster.core.list_node().items]
        if len(nodes) != 1:
            raise SystemExit(f"--node: the cluster has {len(nodes)} nodes {nodes[:5]}")
        args.node = nodes[0]
    if running := cluster.chart_pods(args.node):
        raise SystemExit(
            f"the chart's pods run on node {args.node} ({', '.join(running)}): their plugin and "
            "mps-agent would serve the sockets this benchmark's processes use; "
            "`helm uninstall` the release first"
        )
    work = tempfile.mkdtemp(prefix="fgd-bench-kubelet-")
    classes = chart_classes(DRIVER) + ([example_class()] if "example" in phases else [])
    made = [c["metadata"]["name"] for c in classes if cluster.create_class(c)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict[str, PhaseResult]] = []
    print(
        f"kubelet-measured prepare on node {args.node}: {args.waves} waves of {args.pods} pods"
        f" per phase, {args.gpus} fake H100s, MPS share {args.share}; logs in {work}",
        flush=True,
    )
    try:
        with contextlib.ExitStack() as stack:
            if {"whole", "mps"} & set(phases):
                stack.enter_context(host_driver(args, work))
                wait_slices(cluster, DRIVER, args.node, work)
            if "example" in phases:
                stack.enter_context(example_driver(args, work))
                wait_slices(cluster, EXAMPLE_DRIVER, args.node, work)
            for i in range(args.runs):
                print(f"run {i + 1}/{args.runs}", flush=True)
                runs.append(one_run(cluster, args, phase_order(phases, i)))
    finally:
        for name in made:
            cluster.delete_class(name)
        cluster.delete_slices(DRIVER, args.node)
        if "example" in phases:
            cluster.delete_slices(EXAMPLE_DRIVER, args.node)
        state = os.path.dirname(agent_state_dir(work))
        if state != work:  # on the tmpfs: memory, not left behind
            shutil.rmtree(state, ignore_errors=True)
    for line in summary(runs):
        print(line)


if __name__ == "__main__":
    main()
