"""The pure parts of hack/bench/controller_cluster.py: the API server's request counters
read from its metrics, the writes between two readings, the templates and pods."""

# ruff: noqa: E501 - the metric lines are the API server's, verbatim.
from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

METRICS = """\
# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="binding",verb="POST",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceclaims",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceclaims",scope="resource",subresource="status",verb="PATCH",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 99
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 3
apiserver_request_duration_seconds_count{verb="POST"} 4
"""


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = os.path.join(ROOT, "hack", "bench", "controller_cluster.py")
    spec = importlib.util.spec_from_file_location("bench_controller_cluster", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_request_totals_sum_codes_by_verb_resource_and_subresource(bench: ModuleType) -> None:
    totals = bench.request_totals(METRICS)
    assert totals[("PATCH", "resourceclaims", "status")] == 8  # 200 and 409 together
    assert totals[("POST", "pods", "binding")] == 10
    assert totals[("LIST", "pods", "")] == 3
    assert ("POST", "", "") not in totals  # another metric's samples are not read


def test_writes_between_two_readings_leave_out_reads_and_leases(bench: ModuleType) -> None:
    before = bench.request_totals(METRICS)
    after = bench.request_totals(
        METRICS.replace('verb="POST",version="v1"} 10', 'verb="POST",version="v1"} 16')
        .replace('verb="PUT",version="v1"} 99', 'verb="PUT",version="v1"} 120')
        .replace('verb="LIST",version="v1"} 3', 'verb="LIST",version="v1"} 30')
    )
    assert bench.writes_between(before, after) == {"POST pods/binding": 6}


def test_the_templates_of_each_path(bench: ModuleType) -> None:
    native = bench.claim_template("native", "10Gi")["spec"]["spec"]["devices"]["requests"][0]
    assert native["exactly"]["deviceClassName"] == "gpu.fractional.dev"
    assert native["exactly"]["capacity"] == {"requests": {"memory": "10Gi"}}
    assert "scheduler" in native["exactly"]["selectors"][0]["cel"]["expression"]
    ours = bench.claim_template("controller", "40Gi")["spec"]["spec"]["devices"]["requests"][0]
    assert ours["exactly"] == {
        "deviceClassName": "share.gpu.fractional.dev",
        "capacity": {"requests": {"memory": "40Gi"}},
    }
    pod = bench.pod_object("pod-0001", "40Gi", "img")
    assert pod["spec"]["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "share-40gi"}
    ]


def test_gpus_used_and_the_owner_of_a_claim(bench: ModuleType) -> None:
    def claim(pod: str, device: str) -> dict[str, object]:
        result = {"pool": "n1", "device": device}
        return {
            "metadata": {"ownerReferences": [{"kind": "Pod", "name": pod, "controller": True}]},
            "status": {"allocation": {"devices": {"results": [result]}}},
        }

    claims = [claim("a", "gpu-0"), claim("b", "gpu-0"), claim("c", "gpu-1")]
    assert bench.gpus_used(claims) == 2
    assert bench.owner_pod(claims[1]) == "b"
    assert bench.owner_pod({"metadata": {}}) is None
