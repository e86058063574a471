"""The pure helpers of hack/bench/kubelet_prepare.py: the kubelet's histogram read per
driver and method, the phases' deltas and the MPS/whole tally."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from types import ModuleType
from typing import Any

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

METHOD = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
FAMILY = "dra_grpc_operations_duration_seconds"


def sample(kind: str, driver: str, code: str, method: str, value: float) -> str:
    """One line of the kubelet's histogram, labelled as the real kubelet labels it
    (read off Kubernetes 1.36.2's /metrics)."""
    labels = f'driver_name="{driver}",grpc_status_code="{code}",method_name="{METHOD}{method}"'
    return f"{FAMILY}_{kind}{{{labels}}} {value}"


# Two status codes for one method, another driver beside ours, another family.
KUBELET_TEXT = "\n".join(
    [
        f"# HELP {FAMILY} [ALPHA] Duration in seconds of the DRA gRPC operations",
        f"# TYPE {FAMILY} histogram",
        sample("bucket", "gpu.fractional.dev", "OK", "NodePrepareResources", 4).replace(
            "}", ',le="+Inf"}'
        ),
        sample("sum", "gpu.fractional.dev", "OK", "NodePrepareResources", 0.2),
        sample("count", "gpu.fractional.dev", "OK", "NodePrepareResources", 4),
        sample("sum", "gpu.fractional.dev", "Unavailable", "NodePrepareResources", 0.1),
        sample("count", "gpu.fractional.dev", "Unavailable", "NodePrepareResources", 1),
        sample("sum", "gpu.fractional.dev", "OK", "NodeUnprepareResources", 0.05),
        sample("count", "gpu.fractional.dev", "OK", "NodeUnprepareResources", 5),
        sample("sum", "gpu.example.com", "OK", "NodePrepareResources", 9.0),
        sample("count", "gpu.example.com", "OK", "NodePrepareResources", 3),
        "# HELP dra_operations_duration_seconds [ALPHA] per pod",
        "# TYPE dra_operations_duration_seconds histogram",
        'dra_operations_duration_seconds_sum{is_error="false",operation_name="Prepare"} 7',
        'dra_operations_duration_seconds_count{is_error="false",operation_name="Prepare"} 7',
        "",
    ]
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = os.path.join(ROOT, "hack", "bench", "kubelet_prepare.py")
    spec = importlib.util.spec_from_file_location("bench_kubelet_prepare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_totals_are_per_driver_and_method_over_every_status_code(bench: ModuleType) -> None:
    ours = bench.kubelet_totals(KUBELET_TEXT, "gpu.fractional.dev")
    assert set(ours) == {"NodePrepareResources", "NodeUnprepareResources"}
    assert ours["NodePrepareResources"].calls == 5
    assert ours["NodePrepareResources"].seconds == pytest.approx(0.3)
    assert ours["NodePrepareResources"].mean_ms == pytest.approx(60.0)
    assert ours["NodeUnprepareResources"].mean_ms == pytest.approx(10.0)
    other = bench.kubelet_totals(KUBELET_TEXT, "gpu.example.com")
    assert other["NodePrepareResources"].mean_ms == pytest.approx(3000.0)
    assert bench.kubelet_totals(KUBELET_TEXT, "nobody") == {}


def test_a_phase_counts_only_the_calls_made_during_it(bench: ModuleType) -> None:
    before = {"NodePrepareResources": bench.Totals(0.3, 5)}
    after = {"NodePrepareResources": bench.Totals(1.3, 15)}
    got = bench.delta(after, before, "NodePrepareResources")
    assert (got.calls, got.mean_ms) == (10, pytest.approx(100.0))
    first = bench.delta(after, {}, "NodePrepareResources")
    assert first.calls == 15
    assert math.isnan(bench.delta({}, {}, "NodeUnprepareResources").mean_ms)


def phase(bench: ModuleType, name: str, prepare_ms: float, unprepare_ms: float) -> Any:
    return bench.PhaseResult(
        name,
        bench.Totals(prepare_ms * 30 / 1000, 30),
        bench.Totals(unprepare_ms * 30 / 1000, 30),
        [2.0, 3.0],
    )


def test_the_tally_counts_runs_within_the_target_for_each_method(bench: ModuleType) -> None:
    runs = [
        {"whole": phase(bench, "whole", 40, 10), "mps": phase(bench, "mps", 50, 12)},
        {"whole": phase(bench, "whole", 40, 10), "mps": phase(bench, "mps", 70, 14)},
        {"whole": phase(bench, "whole", 40, 10)},  # no MPS phase: not counted
    ]
    lines = bench.summary(runs)
    assert lines[0] == "run 1: mps/whole prepare 1.25x, unprepare 1.20x"
    assert lines[1] == "run 2: mps/whole prepare 1.75x, unprepare 1.40x"
    assert lines[-1].endswith("prepare met in 1/2 runs, unprepare in 2/2")
    assert "40.0 ms mean (30 calls; plugin's own   nan)" in runs[0]["whole"].line()


def test_each_gpu_gets_a_resident_share_pinned_to_it(bench: ModuleType) -> None:
    """Four 25% shares fit on a GPU: a wave of ten spreads over several GPUs, and each
    must have its daemon up (a resident share on it) for the wave to measure prepares,
    not daemon starts."""
    _, request = bench.request_of("mps", "4Gi")
    residents = bench.resident_templates("bench-mps", request, 3)
    assert list(residents) == [f"bench-mps-resident-{i}" for i in range(3)]
    for i, pinned in enumerate(residents.values()):
        assert pinned["capacity"] == request["capacity"]  # the waves' share, pinned
        assert pinned["selectors"] == [
            {"cel": {"expression": f'device.attributes["gpu.fractional.dev"].index == {i}'}}
        ]
    assert "selectors" not in request


def test_the_whole_gpu_waves_use_the_gpus_the_residents_leave(bench: ModuleType) -> None:
    """Both phases run beside the same residents (their waves take turns): the shares'
    waves on the residents' GPUs, the whole GPUs' on the others."""
    _, share = bench.request_of("mps", "4Gi")
    _, whole = bench.request_of("whole", "4Gi")
    _, example = bench.request_of("example", "4Gi")
    index = 'device.attributes["gpu.fractional.dev"].index'
    assert bench.wave_request("mps", share, 3)["selectors"] == [
        {"cel": {"expression": f"{index} < 3"}}
    ]
    assert bench.wave_request("whole", whole, 3)["selectors"] == [
        {"cel": {"expression": f"{index} >= 3"}}
    ]
    assert bench.wave_request("example", example, 3) == example


def test_a_phases_waves_add_up(bench: ModuleType) -> None:
    first = bench.PhaseResult(
        "mps", bench.Totals(0.5, 10), bench.Totals(0.1, 10), [2.0], 0.9,
        bench.Totals(0.4, 10), bench.Totals(0.05, 10), {"plugin": 0.2},
    )  # fmt: skip
    second = bench.PhaseResult(
        "mps", bench.Totals(0.7, 10), bench.Totals(0.3, 10), [3.0], 0.85,
        bench.Totals(0.6, 10), bench.Totals(0.15, 10), {"plugin": 0.4, "agent": 0.1},
    )  # fmt: skip
    both = first.plus(second)
    assert (both.prepare.calls, both.prepare.mean_ms) == (20, pytest.approx(60.0))
    assert both.unprepare.mean_ms == pytest.approx(20.0)
    assert both.plugin_prepare.mean_ms == pytest.approx(50.0)
    assert both.running_s == [2.0, 3.0]
    assert both.idle_before == 0.85
    assert both.cpu_line().endswith("CPU per claim (ms): plugin 30.0, agent 5.0")
    assert both.waves_line().endswith("prepare mean by wave (ms): 50, 70")


def test_the_charts_pods_on_the_node_are_found_by_its_label(bench: ModuleType) -> None:
    """The chart's plugin and agent would take the sockets the benchmark's own processes
    serve: it looks for them by the chart's name label on the node before it starts."""
    asked: list[dict[str, str]] = []

    class Pod:
        def __init__(self, namespace: str, name: str) -> None:
            self.metadata = type("Meta", (), {"namespace": namespace, "name": name})()

    class Core:
        def list_pod_for_all_namespaces(self, **selectors: str) -> Any:
            asked.append(selectors)
            return type("PodList", (), {"items": [Pod("fractional-gpu-dra", "agent-x")]})()

    cluster = bench.Cluster.__new__(bench.Cluster)
    cluster.core = Core()
    assert cluster.chart_pods("node-1") == ["fractional-gpu-dra/agent-x"]
    assert asked == [
        {
            "label_selector": "app.kubernetes.io/name=fractional-gpu-dra",
            "field_selector": "spec.nodeName=node-1",
        }
    ]
    with open(os.path.join(ROOT, "deploy", "helm", "fractional-gpu-dra", "Chart.yaml")) as f:
        assert "name: fractional-gpu-dra\n" in f.read()  # the label's value: fgd.name


def test_the_idle_share_counts_idle_and_iowait_between_two_readings(bench: ModuleType) -> None:
    # user, nice, system, idle, iowait, irq, softirq, steal
    before = [100, 0, 50, 1000, 10, 0, 0, 0]
    after = [160, 0, 70, 1090, 20, 0, 0, 0]
    assert bench.idle_share(before, after) == pytest.approx(100 / 180)
    assert bench.idle_share(before, before) == 1.0  # no time passed: nothing was busy
    now = bench.machine_ticks()
    assert len(now) >= 8 and 0.0 <= bench.idle_share(now, bench.machine_ticks()) <= 1.0


def test_the_phases_take_turns_going_first(bench: ModuleType) -> None:
    assert [bench.phase_order(["whole", "mps"], run) for run in range(3)] == [
        ["whole", "mps"],
        ["mps", "whole"],
        ["whole", "mps"],
    ]


def test_settling_gives_up_after_its_time_and_says_how_idle_it_found_the_machine(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    readings = iter([[0, 0, 0, 0, 0], [90, 0, 0, 10, 0]] * 10)  # 10% idle, every window
    monkeypatch.setattr(bench, "machine_ticks", lambda: next(readings))
    clock = iter(range(100))
    monkeypatch.setattr(bench.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(bench.time, "sleep", lambda _: None)
    assert bench.settle(3.0) == pytest.approx(0.1)  # busy throughout: back after 3 s
    readings = iter([[0, 0, 0, 0, 0], [10, 0, 0, 90, 0]])
    monkeypatch.setattr(bench, "machine_ticks", lambda: next(readings))
    assert bench.settle(3.0) == pytest.approx(0.9)  # idle at once: no further window


def test_its_help_prints(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse formats each help with %: a literal one must be doubled."""
    monkeypatch.setattr(bench.sys, "argv", ["kubelet_prepare.py", "--help"])
    with pytest.raises(SystemExit) as ended:
        bench.parse_args()
    assert ended.value.code == 0


PLUGIN_TEXT = "\n".join(
    [
        "# HELP fractional_gpu_dra_claim_operation_duration_seconds Time from the call.",
        "# TYPE fractional_gpu_dra_claim_operation_duration_seconds histogram",
        'fractional_gpu_dra_claim_operation_duration_seconds_bucket{le="+Inf",operation="prepare"}'
        " 4.0",
        'fractional_gpu_dra_claim_operation_duration_seconds_sum{operation="prepare"} 0.04',
        'fractional_gpu_dra_claim_operation_duration_seconds_count{operation="prepare"} 4.0',
        'fractional_gpu_dra_claim_operation_duration_seconds_sum{operation="unprepare"} 0.006',
        'fractional_gpu_dra_claim_operation_duration_seconds_count{operation="unprepare"} 3.0',
        "# HELP fractional_gpu_dra_claim_operations_total Claims prepared.",
        "# TYPE fractional_gpu_dra_claim_operations_total counter",
        'fractional_gpu_dra_claim_operations_total{operation="prepare",outcome="ok"} 9.0',
        "",
    ]
)


def test_the_plugins_own_histogram_is_keyed_by_the_kubelets_method(bench: ModuleType) -> None:
    ours = bench.plugin_totals(PLUGIN_TEXT)
    assert set(ours) == {"NodePrepareResources", "NodeUnprepareResources"}
    assert (ours["NodePrepareResources"].calls, ours["NodePrepareResources"].mean_ms) == (
        4,
        pytest.approx(10.0),
    )
    assert ours["NodeUnprepareResources"].mean_ms == pytest.approx(2.0)
    assert bench.plugin_totals(KUBELET_TEXT) == {}
