"""The pure arithmetic of hack/bench/controller.py: quantiles, rates, bounds, request kinds."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import Counter
from types import ModuleType

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
GI = 1024**3


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = os.path.join(ROOT, "hack", "bench", "controller.py")
    spec = importlib.util.spec_from_file_location("bench_controller", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def test_percentile_is_the_nearest_rank(bench: ModuleType) -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100, shuffled order does not matter
    assert bench.percentile(list(reversed(values)), 0.5) == 50.0
    assert bench.percentile(values, 0.99) == 99.0
    assert bench.percentile(values, 1.0) == 100.0
    assert bench.percentile([3.0], 0.99) == 3.0
    assert bench.percentile([], 0.5) == 0.0


def test_throughput_runs_from_the_first_pod_to_the_last_allocation(bench: ModuleType) -> None:
    # 4 claims, the first pod at t=10, the last allocation at t=12: 2 per second.
    assert bench.throughput([10.0, 10.5, 11.0, 11.5], [10.2, 11.0, 12.0, 11.9]) == 2.0
    assert bench.throughput([1.0], []) == 0.0


def test_lower_bound_rounds_the_shares_up_to_whole_gpus(bench: ModuleType) -> None:
    assert bench.lower_bound([40 * GI, 40 * GI], 80 * GI) == 1
    assert bench.lower_bound([40 * GI, 40 * GI, 4 * GI], 80 * GI) == 2
    assert bench.lower_bound([], 80 * GI) == 0


def test_the_pairing_bound_counts_the_shares_no_two_of_which_fit_one_gpu(
    bench: ModuleType,
) -> None:
    # Two 40 Gi shares on 79.6 GiB GPUs: the memory alone says 2, pairing says 3.
    gpu = int(79.6 * GI)
    shares = [40 * GI, 40 * GI, 40 * GI, 4 * GI]
    assert bench.lower_bound(shares, gpu) == 2
    assert bench.pairing_bound(shares, gpu) == 3
    # Small shares only: the memory bound is the tighter one.
    assert bench.pairing_bound([10 * GI] * 16, 80 * GI) == 2
    assert bench.pairing_bound([], gpu) == 0


def test_the_share_mix_is_seeded_and_of_the_four_sizes(bench: ModuleType) -> None:
    mix = bench.share_mix(400)
    assert mix == bench.share_mix(400)
    assert mix != bench.share_mix(400, seed=1)
    assert set(mix) == {"4Gi", "10Gi", "20Gi", "40Gi"}
    assert bench.gibibytes("20Gi") == 20 * GI
    with pytest.raises(ValueError, match="not a quantity in Gi"):
        bench.gibibytes("20G")


@pytest.mark.parametrize(
    ("method", "path", "query", "kind"),
    [
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/b/resourceclaims/c1",
            {},
            "PATCH resourceclaims",
        ),
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/b/resourceclaims/c1/status",
            {},
            "PATCH resourceclaims/status",
        ),
        ("POST", "/api/v1/namespaces/b/events", {}, "POST events"),
        ("GET", "/api/v1/pods", {"watch": ["true"]}, "WATCH pods"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices", {}, "LIST resourceslices"),
        ("GET", "/api/v1/namespaces/b/pods/p1", {}, "GET pods"),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/l", {}, "PUT leases"),
    ],
)
def test_request_kind(
    bench: ModuleType, method: str, path: str, query: dict[str, list[str]], kind: str
) -> None:
    assert bench.request_kind(method, path, query) == kind


def test_claim_writes_count_the_claims_own_writes_per_claim(bench: ModuleType) -> None:
    kinds = Counter(
        {"PATCH resourceclaims": 10, "PATCH resourceclaims/status": 12, "POST events": 10}
    )
    by_kind = bench.per_claim(kinds, 10)
    assert by_kind["PATCH resourceclaims/status"] == pytest.approx(1.2)
    assert bench.claim_writes(by_kind) == pytest.approx(2.2)  # Events are not the claim's


def test_cpu_and_memory_from_proc(bench: ModuleType) -> None:
    # comm holds a space and a parenthesis; utime 150, stime 50 (fields 14 and 15).
    stat = "42 (python (x) y) S 1 42 42 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 3 0"
    assert bench.cpu_ticks(stat) == 200
    status = "Name:\tpython\nVmHWM:\t   90000 kB\nVmRSS:\t   81920 kB\n"
    assert bench.status_kib(status, "VmRSS") == 81920
    assert bench.status_kib(status, "VmHWM") == 90000
    with pytest.raises(ValueError, match="VmSwap"):
        bench.status_kib(status, "VmSwap")
    own = bench.proc_file(os.getpid(), "stat")
    assert bench.cpu_ticks(own) >= 0


def test_events_written_are_the_answered_event_posts(bench: ModuleType) -> None:
    class Request:
        def __init__(self, method: str, path: str) -> None:
            self.method, self.path = method, path

    class Answer:
        def __init__(self, method: str, path: str, code: int, at: float) -> None:
            self.request, self.code, self.at = Request(method, path), code, at

    answers = [
        Answer("POST", "/api/v1/namespaces/bench/events", 201, 1.0),
        Answer("POST", "/api/v1/namespaces/bench/events", 403, 2.0),  # refused: not written
        Answer("PATCH", "/api/v1/namespaces/bench/events/e1", 200, 3.0),  # a count, not one
        Answer("PATCH", "/apis/resource.k8s.io/v1/namespaces/b/resourceclaims/c/status", 200, 4),
        Answer("POST", "/api/v1/namespaces/bench/events", 201, 5.0),
    ]
    assert bench.events_written(answers) == [1.0, 5.0]
