"""A controller-path cluster on the fake API: seeding helpers and a running controller.

Slices come from the real builder (fake H100s, ``allocator: controller``, 1.34
capabilities so shares are policy attributes); the DeviceClass
``share.gpu.fractional.dev`` carries the sentinel selector. Claims, pods and
namespaces are created in a namespace of the caller's choice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from dra_driver.allocator import quota_annotation, sentinel_expression
from dra_driver.app.controller import build_controller, serve
from dra_driver.controller import Controller, ControllerConfig
from dra_driver.controller.reconcile import CONTROLLER_CLASS
from dra_driver.core.settings import Allocator, Capabilities, GpuSettings, NodeSettings
from dra_driver.core.slices import build_slices
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.k8s.client import KubeClient, make_api_client
from tests.support.chart import NAMESPACE, client_as, controller_user
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

DRIVER = "gpu.fractional.dev"
LEASE_NAMESPACE = NAMESPACE
"""The controller's Lease lives in the chart's release namespace, where its Role is."""
QUOTA = quota_annotation(DRIVER)
GI = 1024**3
JsonObj = dict[str, Any]


def seed_cluster(api: FakeKubeApi, nodes: dict[str, str]) -> None:
    """``nodes``: name -> fake GPU spec (e.g. ``h100-80gb:2``); plus the shared class."""
    for node, spec in nodes.items():
        seed_node(api, node, spec)
    api.create(share_class())


def seed_node(api: FakeKubeApi, node: str, spec: str, labels: dict[str, str] | None = None) -> None:
    """A Node (with ``labels``) and the ResourceSlices of its fake GPUs ``spec``."""
    metadata: JsonObj = {"name": node} if labels is None else {"name": node, "labels": labels}
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": metadata})
    for d in build_slices(
        build_inventory(load_spec(spec), node),
        driver_name=DRIVER,
        node_name=node,
        settings=NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER)),
        capabilities=Capabilities.for_version(34),
    ):
        api.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{DRIVER}-{d.key}"},
                "spec": dict(d.spec),
            }
        )


def share_class(config: list[JsonObj] | None = None) -> JsonObj:
    """The DeviceClass ``share.gpu.fractional.dev`` (sentinel selector), with ``config``."""
    spec: JsonObj = {"selectors": [{"cel": {"expression": sentinel_expression(DRIVER)}}]}
    if config is not None:
        spec["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CONTROLLER_CLASS},
        "spec": spec,
    }


def make_namespace(api: FakeKubeApi, name: str, quota: str | None = None) -> JsonObj:
    annotations = {} if quota is None else {QUOTA: quota}
    return api.create(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "annotations": annotations},
        }
    )


def set_quota(api: FakeKubeApi, name: str, quota: str) -> None:
    namespace = api.get("Namespace", name)
    namespace["metadata"]["annotations"] = {QUOTA: quota}
    api.update(namespace)


def make_claim(
    api: FakeKubeApi,
    name: str,
    memory: str,
    namespace: str = "default",
    config: list[JsonObj] | None = None,
    *,
    device_class: str = CONTROLLER_CLASS,
) -> JsonObj:
    """A claim for ``memory`` of a share; ``config``: its ``spec.devices.config``."""
    devices: JsonObj = {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": device_class,
                    "capacity": {"requests": {"memory": memory}},
                },
            }
        ]
    }
    if config is not None:
        devices["config"] = config
    return api.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": devices},
        }
    )


def make_pod(
    api: FakeKubeApi, name: str, claim: str, namespace: str = "default", **spec: Any
) -> JsonObj:
    """An unscheduled pod that uses ``claim``; ``spec`` adds pod spec fields (nodeSelector)."""
    return api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "containers": [{"name": "main", "image": "x"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                **spec,
            },
            "status": {"phase": "Pending"},
        }
    )


def allocation_of(api: FakeKubeApi, name: str, namespace: str = "default") -> JsonObj | None:
    claim = api.get("ResourceClaim", name, namespace)
    alloc: JsonObj | None = (claim.get("status") or {}).get("allocation")
    return alloc


def events_for(
    api: FakeKubeApi, claim: str, reason: str | None = None, namespace: str = "default"
) -> list[JsonObj]:
    return [
        e
        for e in api.objects("Event", namespace)
        if e["involvedObject"]["name"] == claim and reason in (None, e["reason"])
    ]


def controller_config(identity: str = "ctrl-1", **overrides: Any) -> ControllerConfig:
    """Short timings for tests; ``overrides`` replace any field."""
    settings: dict[str, Any] = {
        "driver_name": DRIVER,
        "identity": identity,
        "lease_namespace": LEASE_NAMESPACE,
        "lease_duration_s": 2.0,
        "renew_deadline_s": 1.4,
        "renew_interval_s": 0.3,
        "retry_interval_s": 0.2,
        "read_timeout_s": 0.5,
        "resync_s": 5.0,
        "retry_unfit_s": 1.0,
        "error_backoff_s": 0.1,
        "metrics_refresh_s": 0.1,
    }
    return ControllerConfig(**(settings | overrides))


def controller_client(api: FakeKubeApi) -> KubeClient:
    """The controller's client: as its ServiceAccount where ``api`` enforces the chart."""
    if api.security is not None:
        return client_as(api, controller_user())
    return make_api_client(None, host=api.url)


@contextlib.asynccontextmanager
async def running(
    api: FakeKubeApi, *, claim_watch_lag_s: float = 0.0, **overrides: Any
) -> AsyncIterator[Controller]:
    """A running controller; ``claim_watch_lag_s`` delays every claim watch event it
    sees (a slow watch: only its in-flight records show its own recent writes)."""
    controller = build_controller(controller_client(api), controller_config(**overrides))
    if claim_watch_lag_s:
        informer = controller.claims
        apply = informer._apply
        loop = asyncio.get_running_loop()

        def lagging(etype: str, obj: JsonObj) -> None:
            loop.call_later(claim_watch_lag_s, apply, etype, obj)

        informer._apply = lagging  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(serve(controller, stop))
    try:
        await asyncio.wait_for(controller.synced(), 10)
        yield controller
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def settled(controller: Controller, rounds: int = 3) -> None:
    """The worker has nothing left (checked a few times, the watch may still deliver)."""
    for _ in range(rounds):
        await eventually(lambda: controller.elector.is_leader and controller.queue.idle())
        await asyncio.sleep(0.2)
