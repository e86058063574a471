"""DRA extended resources (KEP-5004) on the node: the scheduler-made claim, prepared.

The claim is built as kube-scheduler writes it (``tests/support/extended_resources.py``)
and stored in the fake API server with the pod and its
``status.extendedResourceClaimStatus``; the plugin reads it with the official client
over HTTP and a kubelet-like client prepares it over the real socket. Each
container's CDI devices are then found as the kubelet finds them (the request
mappings in the pod status, the request names NodePrepareResources returns).
The start-up check for a device plugin advertising the same names runs against
the fake API too, in-process and in the real plugin process.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.core.slices import EVENT_REASON
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet, PrepareResult
from dra_driver.fakes.objects import Allocated, claim_ref, node_object, resource_claim
from dra_driver.k8s.claim_status import ClaimStatusWriter
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.nodes import read_node
from dra_driver.k8s.transport import ApiTransport
from dra_driver.plugin.claim_reporting import ClaimReporter
from dra_driver.plugin.extended_resources import check_extended_resources
from tests.support.chart import EXTENDED_VALUES, plugin_token
from tests.support.extended_resources import (
    ANNOTATION,
    classes_by_resource,
    container_cdi_devices,
    extended_resource_claim_status,
    extended_resource_requests,
    scheduler_claim,
)
from tests.support.fakekube import FakeKubeApi
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked

pytestmark = pytest.mark.chart(EXTENDED_VALUES)
"""The plugin runs as its ServiceAccount under the chart's RBAC and admission policies."""

KIND = "k8s.gpu.fractional.dev/claim"
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
CLASSES = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "whole.gpu.fractional.dev"},
        "spec": {"extendedResourceName": GPU},
    },
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "mig-1g.10gb.gpu.fractional.dev"},
        "spec": {"extendedResourceName": MIG},
    },
]


def ctr(name: str, limits: Mapping[str, int]) -> dict[str, Any]:
    return {"name": name, "image": "cuda", "resources": {"limits": dict(limits)}}


def make_pod(
    name: str, containers: Sequence[Any], init: Sequence[Any] = (), claims: Sequence[Any] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": NODE, "containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    if claims:
        spec["resourceClaims"] = list(claims)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"{name}-uid"},
        "spec": spec,
    }


def schedule(
    fake: FakeKubeApi, pod: dict[str, Any], devices: Mapping[str, Sequence[str]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What kube-scheduler writes: the claim (``devices``: request name -> our
    devices), then the pod's extendedResourceClaimStatus. Returns (pod, claim)."""
    requests, mappings = extended_resource_requests(pod, classes_by_resource(CLASSES))
    assert sorted(devices) == sorted(r["name"] for r in requests), requests
    claim = fake.create(
        scheduler_claim(
            pod,
            requests,
            {name: [Allocated(d, request=name) for d in ds] for name, ds in devices.items()},
            node=NODE,
            classes=CLASSES,
        )
    )
    stored = fake.create(pod)
    stored["status"] = {
        "extendedResourceClaimStatus": extended_resource_claim_status(claim, mappings)
    }
    return fake.update_status(stored), claim


def cdi_by_request(result: PrepareResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for device in result.devices:
        for name in device.request_names:
            out.setdefault(name, []).extend(device.cdi_device_ids)
    return out


def plugin_parts(dirs: NodeDirs, source: KubernetesClaimSource, gpus: str) -> PluginParts:
    return PluginParts(dirs.config(), FakeGpuBackend(gpus, NODE), source)


def spec_devices(dirs: NodeDirs, uid: str) -> list[str]:
    with open(os.path.join(dirs.cdi, f"k8s.gpu.fractional.dev-claim_{uid}.json")) as handle:
        return [f"{KIND}={d['name']}" for d in json.load(handle)["devices"]]


def test_each_container_gets_the_gpus_of_its_own_requests(
    node_dirs: NodeDirs, fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """Three containers (one an init container reusing the first one's GPU), one of
    them asking two GPUs: every container gets exactly its devices' CDI ids."""
    pod = make_pod(
        "trainer",
        [ctr("main", {GPU: 1}), ctr("helper", {GPU: 2}), ctr("log", {})],
        init=[ctr("warmup", {GPU: 1})],
    )
    # The containers are warmup (0), main (1), helper (2): warmup reuses main's request.
    pod, claim = schedule(
        fake_kube,
        pod,
        {"container-1-request-0": ["gpu-0"], "container-2-request-0": ["gpu-1", "gpu-2"]},
    )
    assert claim["metadata"]["annotations"] == {ANNOTATION: "true"}
    assert claim["metadata"]["generateName"] == "trainer-extended-resources-"
    assert "config" not in claim["spec"]["devices"]
    source = KubernetesClaimSource(api)
    writer = ClaimStatusWriter(api, driver_name=DRIVER, node_name=NODE)
    reporting = ClaimReporter(driver_name=DRIVER, node_name=NODE, status=writer, events=None)

    async def scenario() -> None:
        parts = dataclasses.replace(
            plugin_parts(node_dirs, source, "h100-80gb:4"), observers=[reporting]
        )
        rt = await start_plugin(parts)
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            ref = claim_ref(claim)
            result = (await plugin.prepare([ref]))[ref.uid]
            assert result.error == ""
            # status.devices on the scheduler's claim, as on any claim we prepare.
            assert await reporting.flush()
            stored = fake_kube.get("ResourceClaim", claim["metadata"]["name"], "ns")
            entries = {d["device"]: d for d in stored["status"].get("devices") or []}
            assert sorted(entries) == ["gpu-0", "gpu-1", "gpu-2"]
            ready = {c["type"]: c["status"] for c in entries["gpu-1"]["conditions"]}
            assert ready["Ready"] == "True"
            assert stored["metadata"]["annotations"] == {ANNOTATION: "true"}
            assert sorted((d.device_name, d.request_names) for d in result.devices) == [
                ("gpu-0", ("container-1-request-0",)),
                ("gpu-1", ("container-2-request-0",)),
                ("gpu-2", ("container-2-request-0",)),
            ]
            uid = ref.uid
            per_container = container_cdi_devices(pod, cdi_by_request(result))
            assert per_container == {
                "warmup": [f"{KIND}={uid}-gpu-0"],
                "main": [f"{KIND}={uid}-gpu-0"],
                "helper": [f"{KIND}={uid}-gpu-1", f"{KIND}={uid}-gpu-2"],
                "log": [],
            }
            assert sorted(spec_devices(node_dirs, uid)) == sorted(
                {i for ids in per_container.values() for i in ids}
            )
            assert await plugin.unprepare([ref]) == {uid: ""}
            assert node_dirs.cdi_files() == []
        finally:
            await kubelet.close()
            await rt.stop()
            await reporting.close()

    run_checked(scenario())
    path = f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{claim['metadata']['name']}"
    assert ("GET", path) in fake_kube.requests  # read through the API, as on a cluster


def test_a_pod_mixing_extended_resources_and_a_normal_claim(
    node_dirs: NodeDirs, fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    """One container asks nvidia.com/gpu, nvidia.com/mig-1g.10gb and a claim of its
    own: both claims are prepared in one call (a MIG instance created for the
    extended one), and the container gets the devices of all three."""
    normal = fake_kube.create(
        resource_claim("ns", "notebook-gpu", node=NODE, devices=[Allocated("gpu-1")])
    )
    pod = make_pod(
        "notebook",
        [
            {
                "name": "main",
                "image": "cuda",
                "resources": {"limits": {GPU: 1, MIG: 1}, "claims": [{"name": "gpu"}]},
            }
        ],
        claims=[{"name": "gpu", "resourceClaimName": "notebook-gpu"}],
    )
    mig_device = "gpu-2-mig-1g10gb-19-0"
    pod, claim = schedule(
        fake_kube,
        pod,
        {"container-0-request-0": ["gpu-0"], "container-0-request-1": [mig_device]},
    )
    source = KubernetesClaimSource(api)

    async def scenario() -> None:
        rt = await start_plugin(plugin_parts(node_dirs, source, "h100-80gb:2,h100-80gb:1:mig"))
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER)
            ext, own = claim_ref(claim), claim_ref(normal)
            results = await plugin.prepare([ext, own])
            assert {u: r.error for u, r in results.items()} == {ext.uid: "", own.uid: ""}
            mapped = container_cdi_devices(pod, cdi_by_request(results[ext.uid]))
            assert mapped == {"main": [f"{KIND}={ext.uid}-gpu-0", f"{KIND}={ext.uid}-{mig_device}"]}
            (own_device,) = results[own.uid].devices
            assert own_device.cdi_device_ids == (f"{KIND}={own.uid}-gpu-1",)
            mig = [d for d in results[ext.uid].devices if d.device_name == mig_device]
            assert [d.request_names for d in mig] == [("container-0-request-1",)]
            created = (await rt.backend.inventory()).gpus[2].mig_devices
            assert [d.profile_name for d in created] == ["1g.10gb"]  # created at prepare
            assert await plugin.unprepare([ext, own]) == {ext.uid: "", own.uid: ""}
            assert (await rt.backend.inventory()).gpus[2].mig_devices == ()
        finally:
            await kubelet.close()
            await rt.stop()

    run_checked(scenario())


# --- the start-up check -----------------------------------------------------------------


def add_node(fake: FakeKubeApi, allocatable: Mapping[str, str]) -> None:
    """Our Node, with the status its kubelet reports (the device plugin's names in it)."""
    node = fake.create(node_object(NODE))
    node["status"] = {"allocatable": dict(allocatable), "capacity": dict(allocatable)}
    fake.update_status(node)


def node_events(fake: FakeKubeApi) -> list[dict[str, Any]]:
    return [e for e in fake.objects("Event") if e["involvedObject"]["kind"] == "Node"]


@pytest.mark.parametrize(
    ("allocatable", "warned"),
    [({GPU: "8", "cpu": "64"}, True), ({"cpu": "64"}, False), ({GPU: "0"}, False)],
    ids=["device-plugin", "none", "stopped-device-plugin"],
)
def test_the_start_up_check_warns_on_the_node(
    fake_kube: FakeKubeApi,
    api: ApiTransport,
    caplog: pytest.LogCaptureFixture,
    allocatable: dict[str, str],
    warned: bool,
) -> None:
    add_node(fake_kube, allocatable)
    events = EventRecorder(api, component="fractional-gpu-dra-kubelet-plugin", instance=NODE)

    async def scenario() -> str | None:
        return await check_extended_resources(
            lambda: read_node(api, NODE), node_name=NODE, names=(GPU, MIG), events=events
        )

    with caplog.at_level(logging.INFO, logger="dra_driver.plugin.extended_resources"):
        message = run_checked(scenario())
    if warned:
        assert message is not None and f"{GPU} (allocatable 8, capacity 8)" in message
        (event,) = node_events(fake_kube)
        assert (event["reason"], event["type"]) == (EVENT_REASON, "Warning")
        assert event["involvedObject"]["name"] == NODE
        assert message in caplog.text
    else:
        assert message is None
        assert node_events(fake_kube) == []
        assert "advertises none of" in caplog.text


def test_an_unreadable_node_is_logged_and_not_fatal(
    fake_kube: FakeKubeApi, api: ApiTransport, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> str | None:
        return await check_extended_resources(
            lambda: read_node(api, "no-such-node"), node_name=NODE, names=(GPU,), events=None
        )

    assert run_checked(scenario()) is None
    assert "cannot check node" in caplog.text and "404" in caplog.text


def test_the_plugin_process_checks_its_node_at_start(
    node_dirs: NodeDirs, fake_kube: FakeKubeApi
) -> None:
    """The flag's env twin reaches the check in the real ``dra-driver kubelet-plugin``."""
    add_node(fake_kube, {GPU: "4"})
    kubeconfig = node_dirs.kubeconfig(fake_kube.url, plugin_token(fake_kube))
    log_path = os.path.join(node_dirs.root, "plugin.log")
    cmd = [
        sys.executable, "-m", "dra_driver", "kubelet-plugin",
        "--node-name", NODE, "--registry-dir", node_dirs.registry,
        "--plugin-dir", node_dirs.plugin, "--cdi-root", node_dirs.cdi,
        "--fake-gpus", "h100-80gb:1", "--sharing", "exclusive",
        "--kubeconfig", kubeconfig, "--boot-id-file", node_dirs.boot_id_file,
    ]  # fmt: skip
    env = {**os.environ, "EXTENDED_RESOURCE_NAMES": f"{GPU},{MIG}"}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 30
        while not node_events(fake_kube) and time.monotonic() < deadline:
            assert proc.poll() is None, f"plugin exited with {proc.returncode}"
            time.sleep(0.1)
        (event,) = node_events(fake_kube)
        assert event["reason"] == EVENT_REASON
        assert f"{GPU} (allocatable 4, capacity 4)" in event["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    with open(log_path, encoding="utf-8") as handle:
        assert "also advertises nvidia.com/gpu" in handle.read()
