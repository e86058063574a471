"""Host-process mode (``E2E_MODE=host-process``): the node's real kubelet runs on this host.

The kubelet plugin and the mps-agent run here as local processes, with the
fake backend, in the kubelet's real directories (``E2E_KUBELET_ROOT``, default
``/var/lib/kubelet``: ``plugins_registry/`` and ``plugins/<driver>/``) and the
CDI root the container runtime reads (``E2E_CDI_ROOT``, default
``/var/run/cdi``). The kubelet registers the plugin itself; each example's pods
really start (kept on ``E2E_NODE_NAME``, or on the cluster's only node). The
assertions read the claims' CDI spec files while the pods run, the pods' logs
(``CUDA_MPS_PIPE_DIRECTORY`` for MPS shares, and a MIG instance's shares' limits; a
``/dev/nvidiaN`` node for every GPU), the plugin's ``status.devices`` entry on every
claim, and, once the namespace is gone, that the kubelet's unprepare removed the
specs. Our controller runs here too (``dra-driver controller``, Lease
``default/fgd-e2e-controller``) and the plugin publishes its GPUs for it, so the
controller-path example runs by default beside the native ones. Run as a user who
may write those directories (usually root); the chart's plugin must not serve this
node at the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cluster import POLL_S, Cluster, Example
from tests.support.e2e_identities import E2E_NAMESPACE, chart_identities
from tests.support.e2e_local_modes import (
    GPU_NODE,
    MPS_ENV,
    Case,
    LocalDriver,
    applied,
    attribute,
    case_params,
    check_case_specifics,
    check_spec,
    delete_node_slices,
    delete_quietly,
    ensure_device_classes,
    mig_share_env,
    node_config_args,
    ours,
    require_case,
    require_cluster_kubeconfig,
    slice_devices,
    spec_path,
    wait_allocated,
    wait_status_devices,
)
from tests.support.examples import Obj
from tests.support.processes import live_socket

pytestmark = pytest.mark.e2e
E2E_MODE_OF = "host-process"


def writable_dir(path: str, what: str) -> str:
    if not os.path.isdir(path):
        pytest.skip(f"host-process mode: {what} {path} does not exist (is a kubelet on this host?)")
    if not os.access(path, os.W_OK | os.X_OK):
        pytest.skip(f"host-process mode: {what} {path} is not writable by uid {os.getuid()}")
    return path


def node_name(cluster: Cluster) -> str:
    name = os.environ.get("E2E_NODE_NAME")
    if name:
        return name
    nodes = [str(n["metadata"]["name"]) for n in cluster.objects("v1", "Node")]
    if len(nodes) != 1:
        pytest.skip(
            f"host-process mode: set E2E_NODE_NAME to this host's node (the cluster has"
            f" {len(nodes)} nodes: {nodes[:5]})"
        )
    return nodes[0]


@pytest.fixture(scope="module")
def host_driver(cluster: Cluster) -> Iterator[LocalDriver]:
    """Our plugin and mps-agent running here in the kubelet's directories."""
    kubeconfig = require_cluster_kubeconfig()
    kubelet_root = writable_dir(
        os.environ.get("E2E_KUBELET_ROOT") or "/var/lib/kubelet", "the kubelet's root"
    )
    registry = writable_dir(os.path.join(kubelet_root, "plugins_registry"), "the plugin registry")
    cdi_root = os.environ.get("E2E_CDI_ROOT") or "/var/run/cdi"
    if not os.path.exists(cdi_root) and os.access(os.path.dirname(cdi_root), os.W_OK):
        os.makedirs(cdi_root)
    writable_dir(cdi_root, "the CDI root")
    node = node_name(cluster)
    plugin_dir = os.path.join(kubelet_root, "plugins", cluster.driver)
    if live_socket(os.path.join(registry, f"{cluster.driver}-reg.sock")):
        pytest.skip(
            f"host-process mode: a plugin of {cluster.driver} already serves this kubelet"
            f" ({registry}/{cluster.driver}-reg.sock answers): uninstall the chart first"
        )
    made_plugin_dir = not os.path.exists(plugin_dir)
    stack = contextlib.ExitStack()
    work = tempfile.mkdtemp(prefix="fgd-e2e-host-")
    mps_state = os.environ.get("E2E_MPS_STATE_DIR") or os.path.join(work, "mps")
    os.makedirs(os.path.join(work, "logs"))
    driver = LocalDriver(
        node=node,
        driver=cluster.driver,
        registry_dir=registry,
        plugin_dir=plugin_dir,
        cdi_root=cdi_root,
        log_dir=os.path.join(work, "logs"),
    )
    classes: list[str] = []
    try:
        classes = ensure_device_classes(cluster)
        # Each process as its own ServiceAccount, under the RBAC and admission policies
        # the chart installs for it (the plugin's token bound to its node).
        identities = chart_identities(cluster, node, kubeconfig, work, guard=True)
        kubeconfigs = stack.enter_context(identities)
        # The guard for claims that ask for it (only the disruption-guard example does),
        # with a short pass so a slow first prepare is caught up quickly.
        guard = ["--disruption-guard", "annotated", "--disruption-guard-interval", "5"]
        driver.start(
            kubeconfigs.plugin,
            mps_state,
            [*guard, *node_config_args(work)],  # MPS-shared MIG GPU, as on kind
            controller_kubeconfig=kubeconfigs.controller,
            lease_namespace=E2E_NAMESPACE,
        )
        driver.wait_registration_socket()
        driver.wait_slices(cluster)
        yield driver
    finally:
        driver.stop()
        delete_node_slices(cluster, node)
        for class_name in classes:
            delete_quietly(cluster, "resource.k8s.io/v1", "DeviceClass", class_name)
        stack.close()
        if made_plugin_dir:
            shutil.rmtree(plugin_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def check_pod_logs(
    case: Case,
    example_pods: list[Obj],
    logs: dict[str, str],
    mps: bool,
    env: dict[str, list[str]],
) -> None:
    """``env``: entries each pod's environment must have, by pod name."""
    for pod in example_pods:
        name = pod["metadata"]["name"]
        text = logs[name]
        if case.share and mps:
            assert MPS_ENV in text, f"pod {name}: no {MPS_ENV} in its environment:\n{text}"
        for entry in env.get(name, []):
            assert entry in text, f"pod {name}: no {entry} in its environment:\n{text}"
        if case.mig:
            assert "nvidia-cap" in text, f"pod {name}: no MIG capability nodes:\n{text}"
        assert GPU_NODE.search(text), f"pod {name}: no /dev/nvidiaN device node:\n{text}"


@pytest.mark.parametrize("case", case_params())
def test_example_runs_with_the_local_plugin(
    case: Case, cluster: Cluster, host_driver: LocalDriver
) -> None:
    require_case(case, cluster)
    uids: list[str] = []
    with applied(
        cluster, case.name, host_driver.node, tolerate_unready=False, driver_logs=host_driver.logs
    ) as example:
        pods = example.wait_running()
        claims = [wait_allocated(example, pod, entry) for pod, entry in case.claims]
        check_case_specifics(case, claims, cluster.driver)
        for claim in claims:
            wait_status_devices(example, claim, cluster.driver)
        devices = slice_devices(cluster, host_driver.node)
        mps = False
        for claim in claims:
            check_spec(cluster, host_driver.cdi_root, claim, case, host_driver.node)
            uids.append(claim["metadata"]["uid"])
            mps = mps or any(
                attribute(devices[r["pool"], r["device"]], "sharing") == "mps"
                for r in ours(claim, cluster.driver)
            )
        # The pods print their env, then their device nodes (MIG capability nodes last).
        marker = "nvidia-cap" if case.mig else MPS_ENV if case.share and mps else "/dev/nvidia"
        logs = {
            p["metadata"]["name"]: example.wait_logs(p["metadata"]["name"], marker) for p in pods
        }
        env: dict[str, list[str]] = {}
        if case.mps_mig:  # the share's limits, in its env (the instance's MPS is legacy)
            env = {
                pod: mig_share_env(ours(claim, cluster.driver)[0])
                for (pod, _), claim in zip(case.claims, claims, strict=True)
            }
        check_pod_logs(case, pods, logs, mps, env)
    # The namespace is gone: the kubelet unprepared the claims, the specs went with them.
    deadline = time.monotonic() + 30
    left = [spec_path(host_driver.cdi_root, cluster.driver, uid) for uid in uids]
    while any(Path(p).exists() for p in left) and time.monotonic() < deadline:
        time.sleep(1)
    assert not [p for p in left if Path(p).exists()], f"CDI specs left after unprepare: {left}"
    host_driver.check_alive()


GUARD = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
}
HOLD = "e2e.fractional.dev/hold"
"""A finalizer of the test's own: keeps the deleted pod's object past its termination,
so the annotations' removal at unprepare can be seen on it."""


def wait_annotations(
    example: Example, pod: str, wanted: Callable[[dict[str, str]], bool], what: str
) -> dict[str, str]:
    deadline = time.monotonic() + example.cluster.timeout_s
    while True:
        annotations: dict[str, str] = example.pod(pod)["metadata"].get("annotations") or {}
        if wanted(annotations):
            return annotations
        if time.monotonic() > deadline:
            pytest.fail(f"pod {pod}: {what} after {example.cluster.timeout_s:.0f}s: {annotations}")
        time.sleep(POLL_S)


def test_disruption_guard_annotations_appear_and_disappear(
    cluster: Cluster, host_driver: LocalDriver
) -> None:
    """The guarded claim's pod carries the two annotations while the claim is prepared;
    deleting the pod (held by a finalizer) unprepares it and the plugin removes them."""
    marker = f"{cluster.driver}/disruption-guard-set"
    pods = cluster.resource("v1", "Pod")
    with applied(
        cluster,
        "disruption-guard",
        host_driver.node,
        tolerate_unready=False,
        driver_logs=host_driver.logs,
    ) as example:
        example.wait_running()
        claim = wait_allocated(example, "pod0", "gpu")
        uid = claim["metadata"]["uid"]
        got = wait_annotations(
            example,
            "pod0",
            lambda a: all(a.get(k) == v for k, v in GUARD.items()) and uid in a.get(marker, ""),
            "no disruption-guard annotations",
        )
        assert json.loads(got[marker]) == {"claims": [uid], "set": sorted(GUARD)}
        merge = "application/merge-patch+json"
        pods.patch(
            body={"metadata": {"finalizers": [HOLD]}},
            name="pod0",
            namespace=example.namespace,
            content_type=merge,
        )
        try:
            cluster.core.delete_namespaced_pod("pod0", example.namespace)
            left = wait_annotations(
                example,
                "pod0",
                lambda a: not set(a) & {*GUARD, marker},
                "disruption-guard annotations still there after the claim's unprepare",
            )
            assert not set(left) & {*GUARD, marker}
        finally:
            pods.patch(
                body={"metadata": {"finalizers": None}},
                name="pod0",
                namespace=example.namespace,
                content_type=merge,
            )
    host_driver.check_alive()
