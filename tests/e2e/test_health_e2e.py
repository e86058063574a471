"""Device health on a real cluster with fake GPUs: an XID taints the device, a reset heals it.

The fake backend applies fault-injection files dropped in its directory
(``FAKE_HEALTH_DIR``, by default ``<PLUGIN_DIR>/fake-health``: under the chart's
plugin-dir hostPath, mounted at the same path; format in
``dra_driver/fakes/gpu_faults.py``). The test writes an XID 79 file for one whole
GPU from inside a kubelet-plugin pod (``kubectl exec`` through the official
client's ``stream`` API), waits for the device to carry our
``<driver>/unhealthy`` taint in its node's ResourceSlice, then writes a reset
file and waits for the taint to go. The reset is seen by the liveness probe over
two probes (``HEALTH_PROBE_INTERVAL``, 30 s in the chart), so that step takes up
to a minute.

Skips, each saying why: a server before 1.36, or one that drops device taints
(the DRADeviceTaints feature gate); the nvml backend (real GPUs take no files);
the liveness probe turned off (a fatal XID would then stay until the plugin
restarts); no whole GPU published on the plugin's node. The GPU is reset in
any case before the test ends, so later tests find it untainted.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator

import pytest

from tests.support.cluster import REPORTS, Cluster, plugin_logs, section
from tests.support.eventually import eventually_sync
from tests.support.examples import Obj

pytestmark = pytest.mark.e2e

TAINTS = (1, 36)
PLUGIN_SELECTOR = "app.kubernetes.io/component=kubelet-plugin"
CONTAINER = "kubelet-plugin"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/plugins/{driver}"
APPLIED_S = 30.0
"""The plugin checks the directory every 0.5 s."""
TAINTED_S = 60.0
"""XID to taint: at once, then one publish (a few API calls)."""
POLL_S = 1.0


# --- the plugin pod ---------------------------------------------------------------------


class PluginPod:
    """A running kubelet-plugin pod of the chart and what its environment says."""

    def __init__(self, cluster: Cluster, pod: Obj) -> None:
        self.cluster = cluster
        self.name: str = pod["metadata"]["name"]
        self.node: str = pod["spec"]["nodeName"]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == CONTAINER)
        self.env: dict[str, str] = {
            e["name"]: e["value"] for e in container.get("env") or [] if "value" in e
        }
        plugin_dir = self.env.get("PLUGIN_DIR") or DEFAULT_PLUGIN_DIR.format(driver=cluster.driver)
        self.fault_dir = self.env.get("FAKE_HEALTH_DIR") or f"{plugin_dir.rstrip('/')}/fake-health"

    def exec(self, *command: str) -> str:
        """Run ``command`` in the plugin container; its stdout, or a failure with stderr."""
        from kubernetes import client
        from kubernetes.stream import stream

        api = client.CoreV1Api(self.cluster.api)
        response = stream(
            api.connect_get_namespaced_pod_exec,
            self.name,
            self.cluster.driver_namespace,
            container=CONTAINER,
            command=list(command),
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
        try:
            response.run_forever(timeout=30)
            out, err, code = response.read_stdout(), response.read_stderr(), response.returncode
        finally:
            response.close()
        assert code == 0, f"exec {list(command)} in pod {self.name} failed ({code}): {err}"
        return str(out)

    def drop(self, name: str, request: Obj) -> None:
        """Write a request file: a hidden temporary name first, then renamed (atomic)."""
        self.exec(
            "sh",
            "-c",
            'mkdir -p "$1" && printf "%s" "$2" > "$1/.$3.tmp" && mv "$1/.$3.tmp" "$1/$3"',
            "sh",
            self.fault_dir,
            json.dumps(request),
            name,
        )

    def files(self) -> list[str]:
        return self.exec("ls", "-1a", self.fault_dir).split()

    def listing(self) -> str:
        return self.exec("ls", "-la", self.fault_dir)

    def wait_applied(self, name: str) -> None:
        """Until the plugin renamed ``name`` ``.done``; a failure if ``.bad`` or never."""
        deadline = time.monotonic() + APPLIED_S
        while True:
            files = self.files()
            if f"{name}.done" in files:
                return
            if f"{name}.bad" in files:
                pytest.fail(
                    f"the plugin refused {self.fault_dir}/{name} (renamed .bad); its log says "
                    "why (see below)"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"pod {self.name}: {self.fault_dir}/{name} not applied after {APPLIED_S:.0f}s"
                    f" (files: {files}); does the plugin's image watch FAKE_HEALTH_DIR"
                    " (dra-driver kubelet-plugin --fake-health-dir)?"
                )
            time.sleep(POLL_S / 2)


def plugin_pods(cluster: Cluster) -> list[Obj]:
    pods = cluster.objects(
        "v1", "Pod", namespace=cluster.driver_namespace, label_selector=PLUGIN_SELECTOR
    )
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        and all(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [])
    ]


def require_taints(cluster: Cluster, node: str) -> None:
    """Skip unless the API server keeps device taints (asked by a dry-run create, as the
    plugin's capability probe does)."""
    if cluster.version < TAINTS:
        pytest.skip(
            "device taints in ResourceSlices need Kubernetes 1.36+ (DRADeviceTaints); this"
            f" server is {cluster.version[0]}.{cluster.version[1]}, which drops them, so the"
            " plugin reports device health to the kubelet only"
        )
    taint = {"key": f"{cluster.driver}/e2e-probe", "value": "x", "effect": "NoSchedule"}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "fgd-e2e-taint-probe-"},
        "spec": {
            "driver": cluster.driver,
            "nodeName": node,
            "pool": {"name": "fgd-e2e-taint-probe", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "probe-0", "taints": [taint]}],
        },
    }
    made = cluster.resource("resource.k8s.io/v1", "ResourceSlice").create(body=body, dry_run="All")
    if not made.to_dict()["spec"]["devices"][0].get("taints"):
        pytest.skip(
            "this API server drops device taints from ResourceSlices (the DRADeviceTaints"
            " feature gate is off), so there is no taint to see"
        )


# --- the node's devices -----------------------------------------------------------------


def node_devices(cluster: Cluster, node: str) -> dict[str, Obj]:
    return {
        device["name"]: device
        for item in cluster.slices()
        if item["spec"].get("nodeName") == node
        for device in item["spec"].get("devices") or []
    }


def attribute(device: Obj, name: str) -> object:
    value = (device.get("attributes") or {}).get(name)
    return next(iter(value.values())) if value else None


def unhealthy_taints(device: Obj, driver: str) -> list[Obj]:
    return [t for t in device.get("taints") or [] if t.get("key") == f"{driver}/unhealthy"]


def our_taints(cluster: Cluster, node: str, device: str) -> list[Obj]:
    """The device's ``<driver>/unhealthy`` taints as published now."""
    found = node_devices(cluster, node).get(device)
    assert found is not None, f"device {device} is no longer published on node {node}"
    return unhealthy_taints(found, cluster.driver)


# --- diagnostics ------------------------------------------------------------------------


def taints_by_device(cluster: Cluster, node: str) -> str:
    devices = node_devices(cluster, node)
    return json.dumps({name: d.get("taints") for name, d in devices.items()}, indent=1)


@pytest.fixture
def on_failure(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[list[PluginPod]]:
    """After a failed test: the fault directory, the node's slices, the plugin logs."""
    seen: list[PluginPod] = []
    yield seen
    reports = request.node.stash.get(REPORTS, {})
    if not any(r.failed for r in reports.values()):
        return
    sections = []
    for pod in seen:
        sections.append(section(f"{pod.fault_dir} in {pod.name}", pod.listing))
        sections.append(
            section(
                f"taints of the devices on node {pod.node}",
                functools.partial(taints_by_device, cluster, pod.node),
            )
        )
    sections.append(
        section(f"driver pods in {cluster.driver_namespace}", lambda: plugin_logs(cluster))
    )
    text = "".join(sections)
    print(text)
    if cluster.artifacts is not None:
        cluster.artifacts.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)
        (cluster.artifacts / f"{safe}.txt").write_text(text)


# --- the test ---------------------------------------------------------------------------


def test_xid_taints_the_device_and_a_reset_clears_it(
    cluster: Cluster, on_failure: list[PluginPod]
) -> None:
    pods = plugin_pods(cluster)
    assert pods, (
        f"no running kubelet-plugin pod ({PLUGIN_SELECTOR}) in namespace"
        f" {cluster.driver_namespace}: is the chart installed there (DRIVER_NAMESPACE)?"
    )
    pod = PluginPod(cluster, pods[0])
    if pod.env.get("BACKEND", "fake") != "fake":
        pytest.skip(
            f"needs the fake backend: pod {pod.name} runs BACKEND={pod.env['BACKEND']}, which"
            " takes no injected faults"
        )
    probe_s = float(pod.env.get("HEALTH_PROBE_INTERVAL") or 30)
    if probe_s <= 0:
        pytest.skip(
            "HEALTH_PROBE_INTERVAL=0: without the liveness probe a GPU reset is never seen,"
            " so the fatal XID this test injects would stay until the plugin restarts"
        )
    require_taints(cluster, pod.node)
    devices = node_devices(cluster, pod.node)
    whole = sorted(
        name
        for name, found in devices.items()
        if attribute(found, "type") == "gpu" and not unhealthy_taints(found, cluster.driver)
    )
    if not whole:
        pytest.skip(f"no untainted whole GPU published on node {pod.node}")
    device = whole[-1]
    gpu_uuid = attribute(devices[device], "uuid")
    gpu = gpu_uuid if isinstance(gpu_uuid, str) and gpu_uuid else device
    on_failure.append(pod)
    effect = pod.env.get("FATAL_XID_TAINT_EFFECT") or "NoSchedule"
    cleared_s = 3 * probe_s + 30  # two probes see the reset, then one publish
    stamp = f"e2e-{int(time.time())}"
    reset = False
    try:
        pod.drop(f"{stamp}-xid.json", {"gpu": gpu, "xid": 79, "message": "e2e: fell off"})
        pod.wait_applied(f"{stamp}-xid.json")
        eventually_sync(
            lambda: bool(our_taints(cluster, pod.node, device)),
            f"node {pod.node}: device {device} ({gpu}) to get a {cluster.driver}/unhealthy"
            " taint after XID 79 was applied",
            timeout=TAINTED_S,
            interval=POLL_S,
        )
        (taint,) = our_taints(cluster, pod.node, device)
        assert (taint["value"], taint["effect"]) == ("xid-79", effect), taint
        assert taint.get("timeAdded"), f"the API server sets timeAdded: {taint}"
        now = node_devices(cluster, pod.node)
        others = [n for n in whole[:-1] if unhealthy_taints(now[n], cluster.driver)]
        assert not others, f"only {device} was hit, yet {others} are tainted too"

        pod.drop(f"{stamp}-reset.json", {"gpu": gpu, "reset": True})
        reset = True
        pod.wait_applied(f"{stamp}-reset.json")
        eventually_sync(
            lambda: not our_taints(cluster, pod.node, device),
            f"node {pod.node}: device {device} to lose its taint after the reset"
            f" (HEALTH_PROBE_INTERVAL={probe_s:g}: two probes must see it)",
            timeout=cleared_s,
            interval=POLL_S,
        )
    finally:
        if not reset:  # leave the GPU as found for the tests after this one
            try:
                pod.drop(f"{stamp}-cleanup-reset.json", {"gpu": gpu, "reset": True})
                eventually_sync(
                    lambda: not our_taints(cluster, pod.node, device),
                    f"{device} on {pod.node} to lose its taint",
                    timeout=cleared_s,
                    interval=POLL_S,
                )
            except Exception as err:  # never hide the real failure
                print(f"cleanup: resetting {device} on {pod.node} failed: {err!r:.300}")
