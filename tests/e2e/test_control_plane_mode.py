"""Control-plane-only mode (``E2E_MODE=control-plane``): a cluster without kubelets.

For an API server with scheduler and controller manager but no node: the test
creates a Node object (``E2E_NODE_NAME``, default ``fgd-e2e-node``, with the
opt-in label and a Ready status, so the scheduler considers it), runs the
kubelet plugin, the mps-agent (fake backend) and our controller here (each as its
chart ServiceAccount; the plugin publishes its GPUs for the controller too, so
the controller-path example runs beside the native ones), waits for the
node's ResourceSlices, applies each example (its pods kept on that node and
tolerating the not-ready/unreachable taints that appear with no kubelet), waits
until the scheduler allocated every claim, then plays the kubelet: registers
with the plugin and calls NodePrepareResources with the claims' references. It
asserts the answer against the allocation (devices, shareIDs of shares) and the
CDI spec file (one device per result, MPS edits for shares of MPS-shared GPUs),
unprepares, and checks that the spec is gone. The pods never start (no kubelet);
they are force-deleted before their namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.fakes.kubelet import PrepareResult
from tests.support.cluster import Cluster
from tests.support.e2e_identities import E2E_NAMESPACE, chart_identities
from tests.support.e2e_local_modes import (
    OPT_IN_LABEL,
    Case,
    LocalDriver,
    applied,
    case_params,
    check_case_specifics,
    check_prepared,
    check_spec,
    create_node,
    delete_node_slices,
    delete_quietly,
    ensure_device_classes,
    node_config_args,
    ref_of,
    require_case,
    require_cluster_kubeconfig,
    spec_path,
    wait_allocated,
)
from tests.support.examples import Obj

pytestmark = pytest.mark.e2e
E2E_MODE_OF = "control-plane"


@pytest.fixture(scope="module")
def local_node(cluster: Cluster) -> Iterator[LocalDriver]:
    """The fake node with our plugin and mps-agent running here for it."""
    kubeconfig = require_cluster_kubeconfig()
    name = os.environ.get("E2E_NODE_NAME") or "fgd-e2e-node"
    root = tempfile.mkdtemp(prefix="fgd-e2e-cp-")
    dirs = {d: os.path.join(root, d) for d in ("registry", "plugin", "cdi", "mps", "logs")}
    for path in dirs.values():
        os.makedirs(path)
    driver = LocalDriver(
        node=name,
        driver=cluster.driver,
        registry_dir=dirs["registry"],
        plugin_dir=dirs["plugin"],
        cdi_root=dirs["cdi"],
        log_dir=dirs["logs"],
    )
    classes: list[str] = []
    created = False
    stack = contextlib.ExitStack()
    try:
        classes = ensure_device_classes(cluster)
        create_node(cluster, name, "control-plane", {OPT_IN_LABEL: "true"})  # skips if not ours
        created = True
        # The plugin as its ServiceAccount (token bound to the Node just created), under
        # the RBAC and admission policies the chart installs for it.
        identities = chart_identities(cluster, name, kubeconfig, root, guard=False)
        kubeconfigs = stack.enter_context(identities)
        # The kind install's node config: an MPS-shared MIG GPU (mig-mps-shares). Our
        # controller too, as its ServiceAccount, for the controller-path example.
        driver.start(
            kubeconfigs.plugin,
            dirs["mps"],
            node_config_args(root),
            controller_kubeconfig=kubeconfigs.controller,
            lease_namespace=E2E_NAMESPACE,
        )
        driver.wait_registration_socket()
        driver.wait_slices(cluster)
        yield driver
    finally:
        driver.stop()
        if created:  # never a Node these tests did not make (a skip above leaves it be)
            delete_node_slices(cluster, name)
            delete_quietly(cluster, "v1", "Node", name)
        for class_name in classes:
            delete_quietly(cluster, "resource.k8s.io/v1", "DeviceClass", class_name)
        stack.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("case", case_params())
def test_example_prepared_by_the_local_plugin(
    case: Case, cluster: Cluster, local_node: LocalDriver
) -> None:
    require_case(case, cluster)
    with applied(
        cluster, case.name, local_node.node, tolerate_unready=True, driver_logs=local_node.logs
    ) as example:
        claims: list[Obj] = []
        for pod, entry in case.claims:
            claim = wait_allocated(example, pod, entry)
            selector = json.dumps(claim["status"]["allocation"].get("nodeSelector"))
            assert local_node.node in selector, f"allocated for another node: {selector}"
            claims.append(claim)
        check_case_specifics(case, claims, cluster.driver)
        refs = [ref_of(c) for c in claims]

        def check(prepared: dict[str, PrepareResult]) -> None:
            for claim, ref in zip(claims, refs, strict=True):
                spec, results = check_spec(
                    cluster, local_node.cdi_root, claim, case, local_node.node
                )
                check_prepared(case, claim, spec, results, prepared[ref.uid])

        errors = local_node.prepare_and_unprepare(refs, check)
        assert not any(errors.values()), errors
        for ref in refs:
            path = spec_path(local_node.cdi_root, cluster.driver, ref.uid)
            assert not Path(path).exists(), f"{path} left after NodeUnprepareResources"
        local_node.check_alive()
