"""The device-plugin-pod example with the plugin as a host process (``E2E_MODE=host-process``).

As ``test_host_process_mode.py``: the node's real kubelet runs on this host and our
kubelet plugin and mps-agent run here (fake GPUs) in its directories, here with
the default ``--sharing mps`` (a request without capacity takes all of a GPU's
memory and is prepared as the whole GPU) and ``--extended-resource-names
nvidia.com/gpu``. The chart's DeviceClasses with
``extendedResources.enabled=true`` are created where missing (and deleted
after). The pod is the example as written, kept on the node; its claim's CDI
spec is there while it runs and gone after the kubelet unprepared it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.chart import helm_binary
from tests.support.cluster import Cluster
from tests.support.e2e_device_plugin_pod import (
    EXAMPLE,
    RESOURCE,
    check_claim,
    check_logs,
    extended_claim,
    require_extended_class,
    require_whole_gpu,
)
from tests.support.e2e_identities import chart_identities
from tests.support.e2e_local_modes import (
    CHART,
    LocalDriver,
    applied,
    delete_node_slices,
    delete_quietly,
    require_cluster_kubeconfig,
    spec_path,
)
from tests.support.examples import Obj

pytestmark = pytest.mark.e2e
E2E_MODE_OF = "host-process"


def _writable(path: str, what: str) -> str:
    if not (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
        pytest.skip(f"host-process mode: {what} {path} is missing or not writable")
    return path


def _node(cluster: Cluster) -> str:
    name = os.environ.get("E2E_NODE_NAME")
    if name:
        return name
    nodes = [str(n["metadata"]["name"]) for n in cluster.objects("v1", "Node")]
    if len(nodes) != 1:
        pytest.skip(f"host-process mode: set E2E_NODE_NAME ({len(nodes)} nodes)")
    return nodes[0]


def _classes(driver: str) -> list[Obj]:
    binary = helm_binary()
    if binary is None:
        pytest.skip("the DeviceClasses come from the chart: helm not found (hack/install-helm.sh)")
    done = subprocess.run(
        [binary, "template", "fgd", str(CHART), "--namespace", "fractional-gpu-dra",
         "--set", f"driverName={driver}", "--set", "extendedResources.enabled=true",
         "--set-json", "extendedResources.mig.profiles=[]"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "DeviceClass"]


@pytest.fixture(scope="module")
def whole_gpu_driver(cluster: Cluster) -> Iterator[LocalDriver]:
    from kubernetes.client.exceptions import ApiException

    kubeconfig = require_cluster_kubeconfig()
    root = os.environ.get("E2E_KUBELET_ROOT") or "/var/lib/kubelet"
    registry = _writable(os.path.join(root, "plugins_registry"), "the plugin registry")
    cdi_root = _writable(os.environ.get("E2E_CDI_ROOT") or "/var/run/cdi", "the CDI root")
    node = _node(cluster)
    plugin_dir = os.path.join(root, "plugins", cluster.driver)
    made_plugin_dir = not os.path.exists(plugin_dir)
    work = tempfile.mkdtemp(prefix="fgd-e2e-extended-")
    os.makedirs(os.path.join(work, "logs"))
    driver = LocalDriver(
        node=node,
        driver=cluster.driver,
        registry_dir=registry,
        plugin_dir=plugin_dir,
        cdi_root=cdi_root,
        log_dir=os.path.join(work, "logs"),
    )
    created: list[str] = []
    stack = contextlib.ExitStack()
    try:
        for obj in _classes(cluster.driver):
            try:
                cluster.resource("resource.k8s.io/v1", "DeviceClass").create(body=obj)
            except ApiException as err:
                if err.status != 409:
                    raise
            else:
                created.append(obj["metadata"]["name"])
        extra = ["--extended-resource-names", RESOURCE]
        # The plugin as its ServiceAccount, under the chart's RBAC and policies.
        identities = chart_identities(cluster, node, kubeconfig, work, guard=False)
        driver.start(stack.enter_context(identities).plugin, os.path.join(work, "mps"), extra)
        driver.wait_registration_socket()
        driver.wait_slices(cluster)
        yield driver
    finally:
        driver.stop()
        delete_node_slices(cluster, node)
        for name in created:
            delete_quietly(cluster, "resource.k8s.io/v1", "DeviceClass", name)
        stack.close()
        if made_plugin_dir:
            shutil.rmtree(plugin_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_device_plugin_pod_runs_with_the_local_plugin(
    cluster: Cluster, whole_gpu_driver: LocalDriver
) -> None:
    require_extended_class(cluster)
    require_whole_gpu(cluster, whole_gpu_driver.node, wait_s=30)
    with applied(
        cluster,
        EXAMPLE,
        whole_gpu_driver.node,
        tolerate_unready=False,
        driver_logs=whole_gpu_driver.logs,
    ) as example:
        example.wait_running()
        claim, mappings = extended_claim(example, "pod0")
        check_claim(cluster, example, claim, mappings)
        uid = claim["metadata"]["uid"]
        spec = spec_path(whole_gpu_driver.cdi_root, cluster.driver, uid)
        assert spec.is_file(), f"no CDI spec {spec} for the extended-resource claim"
        check_logs(example)
    deadline = time.monotonic() + 30
    while Path(spec).exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert not Path(spec).exists(), f"CDI spec left after unprepare: {spec}"
    whole_gpu_driver.check_alive()
