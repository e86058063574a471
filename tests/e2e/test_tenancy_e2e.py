"""One namespace per legacy MPS daemon, on a real API server with the chart's controller.

A legacy MPS daemon hands each client its ``control`` socket and ``/dev/shm``, so the
driver keeps it to one Kubernetes namespace's claims (issue 33). On the controller
path that is the controller's rule: a GPU published with ``mpsTenancy: namespace``
(legacy MPS, ``allocator: controller``) takes shares of the namespace it already
serves only. The test publishes such a node's slices exactly as the kubelet plugin
builds them for a legacy agent (a kubelet-less Node, as the control-plane mode
makes), then claims a share from three namespaces: the first gets a GPU, the second
is placed on the other GPU, the third stays unallocated with the controller's
``CannotAllocate`` Event naming the rule. Chart mode, with ``E2E_CONTROLLER_PATH=1``.
The pods never run (no kubelet); they are force-deleted before their namespaces.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from tests.support.cluster import Cluster, delete_namespace, wait_for_event
from tests.support.e2e_local_modes import create_node, delete_node_slices, delete_quietly
from tests.support.examples import Obj, pod_image

pytestmark = pytest.mark.e2e

NODE = os.environ.get("E2E_TENANCY_NODE") or "fgd-e2e-tenancy-node"
NAMESPACES = ("fgd-tenant-a", "fgd-tenant-b", "fgd-tenant-c")
CLASS = "share.gpu.fractional.dev"


@pytest.fixture
def legacy_node(cluster: Cluster) -> Iterator[str]:
    """A kubelet-less Node with two GPUs' slices as a legacy agent's plugin publishes
    them for the controller (``mpsTenancy: namespace``)."""
    if os.environ.get("E2E_CONTROLLER_PATH") != "1":
        pytest.skip("the controller path: set E2E_CONTROLLER_PATH=1 (the chart's controller)")
    settings = NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER), legacy_mps=True)
    built = build_slices(
        build_inventory(load_spec("h100-80gb:2"), NODE),
        driver_name=cluster.driver,
        node_name=NODE,
        settings=settings,
        capabilities=Capabilities.for_version(cluster.version[1]),
    )
    slices = cluster.resource("resource.k8s.io/v1", "ResourceSlice")
    created = False
    try:
        create_node(cluster, NODE, "tenancy", {})
        created = True
        for desired in built:
            spec = dict(desired.spec)
            spec["pool"] = {**spec["pool"], "generation": 1}
            slices.create(
                body={
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{NODE}-{desired.key}"},
                    "spec": spec,
                }
            )
        yield NODE
    finally:
        if created:
            delete_node_slices(cluster, NODE)
            delete_quietly(cluster, "v1", "Node", NODE)


def _claim(driver: str, namespace: str) -> Obj:
    has_tenancy = f'has(device.attributes["{driver}"].mpsTenancy)'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "share", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CLASS,
                            "selectors": [{"cel": {"expression": has_tenancy}}],
                        },
                    }
                ],
                "config": [
                    {
                        "requests": ["gpu"],
                        "opaque": {
                            "driver": driver,
                            "parameters": {
                                "apiVersion": f"{driver}/v1alpha1",
                                "kind": "GpuShare",
                                "memory": "10Gi",
                            },
                        },
                    }
                ],
            }
        },
    }


def _pod() -> Obj:
    return pod_image(
        {
            "metadata": {"name": "pod0"},
            "spec": {
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}],
            },
        }
    )


def _force_delete_pods(cluster: Cluster, namespace: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.core.delete_namespaced_pod("pod0", namespace, grace_period_seconds=0)
    except ApiException as err:
        if err.status != 404:
            raise


def test_a_legacy_gpu_serves_one_namespace_on_the_controller_path(
    cluster: Cluster, legacy_node: str
) -> None:
    claims = cluster.resource("resource.k8s.io/v1", "ResourceClaim")
    for namespace in NAMESPACES:
        assert delete_namespace(cluster, namespace), f"{namespace}: left over and stuck"
    try:
        devices: dict[str, str] = {}
        # One at a time, so which namespace comes first is known.
        for namespace in NAMESPACES[:2]:
            cluster.core.create_namespace({"metadata": {"name": namespace}})
            claims.create(namespace=namespace, body=_claim(cluster.driver, namespace))
            cluster.core.create_namespaced_pod(namespace, _pod())
            deadline = time.monotonic() + cluster.timeout_s
            allocation = None
            while time.monotonic() < deadline and not allocation:
                claim = claims.get(name="share", namespace=namespace).to_dict()
                allocation = (claim.get("status") or {}).get("allocation")
                time.sleep(1)
            assert allocation, f"{namespace}: its share was never allocated"
            (result,) = allocation["devices"]["results"]
            assert result["pool"] == legacy_node, result
            devices[namespace] = result["device"]
        a, b = NAMESPACES[:2]
        assert devices[a] != devices[b], f"two namespaces on one legacy daemon: {devices}"

        c = NAMESPACES[2]
        cluster.core.create_namespace({"metadata": {"name": c}})
        claims.create(namespace=c, body=_claim(cluster.driver, c))
        cluster.core.create_namespaced_pod(c, _pod())
        rule = f"kept off for namespace {c}"
        messages = wait_for_event(
            cluster, c, "share", lambda e: e.startswith("CannotAllocate:") and rule in e
        )
        assert any(m.startswith("CannotAllocate:") and rule in m for m in messages), (
            f"no CannotAllocate Event naming the one-namespace rule; events: {messages}"
        )
        claim = claims.get(name="share", namespace=c).to_dict()
        assert not (claim.get("status") or {}).get("allocation")
    finally:
        for namespace in NAMESPACES:
            _force_delete_pods(cluster, namespace)
        for namespace in NAMESPACES:
            assert delete_namespace(cluster, namespace), f"{namespace}: not gone"
