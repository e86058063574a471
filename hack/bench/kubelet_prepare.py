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
  (so four fit on a GPU: a wave spreads over several GPUs);
* ``example``: dra-example-driver's kubelet plugin (``--example-driver PATH``, built by
  ``../shared/cluster/build-binaries.sh dra``) with one of its devices per pod: a
  Go driver on the same kubelet, for comparison.

A run takes the phases' waves in turns, one wave of each phase, the order alternating
turn by turn, each wave from a settled machine (``--settle``, at most 60 s for it to be
80% idle over 2 s): the phases meet the same node, the same resident pods and what the
wave before left behind, where whole phases in a row met whatever the minutes of each
brought. Eight waves a phase by default: on a 2-core node one wave's mean prepare
swings from 20 to 100 ms in either phase (the calls land on the pods' start), and the
means of 3 waves could not tell a ratio of 1.25 from one of 1.5.

The plugin has ``2 x --gpus`` fake GPUs: the MPS waves use the first ``--gpus``, each
holding a resident share pod pinned to it for the whole run (it keeps the GPU's MPS
daemon up, as on a node already serving MPS pods; ``--cold``: none, so each MPS wave's
first share on a GPU starts its daemon), the whole-GPU waves the others.

Printed per run and phase: calls counted, the kubelet's mean prepare and unprepare
(ms) beside the plugin's own (its ``claim_operation_duration_seconds``, from the call
reaching its engine to the answer), pod create-to-Running p50, the least idle share
seen before a wave, and the CPU each process spent per claim over the phase's waves
(the plugin, the agent, the fake control's commands and daemons, the kubelet,
containerd, the control plane, the whole machine); then the MPS/whole ratios and, with
``--runs N``, in how many runs they met the target (MPS mean within 1.5x whole).

Usage:  .venv/bin/python hack/bench/kubelet_prepare.py --kubeconfig PATH [--node NAME]
        [--gpus 10] [--pods 10] [--waves 8] [--runs 1] [--phases whole,mps,example]
        [--image local.test/busybox:1.35] [--example-driver /tmp/perf/bin/dra-example-kubeletplugin]
        [--kubelet-url https://127.0.0.1:10250 --kubelet-cert C --kubelet-key K --kubelet-ca CA]
Needs root (the kubelet's directories) and no other plugin of the driver on the node
(``helm uninstall`` the chart first).
"""

from __future__ import annotations

import argparse
import contextlib
import math
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, ROOT)

from tests.support.processes import (  # noqa: E402  (ROOT first)
    cpu_s,
    free_port,
    live_children,
    live_socket,
    machine_ticks,
    reaped_cpu_s,
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
"""How idle the machine must be (over 2 s) before a wave, by default."""
JsonObj = dict[str, Any]


# -- the pure part: the kubelet's histogram ------------------------------------------------


@dataclass(frozen=True)
class Totals:
    """A histogram's ``_sum`` (seconds) and ``_count`` for one driver and method."""

    seconds: float = 0.0
    calls: int = 0

    def minus(self, before: Totals) -> Totals:
        return Totals(self.seconds - before.seconds, self.calls - before.calls)

    def plus(self, other: Totals) -> Totals:
        return Totals(self.seconds + other.seconds, self.calls + other.calls)

    @property
    def mean_ms(self) -> float:
        return 1000 * self.seconds / self.calls if self.calls else float("nan")


def histogram_totals(
    text: str, metric: str, method_of: Callable[[Mapping[str, str]], str | None]
) -> dict[str, Totals]:
    """Sum and count of histogram ``metric`` in Prometheus ``text``, added up per the
    method ``method_of`` names for a sample's labels (None: the sample is not counted)."""
    got: dict[str, Totals] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            method = method_of(sample.labels)
            if method is None:
                continue
            was = got.get(method, Totals())
            if sample.name == metric + "_sum":
                got[method] = Totals(was.seconds + sample.value, was.calls)
            elif sample.name == metric + "_count":
                got[method] = Totals(was.seconds, was.calls + int(sample.value))
    return got


def kubelet_totals(text: str, driver: str) -> dict[str, Totals]:
    """Sum and count of ``dra_grpc_operations_duration_seconds`` per method (the
    method's last path element: ``NodePrepareResources``) for ``driver``, over
    every gRPC status code, from the kubelet's Prometheus text."""

    def method_of(labels: Mapping[str, str]) -> str | None:
        if labels.get("driver_name") != driver:
            return None
        return labels.get("method_name", "").rsplit("/", 1)[-1]

    return histogram_totals(text, METRIC, method_of)


PLUGIN_METRIC = "fractional_gpu_dra_claim_operation_duration_seconds"
PLUGIN_OPERATIONS = {"prepare": "NodePrepareResources", "unprepare": "NodeUnprepareResources"}


def plugin_totals(text: str) -> dict[str, Totals]:
    """Sum and count of the plugin's own ``claim_operation_duration_seconds`` (from the
    call reaching its engine to the claim's answer) per operation, keyed by the kubelet's
    method name: beside the kubelet's mean, what the plugin's own work took of it."""
    return histogram_totals(
        text, PLUGIN_METRIC, lambda labels: PLUGIN_OPERATIONS.get(labels.get("operation", ""))
    )


def delta(after: Mapping[str, Totals], before: Mapping[str, Totals], method: str) -> Totals:
    return after.get(method, Totals()).minus(before.get(method, Totals()))


@dataclass(frozen=True)
class PhaseResult:
    phase: str
    prepare: Totals
    unprepare: Totals
    running_s: list[float]
    idle_before: float = float("nan")
    """The machine's idle share over the seconds before a wave (see :func:`settle`): the
    least of the phase's waves."""
    plugin_prepare: Totals = Totals()
    """The plugin's own histogram over the phase (none for the example driver)."""
    plugin_unprepare: Totals = Totals()
    cpu_s: Mapping[str, float] | None = None
    """CPU seconds over the phase's waves (:func:`cpu_readings`), by process."""
    wave_prepare_ms: tuple[float, ...] = ()
    """The kubelet's mean prepare of each wave, in turn: how much of a phase's spread is
    the waves' own (set by :meth:`plus`; a single wave's is its ``prepare``)."""

    @property
    def waves_ms(self) -> tuple[float, ...]:
        return self.wave_prepare_ms or (self.prepare.mean_ms,)

    def plus(self, other: PhaseResult) -> PhaseResult:
        """This phase's waves and ``other``'s together."""
        cpu = dict(self.cpu_s or {})
        for name, seconds in (other.cpu_s or {}).items():
            cpu[name] = cpu.get(name, 0.0) + seconds
        idle = [i for i in (self.idle_before, other.idle_before) if not math.isnan(i)]
        return PhaseResult(
            self.phase,
            self.prepare.plus(other.prepare),
            self.unprepare.plus(other.unprepare),
            self.running_s + other.running_s,
            min(idle) if idle else float("nan"),
            self.plugin_prepare.plus(other.plugin_prepare),
            self.plugin_unprepare.plus(other.plugin_unprepare),
            cpu or None,
            self.waves_ms + other.waves_ms,
        )

    def cpu_line(self) -> str:
        if not self.cpu_s or not self.prepare.calls:
            return ""
        spent = ", ".join(
            f"{name} {1000 * seconds / self.prepare.calls:.1f}"
            for name, seconds in self.cpu_s.items()
        )
        return f"{'':8} CPU per claim (ms): {spent}"

    def waves_line(self) -> str:
        waves = ", ".join(f"{ms:.0f}" for ms in self.waves_ms)
        return f"{'':8} prepare mean by wave (ms): {waves}"

    def line(self) -> str:
        p50 = statistics.median(self.running_s) if self.running_s else float("nan")
        return (
            f"{self.phase:8} prepare {self.prepare.mean_ms:7.1f} ms mean"
            f" ({self.prepare.calls} calls; plugin's own {self.plugin_prepare.mean_ms:5.1f})"
            f"  unprepare {self.unprepare.mean_ms:6.1f} ms mean ({self.unprepare.calls} calls;"
            f" plugin's own {self.plugin_unprepare.mean_ms:5.1f})"
            f"  pod create->Running p50 {p50:5.1f} s  idle before {self.idle_before:4.0%}"
        )


def idle_share(before: Sequence[int], after: Sequence[int]) -> float:
    """The share of the machine's CPU time that was idle (idle and iowait, the 4th and
    5th kinds) between two :func:`machine_ticks` readings."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent)
    return (spent[3] + spent[4]) / total if total else 1.0


OTHERS = ("kubelet", "containerd", "kube-apiserver", "etcd", "kube-scheduler")
"""The node's and control plane's processes read beside ours (by their ``comm``)."""


def pids_by_name(names: Sequence[str]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {name: [] for name in names}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in found:
            found[comm].append(int(entry))
    return found


def cpu_readings(driver_pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far: the plugin, the agent, the fake control's command processes
    (the agent's reaped children) and daemons (its live children), the node's and control
    plane's processes (:data:`OTHERS`), and the whole machine busy (not idle nor iowait)."""
    got: dict[str, float] = {}
    if "plugin" in driver_pids:
        got["plugin"] = cpu_s(driver_pids["plugin"])
    if "agent" in driver_pids:
        agent = driver_pids["agent"]
        got["agent"] = cpu_s(agent)
        got["fake commands"] = reaped_cpu_s(agent)
        got["fake daemons"] = sum(cpu_s(kid, children=True) for kid in live_children(agent))
    for name, pids in pids_by_name(OTHERS).items():
        got[name] = sum(cpu_s(pid) for pid in pids)
    ticks = machine_ticks()
    got["machine busy"] = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    return got


def cpu_spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Seconds each reading grew by between ``before`` and ``after``."""
    return {name: after[name] - before[name] for name in after if name in before}


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


def pinned(request: JsonObj, expression: str) -> JsonObj:
    return {**request, "selectors": [{"cel": {"expression": expression}}]}


def index_is(op: str, value: int) -> str:
    return f'device.attributes["{DRIVER}"].index {op} {value}'


def wave_request(phase: str, request: JsonObj, gpus: int) -> JsonObj:
    """The waves' request: MPS shares on the first ``gpus`` GPUs (where the residents keep
    the daemons up), whole GPUs on the other ``gpus``; the example driver's as it is."""
    if phase == "mps":
        return pinned(request, index_is("<", gpus))
    if phase == "whole":
        return pinned(request, index_is(">=", gpus))
    return request


def resident_templates(template: str, request: JsonObj, gpus: int) -> dict[str, JsonObj]:
    """A share request pinned to each of the MPS waves' ``gpus`` GPUs (by its index
    attribute), by template name."""
    return {f"{template}-resident-{i}": pinned(request, index_is("==", i)) for i in range(gpus)}


def run_wave(
    cluster: Cluster, args: argparse.Namespace, phase: str, driver: str, name: str
) -> PhaseResult:
    """One wave of ``phase``: its pods started, Running, deleted and unprepared, from a
    settled machine; what the kubelet and the plugin measured meanwhile."""
    template = f"bench-{phase}"
    idle = settle(args.settle) if args.settle > 0 else float("nan")
    before = kubelet_totals(cluster.kubelet_metrics(args.node), driver)
    ours_before = plugin_totals(plugin_metrics(args)) if driver == DRIVER else {}
    pids = args.driver_pids if driver == DRIVER else {}
    cpu_before = cpu_readings(pids)
    names = [f"{template}-{name}-{i}" for i in range(args.pods)]
    running = start_pods(cluster, args.node, template, args.image, names)
    delete_pods(cluster, names)
    want = before.get(UNPREPARE, Totals()).calls + args.pods
    wait_calls(cluster, args.node, driver, UNPREPARE, want)
    after = kubelet_totals(cluster.kubelet_metrics(args.node), driver)
    ours_after = plugin_totals(plugin_metrics(args)) if driver == DRIVER else {}
    return PhaseResult(
        phase,
        delta(after, before, PREPARE),
        delta(after, before, UNPREPARE),
        running,
        idle,
        delta(ours_after, ours_before, PREPARE),
        delta(ours_after, ours_before, UNPREPARE),
        cpu_spent(cpu_before, cpu_readings(pids)),
    )


def plugin_metrics(args: argparse.Namespace) -> str:
    """The host-process plugin's ``/metrics`` (:func:`host_driver` serves it on loopback)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{args.plugin_metrics_port}/metrics") as got:
        return str(got.read().decode())


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
    args.plugin_metrics_port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = open(os.path.join(work, "driver.log"), "ab")  # noqa: SIM115 (closed below)
    try:
        for argv in (
            ["mps-agent", *common, "--mps-control", "fake", "--mps-protocol", "v3",
             "--state-dir", agent_state_dir(work)],
            ["kubelet-plugin", *common, "--node-name", args.node, "--registry-dir", registry,
             "--cdi-root", args.cdi_root, "--backend", "fake",
             "--fake-gpus", f"h100-80gb:{2 * args.gpus}", "--kubeconfig", args.kubeconfig,
             "--cdi-hook-path", "", "--mps-protocol", "v3",
             "--metrics-port", str(args.plugin_metrics_port), "--metrics-address", "127.0.0.1"],
        ):  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "dra_driver", *argv],
                    stdout=logs, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"},
                )
            )  # fmt: skip
        args.driver_pids = {"agent": procs[0].pid, "plugin": procs[1].pid}
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
    cluster: Cluster, args: argparse.Namespace, phases: Sequence[str], run: int
) -> dict[str, PhaseResult]:
    """The phases' waves in turns (wave by wave, the order alternating), beside the same
    resident pods: each phase meets the node as the other does."""
    cluster.fresh_namespace()
    try:
        drivers = {}
        for phase in phases:
            drivers[phase], request = request_of(phase, args.share)
            cluster.create_template(f"bench-{phase}", wave_request(phase, request, args.gpus))
        # The MPS waves' GPUs each keep a resident share, so their daemons stay up, as on
        # a node already serving MPS pods (--cold: without them, each wave's first share
        # on a GPU starts its daemon). Every phase runs beside them.
        residents = {}
        if "mps" in phases and not args.cold:
            residents = resident_templates("bench-mps", request_of("mps", args.share)[1], args.gpus)
        for name, pinned_request in residents.items():
            cluster.create_template(name, pinned_request)
        start_pods(cluster, args.node, {n: n for n in residents}, args.image, list(residents))
        results: dict[str, PhaseResult] = {}
        for wave in range(args.waves):
            for phase in phase_order(phases, run * args.waves + wave):
                got = run_wave(cluster, args, phase, drivers[phase], f"w{wave}")
                results[phase] = results[phase].plus(got) if phase in results else got
        for phase in phases:
            print("  " + results[phase].line(), flush=True)
            if cpu := results[phase].cpu_line():
                print("  " + cpu, flush=True)
            print("  " + results[phase].waves_line(), flush=True)
        return results
    finally:
        cluster.delete_namespace()


def phase_order(phases: Sequence[str], turn: int) -> list[str]:
    """The phases in the order given on even turns (0, 2, ...), reversed on odd ones (a
    turn is one wave of each phase, counted over the runs): what the wave before leaves
    behind falls on each phase alike."""
    return list(phases) if turn % 2 == 0 else list(reversed(phases))


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
    parser.add_argument(
        "--gpus",
        type=int,
        default=10,
        help="GPUs a phase's waves use (the plugin has twice as many fake H100s)",
    )
    parser.add_argument("--pods", type=int, default=10, help="pods per wave")
    parser.add_argument(
        "--waves",
        type=int,
        default=8,
        help="waves per phase and run (a wave's mean alone swings from 20 to 100 ms on a "
        "2-core node: 3 waves could not tell 1.25x from 1.5x)",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--settle",
        type=float,
        default=60.0,
        help=f"seconds a wave waits at most for the machine to be {SETTLED_IDLE * 100:.0f}%% idle "
        "before it starts (0: no wait)",
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
                runs.append(one_run(cluster, args, phases, i))
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
