"""Where the kubelet plugin's requests go: every one from its event loop's thread.

``dra-driver kubelet-plugin`` runs in this process (its loop in the main thread, as in
its pod) against the fake API server, as its ServiceAccount under the widest chart
install, with everything on that reaches the API server: the capability probe, the
slice publisher (the Node's uid, list, create), the start-up check of the Node (a GET
and an Event), a claim's GET and its ``status.devices`` applied and removed, the
disruption guard's pod list and patches. A kubelet in a thread of its own prepares and
unprepares a claim. No thread but the loop's may open a connection to the API server.

The mps-agent sends no API request at all: ``pyproject.toml``'s import contract keeps
the API client and transport out of it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.core import claim_shape
from dra_driver.core.claim_writes import marker_key
from dra_driver.fakes.kubelet import KUBELET_DRA_SERVICES, FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, node_object, resource_claim
from tests.support.api_threads import connects_to
from tests.support.chart import ALL_VALUES, plugin_token
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi
from tests.support.node import DRIVER, NODE, NodeDirs

GPU = "nvidia.com/gpu"


def _seed(api: FakeKubeApi) -> dict[str, Any]:
    """The Node (a device plugin's GPU in its status: the start-up check's Event), a
    claim allocated on it and the pod that uses it; the claim."""
    node = api.create(node_object(NODE))
    node["status"] = {"allocatable": {GPU: "1"}, "capacity": {GPU: "1"}}
    api.update_status(node)
    claim = api.create(resource_claim("default", "c1", devices=[Allocated("gpu-0")]))
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
            },
            "status": {"phase": "Running"},
        }
    )
    return claim


def _argv(dirs: NodeDirs, kubeconfig: str) -> list[str]:
    return [
        "kubelet-plugin",
        *("--node-name", NODE, "--registry-dir", dirs.registry, "--plugin-dir", dirs.plugin),
        *("--cdi-root", dirs.cdi, "--boot-id-file", dirs.boot_id_file),
        *("--fake-gpus", "h100-80gb:1", "--sharing", "exclusive", "--kubeconfig", kubeconfig),
        *("--disruption-guard", "all", "--extended-resource-names", GPU),
        *("--log-level", "WARNING"),
    ]


def _guarded(api: FakeKubeApi) -> bool:
    annotations = api.get("Pod", "p1", "default")["metadata"].get("annotations") or {}
    return marker_key(DRIVER) in annotations


def _status_entries(api: FakeKubeApi) -> int:
    return len(claim_shape.device_statuses(api.get("ResourceClaim", "c1", "default")))


def _kubelet(api: FakeKubeApi, dirs: NodeDirs, claim: dict[str, Any], outcome: list[str]) -> None:
    """In a thread: prepare and unprepare the claim once the plugin has published and
    checked its Node, then stop the plugin as its pod is stopped (SIGTERM)."""

    async def scenario() -> None:
        kubelet = FakeKubelet(dirs.registry, KUBELET_DRA_SERVICES)
        try:
            plugin = await kubelet.wait_for_plugin(DRIVER, timeout=30)
            await eventually(lambda: api.objects("ResourceSlice"), "the slices published")
            await eventually(lambda: api.objects("Event"), "the Node's Event")
            ref = claim_ref(claim)
            outcome.append(f"prepare: {(await plugin.prepare([ref]))[ref.uid].error!r}")
            await eventually(lambda: _guarded(api), "the pod guarded")
            await eventually(lambda: _status_entries(api) == 1, "status.devices written")
            outcome.append(f"unprepare: {(await plugin.unprepare([ref]))[ref.uid]!r}")
            await eventually(lambda: not _guarded(api), "the pod released")
            await eventually(lambda: _status_entries(api) == 0, "status.devices removed")
        finally:
            await kubelet.close()

    try:
        asyncio.run(scenario())
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.chart(ALL_VALUES)
def test_every_plugin_request_goes_from_the_loops_thread(
    fake_kube: FakeKubeApi, node_dirs: NodeDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = _seed(fake_kube)
    kubeconfig = node_dirs.kubeconfig(fake_kube.url, plugin_token(fake_kube))
    outcome: list[str] = []
    kubelet = threading.Thread(
        target=_kubelet, args=(fake_kube, node_dirs, claim, outcome), name="kubelet"
    )
    # A SIGTERM that came before the plugin's own handler (it failed to start) must not
    # end the test run: ignored here, the plugin's loop handles it while it runs.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        with connects_to(fake_kube.url, monkeypatch) as connects:
            kubelet.start()
            try:
                code = cli.main(_argv(node_dirs, kubeconfig))
            finally:
                kubelet.join(timeout=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 0
    assert outcome == ["prepare: ''", "unprepare: ''"]
    sent = {(method, path.split("?")[0].rsplit("/", 1)[0]) for method, path in fake_kube.requests}
    claims = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    for request in (
        ("GET", ""),  # /version, for the probe
        ("POST", "/apis/resource.k8s.io/v1"),  # the probe's dry runs, then the slices
        ("GET", "/api/v1/nodes"),  # the Node: its uid, and the start-up check
        ("POST", "/api/v1/namespaces/default"),  # the Node's Event
        ("GET", claims),  # the claim
        ("PATCH", f"{claims}/c1"),  # its status.devices applied and removed
        ("GET", "/api/v1/namespaces/default"),  # the guard's pods
        ("PATCH", "/api/v1/namespaces/default/pods"),  # and its annotations
    ):
        assert request in sent, (request, sorted(sent))
    # Every connection to the API server, from the loop's thread (the main thread).
    assert connects and set(connects) == {threading.main_thread().name}, connects
