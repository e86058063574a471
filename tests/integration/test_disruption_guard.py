"""The disruption guard in the plugin: real prepare and unprepare over the real socket,
claims and pods read from and patched in the fake API server over HTTP."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dra_driver.app.plugin import GuardOptions, Plugin, PluginParts, start_plugin
from dra_driver.core.claim_writes import (
    CA_SAFE_TO_EVICT,
    KARPENTER_DO_NOT_DISRUPT,
    GuardMode,
    guarded_claims,
    marker_key,
    opt_in_key,
)
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import KUBELET_DRA_SERVICES, FakeKubelet, RegisteredPlugin
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.pods import PodApi
from dra_driver.k8s.transport import ApiTransport
from dra_driver.observability.metrics_server import MetricsRegistry, new_registry
from dra_driver.plugin.claim_reporting import COMPONENT
from dra_driver.plugin.disruption_guard import DisruptionGuard
from tests.support.chart import GUARD_VALUES
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked

pytestmark = pytest.mark.chart(GUARD_VALUES)
"""The plugin runs as its ServiceAccount under the chart's RBAC and admission policies."""

MARKER = marker_key(DRIVER)
GUARD = {KARPENTER_DO_NOT_DISRUPT: "true", CA_SAFE_TO_EVICT: "false"}
OPTED_IN = {opt_in_key(DRIVER): "true"}


def claim(
    name: str, device: str = "gpu-0", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    obj = resource_claim("default", name, devices=[Allocated(device)])
    if annotations:
        obj["metadata"]["annotations"] = annotations
    return obj


def pod(
    name: str,
    *,
    claim_name: str | None = None,
    template_claim: str | None = None,
    extended_claim: str | None = None,
    node: str = NODE,
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A valid Pod bound to ``node`` that uses a claim directly, through a template (its
    generated name in status) or as the scheduler's extended-resource claim."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
    }
    status: dict[str, Any] = {"phase": phase}
    if claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    if template_claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "tmpl"}]
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": template_claim}]
    if extended_claim:
        status["extendedResourceClaimStatus"] = {
            "resourceClaimName": extended_claim,
            "requestMappings": [
                {
                    "containerName": "main",
                    "resourceName": "nvidia.com/gpu",
                    "requestName": "container-0-request-0",
                }
            ],
        }
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pod_annotations(fake: FakeKubeApi, name: str) -> dict[str, str]:
    got: dict[str, str] = fake.get("Pod", name, "default")["metadata"].get("annotations") or {}
    return got


def guard_keys_of(fake: FakeKubeApi, name: str) -> dict[str, str]:
    return {k: v for k, v in pod_annotations(fake, name).items() if k in GUARD or k == MARKER}


@contextlib.asynccontextmanager
async def plugin_guarding(
    dirs: NodeDirs,
    api: ApiTransport,
    mode: GuardMode = GuardMode.ANNOTATED,
    *,
    metrics: MetricsRegistry | None = None,
    interval_s: float = 0,
) -> AsyncIterator[tuple[Plugin, RegisteredPlugin, DisruptionGuard]]:
    events = EventRecorder(api, component=COMPONENT, instance=NODE, interval_s=60)
    claims = KubernetesClaimSource(api, request_timeout_s=5)
    runtime = await start_plugin(
        PluginParts(
            dirs.config(),
            FakeGpuBackend("h100-80gb:2", NODE),
            claims,
            metrics=metrics,
            disruption_guard=GuardOptions(
                PodApi(api, NODE), mode=mode, interval_s=interval_s, events=events
            ),
        )
    )
    guard = runtime.disruption_guard
    assert guard is not None
    kubelet = FakeKubelet(dirs.registry, KUBELET_DRA_SERVICES)
    try:
        registered = await kubelet.wait_for_plugin(DRIVER)
        # The first pass over the node's pods, started with the plugin.
        await eventually(lambda: guard.synced, "the guard's first pass over the pods")
        yield runtime, registered, guard
    finally:
        await kubelet.close()
        await runtime.stop()
        await events.close()


def test_prepare_guards_the_claims_pods_on_this_node_and_unprepare_releases_them(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    guarded = fake_kube.create(claim("guarded", annotations=OPTED_IN))
    plain = fake_kube.create(claim("plain", "gpu-1"))
    fake_kube.create(pod("direct", claim_name="guarded"))
    fake_kube.create(pod("templated", template_claim="guarded"))
    fake_kube.create(pod("extended", extended_claim="guarded"))
    fake_kube.create(pod("elsewhere", claim_name="guarded", node="node-b"))
    fake_kube.create(pod("done", claim_name="guarded", phase="Succeeded"))
    fake_kube.create(pod("unrelated", claim_name="plain"))
    fake_kube.create(pod("bare"))
    metrics = new_registry("kubelet-plugin")
    uid = guarded["metadata"]["uid"]

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api, metrics=metrics) as (_, plugin, guard):
            results = await plugin.prepare([claim_ref(guarded), claim_ref(plain)])
            assert not any(r.error for r in results.values()), results
            assert await guard.flush()
            for name in ("direct", "templated", "extended"):
                got = pod_annotations(fake_kube, name)
                assert {k: got.get(k) for k in GUARD} == GUARD, name
                assert guarded_claims(got, DRIVER) == {uid}
            for name in ("elsewhere", "done", "unrelated", "bare"):
                assert guard_keys_of(fake_kube, name) == {}, name
            assert guard.guarded_pods == 3
            assert metrics.get_sample_value("fractional_gpu_dra_disruption_guarded_pods") == 3

            # Pods are written only by merge patches of their annotations.
            writes = [
                r
                for r in fake_kube.request_log
                if r.method in ("PUT", "PATCH", "POST") and "/pods" in r.path
            ]
            assert writes and all(r.method == "PATCH" for r in writes)

            await plugin.unprepare([claim_ref(guarded), claim_ref(plain)])
            assert await guard.flush()
            for name in ("direct", "templated", "extended", "unrelated"):
                assert guard_keys_of(fake_kube, name) == {}, name
            assert guard.guarded_pods == 0
            assert metrics.get_sample_value("fractional_gpu_dra_disruption_guarded_pods") == 0

    run_checked(scenario())


def test_a_users_own_annotations_are_never_removed(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    guarded = fake_kube.create(claim("guarded", annotations=OPTED_IN))
    mine = {KARPENTER_DO_NOT_DISRUPT: "true", "team": "llm"}
    fake_kube.create(pod("user-said-so", claim_name="guarded", annotations=mine))
    fake_kube.create(
        pod("user-allows-eviction", claim_name="guarded", annotations={CA_SAFE_TO_EVICT: "true"})
    )

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            await plugin.prepare([claim_ref(guarded)])
            assert await guard.flush()
            got = pod_annotations(fake_kube, "user-said-so")
            assert got[KARPENTER_DO_NOT_DISRUPT] == "true" and got[CA_SAFE_TO_EVICT] == "false"
            got = pod_annotations(fake_kube, "user-allows-eviction")
            assert got[CA_SAFE_TO_EVICT] == "true"  # the user's choice stands
            assert got[KARPENTER_DO_NOT_DISRUPT] == "true"
            await plugin.unprepare([claim_ref(guarded)])
            assert await guard.flush()

    run_checked(scenario())
    assert pod_annotations(fake_kube, "user-said-so") == mine
    assert pod_annotations(fake_kube, "user-allows-eviction") == {CA_SAFE_TO_EVICT: "true"}


@pytest.mark.parametrize(
    "case",
    [
        (GuardMode.ANNOTATED, {}, False),
        (GuardMode.ANNOTATED, {opt_in_key(DRIVER): "false"}, False),
        (GuardMode.ALL, {opt_in_key(DRIVER): "false"}, False),
        (GuardMode.ALL, {}, True),
    ],
    ids=["annotated-not-asked", "annotated-refused", "all-refused", "all-default"],
)
def test_which_claims_are_guarded(
    fake_kube: FakeKubeApi,
    api: ApiTransport,
    node_dirs: NodeDirs,
    case: tuple[GuardMode, dict[str, str], bool],
) -> None:
    mode, claim_annotations, guarded = case
    obj = fake_kube.create(claim("c", annotations=claim_annotations))
    fake_kube.create(pod("p", claim_name="c"))

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api, mode) as (_, plugin, guard):
            fake_kube.clear_requests()
            await plugin.prepare([claim_ref(obj)])
            assert await guard.flush()
            assert bool(guard_keys_of(fake_kube, "p")) is guarded
            if not guarded:
                # Opted out: the pod is not even read, let alone written.
                assert not [r for r in fake_kube.requests if "/pods" in r[1]]

    run_checked(scenario())


@pytest.mark.parametrize("status", [403, 500])
def test_api_errors_never_fail_a_prepare(
    fake_kube: FakeKubeApi,
    api: ApiTransport,
    node_dirs: NodeDirs,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    obj = fake_kube.create(claim("c", annotations=OPTED_IN))
    fake_kube.create(pod("p", claim_name="c"))

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            fake_kube.fail_next("GET", "/pods", status, times=10)
            result = await plugin.prepare([claim_ref(obj)])
            assert not result[claim_ref(obj).uid].error
            assert await guard.flush()
            assert guard.events is not None and await guard.events.flush()

    with caplog.at_level(logging.WARNING):
        run_checked(scenario())
    assert guard_keys_of(fake_kube, "p") == {}
    (event,) = [e for e in fake_kube.objects("Event") if e["reason"] == "DisruptionGuardFailed"]
    assert event["involvedObject"]["name"] == "c" and event["type"] == "Warning"
    if status == 403:
        assert any("get, list and patch on pods" in r.getMessage() for r in caplog.records)


def test_a_refused_patch_never_fails_a_prepare(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    obj = fake_kube.create(claim("c", annotations=OPTED_IN))
    fake_kube.create(pod("p", claim_name="c"))

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            fake_kube.fail_next("PATCH", "/pods/p", 403)
            result = await plugin.prepare([claim_ref(obj)])
            assert not result[claim_ref(obj).uid].error
            assert await guard.flush()
            assert guard_keys_of(fake_kube, "p") == {}

    run_checked(scenario())


def test_a_conflict_is_tried_again_on_a_fresh_read(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    obj = fake_kube.create(claim("c", annotations=OPTED_IN))
    fake_kube.create(pod("p", claim_name="c"))

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            fake_kube.fail_next("PATCH", "/pods/p", 409)
            await plugin.prepare([claim_ref(obj)])
            assert await guard.flush()
            assert {k: guard_keys_of(fake_kube, "p").get(k) for k in GUARD} == GUARD

    run_checked(scenario())


def test_the_periodic_pass_guards_late_pods_and_drops_stale_claims(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    """A second pod on a prepared claim (the kubelet does not prepare again) is guarded by
    the next pass; a marker naming a claim that is not prepared (unprepared while the
    plugin was down) is dropped, with the keys it set."""
    shared = fake_kube.create(claim("shared", annotations=OPTED_IN))
    fake_kube.create(pod("first", claim_name="shared"))
    stale_marker = '{"claims":["gone-uid"],"set":["karpenter.sh/do-not-disrupt"]}'
    fake_kube.create(
        pod("stale", annotations={KARPENTER_DO_NOT_DISRUPT: "true", MARKER: stale_marker, "a": "b"})
    )

    async def scenario() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            assert await guard.flush()
            await plugin.prepare([claim_ref(shared)])
            assert await guard.flush()
            fake_kube.create(pod("second", claim_name="shared"))
            await guard.resync()
            assert {k: guard_keys_of(fake_kube, "second").get(k) for k in GUARD} == GUARD
            assert pod_annotations(fake_kube, "stale") == {"a": "b"}
            assert guard.guarded_pods == 2

    run_checked(scenario())


def test_a_restarted_plugin_releases_what_it_guarded_before(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs
) -> None:
    obj = fake_kube.create(claim("c", annotations=OPTED_IN))
    fake_kube.create(pod("p", claim_name="c"))

    async def first() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            await plugin.prepare([claim_ref(obj)])
            assert await guard.flush()

    async def second() -> None:
        async with plugin_guarding(node_dirs, api) as (_, plugin, guard):
            # The first pass learnt from the pod's marker that the claim guards.
            assert guard.guarded_pods == 1
            await plugin.unprepare([claim_ref(obj)])
            assert await guard.flush()

    run_checked(first())
    assert guard_keys_of(fake_kube, "p")
    run_checked(second())
    assert guard_keys_of(fake_kube, "p") == {}
