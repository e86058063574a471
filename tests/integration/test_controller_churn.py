"""Pods and claims that come and go leave the controller's memory flat.

A real controller (``build_controller``: its informers, caches, claim/pod index,
in-flight records, sizes and queue) is fed watch events the way its watches feed it
(``Informer._arrive`` on the loop, each object freshly decoded JSON, applied at once):
CYCLES claims with their pods created, allocated, run and
deleted, ALIVE of them alive at a time, the claims the controller's own (so each goes
through its queue: taken and marked done as its worker would). Memory is counted as
the interpreter's allocated blocks after a full collection (``sys.getallocatedblocks``:
exact, cheap, unmoved by what other processes on the machine do, unlike RSS); after a
warm-up their trend must stay under half a block a cycle (one string kept every other
cycle). The control keeps the same churn's strings in a table that never lets go
(what ``sys.intern`` is on Python 3.12): it must break the bound, so the check can fail.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from collections.abc import Iterator

import pytest

from dra_driver.app.controller import build_controller
from dra_driver.controller import slim
from dra_driver.controller.informer import Informer
from dra_driver.controller.main import Controller
from dra_driver.k8s.rest import JsonObj
from tests.support.controller_env import DRIVER, controller_client, controller_config
from tests.support.fakekube import FakeKubeApi

CYCLES = 20_400
ALIVE = 1_000
CONTROL_CYCLES = 12_000
"""The control's churn: enough past the warm-up to show what it keeps."""
WARM_UP = 4_800
"""Cycles before the first sample: the caches full, the string tables through a start
afresh (each holds 4,096 strings; about three new ones a cycle)."""
SAMPLES = 6
"""At the warm-up's end, then every (cycles - WARM_UP) / 5 cycles."""
CHUNK = 240
"""Cycles fed at a time (the samples fall between two)."""
MAX_BLOCKS_PER_CYCLE = 0.5
"""The most the samples' trend (least squares) may rise per cycle. Measured (Python
3.11, 12,600 cycles): the samples move within 3,200 blocks of the first with no
trend; the control keeps 3.0 blocks a cycle (a claim's name, its timestamp, a pod's
name), so one string kept every other cycle would fail."""

CLASS = "share.gpu.fractional.dev"


def _claim(n: int, node: str, allocated: bool) -> str:
    """A claim as the watch delivers it (text: decoded fresh for each event)."""
    name, memory = f"job-{n:06d}", ("4Gi", "10Gi", "20Gi", "40Gi")[n % 4]
    share = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuShare", "memory": memory}
    config = {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": share}}
    claim: JsonObj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": "churn",
            "uid": f"claim-{n:08d}-0000-4000-8000-000000000000",
            "resourceVersion": str(10 * n + (2 if allocated else 1)),
            "creationTimestamp": f"2026-12-05T{n // 3600 % 24:02d}:{n // 60 % 60:02d}:"
            f"{n % 60:02d}Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update"}],
        },
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}],
                "config": [config],
            }
        },
    }
    if allocated:
        claim["metadata"]["finalizers"] = [f"{DRIVER}/allocation"]
        share_id = f"share-{n:08d}"
        grant = {"kind": "GpuShareGrant", "shareID": share_id}
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": DRIVER,
                            "pool": node,
                            "device": f"gpu-{n % 8}",
                            "shareID": share_id,
                            "consumedCapacity": {"memory": memory},
                        }
                    ],
                    "config": [
                        {"source": "FromClaim", **config},
                        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": grant}},
                    ],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "values": [node]}]}
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": name, "uid": f"pod-{n:08d}"}],
        }
    return json.dumps(claim)


def _pod(n: int, node: str, running: bool) -> str:
    name = f"job-{n:06d}"
    tolerations = [
        {"key": f"node.kubernetes.io/{why}", "operator": "Exists", "effect": "NoExecute"}
        for why in ("not-ready", "unreachable")
    ]
    pod: JsonObj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "churn",
            "uid": f"pod-{n:08d}",
            "resourceVersion": str(10 * n + (4 if running else 3)),
        },
        "spec": {
            "nodeName": node if running else "",
            "containers": [{"name": "main", "image": "x"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "tolerations": tolerations,
        },
        "status": {
            "phase": "Running" if running else "Pending",
            "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    return json.dumps(pod)


def _events(n: int) -> Iterator[tuple[str, str, str]]:
    """(informer, type, JSON) of claim ``n``'s life, and of the one ALIVE before it
    ending: created, allocated (the controller's write echoed), its pod bound and
    running; then the older one's pod and claim deleted."""
    node = f"node-{n % 50:02d}"
    yield "claims", "ADDED", _claim(n, node, allocated=False)
    yield "pods", "ADDED", _pod(n, node, running=False)
    yield "claims", "MODIFIED", _claim(n, node, allocated=True)
    yield "pods", "MODIFIED", _pod(n, node, running=True)
    if n >= ALIVE:
        gone, gone_node = n - ALIVE, f"node-{(n - ALIVE) % 50:02d}"
        yield "pods", "DELETED", _pod(gone, gone_node, running=True)
        yield "claims", "DELETED", _claim(gone, gone_node, allocated=True)


def _feed(informers: dict[str, Informer], cycles: range) -> None:
    """On the loop, as a watch reads events: each one decoded, then applied."""
    for n in cycles:
        for kind, etype, text in _events(n):
            informers[kind]._arrive(etype, json.loads(text))


async def _applied(controller: Controller) -> None:
    """The queue's claims taken and done, as the worker does (it would find nothing to
    do for most); a pass of the loop for what the changes scheduled."""
    await asyncio.sleep(0)
    for uid in controller.queue.take_all():
        controller.queue.done(uid)


async def _churn(api: FakeKubeApi, cycles: int = CYCLES) -> list[tuple[int, int]]:
    """(cycles done, allocated blocks after a full collection) at each sample."""
    controller = build_controller(controller_client(api), controller_config())
    informers = {"claims": controller.claims, "pods": controller.pods}
    step = (cycles - WARM_UP) // (SAMPLES - 1)
    samples: list[tuple[int, int]] = []
    try:
        for start in range(0, cycles, CHUNK):
            _feed(informers, range(start, start + CHUNK))
            await _applied(controller)
            done = start + CHUNK
            if done >= WARM_UP and (done - WARM_UP) % step == 0:
                assert len(controller.claims.objects) == len(controller.pods.objects) == ALIVE
                gc.collect()
                samples.append((done, sys.getallocatedblocks()))
    finally:
        await controller.close()
    return samples


def _trend(samples: list[tuple[int, int]]) -> float:
    """Blocks per cycle: the least-squares slope through the samples."""
    xs, ys = [x for x, _ in samples], [y for _, y in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in samples) / sum((x - mx) ** 2 for x in xs)


def test_claims_and_pods_coming_and_going_leave_memory_flat(fake_kube: FakeKubeApi) -> None:
    samples = asyncio.run(_churn(fake_kube))
    print("(cycles, allocated blocks):", samples, f"trend {_trend(samples):.3f} a cycle")
    assert len(samples) == SAMPLES
    assert _trend(samples) < MAX_BLOCKS_PER_CYCLE, f"(cycles, allocated blocks): {samples}"


def test_the_check_fails_when_strings_are_never_let_go(
    fake_kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: each informer's string table never starting afresh keeps every
    name and timestamp it saw, as ``sys.intern`` does on Python 3.12."""
    monkeypatch.setattr(slim.Strings.__init__, "__defaults__", (sys.maxsize,))
    samples = asyncio.run(_churn(fake_kube, CONTROL_CYCLES))
    print("(cycles, allocated blocks):", samples, f"trend {_trend(samples):.3f} a cycle")
    assert len(samples) == SAMPLES
    assert _trend(samples) > MAX_BLOCKS_PER_CYCLE, f"(cycles, allocated blocks): {samples}"
