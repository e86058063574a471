"""The kubelet plugin's metrics: counters from claim outcomes, gauges from the checkpoint,
device health (scraped through the library's own exposition and parser)."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field

import pytest
from prometheus_client import generate_latest

from dra_driver.base.errors import CheckpointCorruptError
from dra_driver.base.ids import ClaimRef, ClaimUID, GpuUUID
from dra_driver.core.model import GpuInfo, Inventory
from dra_driver.core.prepare import ClaimOperation, PlannedDevice
from dra_driver.observability.plugin_metrics import PluginMetrics
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim, ClaimState
from tests.support.metrics import Scrape
from tests.support.planned import exclusive, mig_instance, mps_share

P = "fractional_gpu_dra_"
GIB = 1 << 30
GPU0, GPU1, GPU2 = (GpuUUID(f"GPU-{n}") for n in "012")


def scrape(metrics: PluginMetrics) -> Scrape:
    return Scrape(generate_latest(metrics.registry).decode())


def ref(name: str) -> ClaimRef:
    return ClaimRef("ns", name, ClaimUID(f"uid-{name}"))


def op(
    name: str, operation: str = "prepare", seconds: float = 0.003, **kw: object
) -> ClaimOperation:
    return ClaimOperation(operation, ref(name), seconds, **kw)  # type: ignore[arg-type]


def test_operations_by_outcome_errors_by_reason_and_latency() -> None:
    metrics = PluginMetrics()
    before = scrape(metrics)
    for operation, outcome in [("prepare", "ok"), ("prepare", "error"), ("unprepare", "ok")]:
        assert before.get(P + "claim_operations_total", operation=operation, outcome=outcome) == 0
    metrics.claim_done(op("a"))
    metrics.claim_done(op("a", repeated=True, seconds=0.0004))
    metrics.claim_done(op("b", error="claim ns/b: full", reason="Overcommit"))
    metrics.claim_done(op("c", error="claim ns/c: gone", reason="ClaimNotFound"))
    metrics.claim_done(op("d", error="claim ns/d: gone", reason="ClaimNotFound", seconds=2))
    metrics.claim_done(op("a", operation="unprepare", seconds=0.02))

    got = scrape(metrics)
    ops = P + "claim_operations_total"
    assert got.get(ops, operation="prepare", outcome="ok") == 1
    assert got.get(ops, operation="prepare", outcome="repeated") == 1
    assert got.get(ops, operation="prepare", outcome="error") == 3
    assert got.get(ops, operation="unprepare", outcome="ok") == 1
    assert got.get(ops, operation="unprepare", outcome="error") == 0
    errors = P + "claim_operation_errors_total"
    assert got.get(errors, operation="prepare", reason="Overcommit") == 1
    assert got.get(errors, operation="prepare", reason="ClaimNotFound") == 2
    assert got.series(errors) == [
        {"operation": "prepare", "reason": "Overcommit"},
        {"operation": "prepare", "reason": "ClaimNotFound"},
    ]
    seconds = P + "claim_operation_duration_seconds"
    assert got.types[seconds] == "histogram"
    assert got.get(seconds + "_count", operation="prepare") == 5
    assert got.get(seconds + "_sum", operation="prepare") == pytest.approx(2.0094)
    assert got.get(seconds + "_bucket", operation="prepare", le="0.001") == 1
    assert got.get(seconds + "_bucket", operation="prepare", le="0.005") == 4
    assert got.get(seconds + "_bucket", operation="prepare", le="2.5") == 5
    assert got.get(seconds + "_bucket", operation="unprepare", le="0.01") == 0
    assert got.get(seconds + "_bucket", operation="unprepare", le="0.025") == 1
    assert got.get(seconds + "_bucket", operation="unprepare", le="30.0") == 1


def test_an_error_without_a_reason_counts_as_internal() -> None:
    metrics = PluginMetrics()
    metrics.claim_done(op("a", operation="unprepare", error="boom"))
    got = scrape(metrics)
    assert got.get(
        P + "claim_operation_errors_total", operation="unprepare", reason="InternalError"
    )


def gpu(index: int, uuid: GpuUUID, *, mig: bool = False) -> GpuInfo:
    return GpuInfo(index, uuid, "H100", 80 * GIB, index, mig_capable=mig, mig_enabled=mig)


def entry(name: str, *devices: PlannedDevice, started: bool = False) -> CheckpointClaim:
    state = ClaimState.PREPARE_STARTED if started else ClaimState.PREPARE_COMPLETED
    return CheckpointClaim(ref(name), state, devices)


@dataclass
class FakeDriver:
    """Stands in for the engine's checkpoint store (:meth:`load`) and the node's GPUs."""

    checkpoint: Checkpoint = field(default_factory=lambda: Checkpoint("boot"))
    inventory: Inventory = field(
        default_factory=lambda: Inventory((gpu(0, GPU0), gpu(1, GPU1), gpu(2, GPU2, mig=True)))
    )
    broken: bool = False

    def load(self) -> Checkpoint:
        if self.broken:
            raise CheckpointCorruptError("checkpoint /x fails its checksum; move /x aside")
        return self.checkpoint


def reading(driver: FakeDriver) -> PluginMetrics:
    """Metrics whose gauges read ``driver``'s checkpoint and inventory."""
    return PluginMetrics(checkpoints=driver, inventory=lambda: driver.inventory)


def test_gauges_are_read_from_the_checkpoint_at_each_scrape() -> None:
    driver = FakeDriver()
    assert not scrape(PluginMetrics()).series(P + "mps_shares")  # no checkpoint: nothing known
    metrics = reading(driver)

    empty = scrape(metrics)
    assert empty.get(P + "prepared_claims", state="PrepareCompleted") == 0
    assert empty.get(P + "prepared_claims", state="PrepareStarted") == 0
    # Every GPU that can hold shares has its series at 0; the MIG-enabled one has none.
    assert empty.series(P + "mps_shares") == [
        {"gpu_uuid": GPU0, "device": "gpu-0"},
        {"gpu_uuid": GPU1, "device": "gpu-1"},
    ]
    assert empty.get(P + "mps_reserved_memory_bytes", gpu_uuid=GPU0, device="gpu-0") == 0

    share_a = mps_share(share_id="s-a", gpu=GPU0, memory_bytes=10 * GIB)
    share_b = mps_share(share_id="s-b", gpu=GPU0, memory_bytes=20 * GIB)
    driver.checkpoint = Checkpoint(
        "boot",
        {
            ref(n).uid: e
            for n, e in [
                ("a", entry("a", share_a)),
                ("b", entry("b", share_b, started=True)),
                ("c", entry("c", exclusive("gpu-1", gpu=GPU1))),
                ("d", entry("d", mig_instance("gpu-2-mig-1g.10gb-0", gpu=GPU2))),
            ]
        },
    )
    got = scrape(metrics)
    assert got.get(P + "prepared_claims", state="PrepareCompleted") == 3
    assert got.get(P + "prepared_claims", state="PrepareStarted") == 1
    assert got.get(P + "mps_shares", gpu_uuid=GPU0, device="gpu-0") == 2
    assert got.get(P + "mps_reserved_memory_bytes", gpu_uuid=GPU0, device="gpu-0") == 30 * GIB
    assert got.get(P + "mps_shares", gpu_uuid=GPU1, device="gpu-1") == 0
    assert got.get(P + "mps_reserved_memory_bytes", gpu_uuid=GPU1, device="gpu-1") == 0
    assert len(got.series(P + "mps_shares")) == 2

    driver.checkpoint = Checkpoint("boot")
    assert scrape(metrics).get(P + "mps_reserved_memory_bytes", gpu_uuid=GPU0, device="gpu-0") == 0


def test_a_share_on_a_gpu_gone_from_the_inventory_is_still_reported() -> None:
    driver = FakeDriver(inventory=Inventory(()))
    driver.checkpoint = Checkpoint(
        "boot",
        {ref("a").uid: entry("a", mps_share("gpu-7", gpu=GPU0, share_id="s", memory_bytes=GIB))},
    )
    metrics = reading(driver)
    assert (
        scrape(metrics).get(P + "mps_reserved_memory_bytes", gpu_uuid=GPU0, device="gpu-7") == GIB
    )


def test_an_unreadable_checkpoint_leaves_out_the_gauges_not_the_scrape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = reading(FakeDriver(broken=True))
    metrics.claim_done(op("a"))
    with caplog.at_level(logging.WARNING, logger="dra_driver.observability"):
        got = scrape(metrics)
    assert got.get(P + "claim_operations_total", operation="prepare", outcome="ok") == 1
    assert not got.series(P + "prepared_claims")
    assert "fails its checksum" in caplog.text


@dataclass(frozen=True)
class Health:
    device_name: str
    gpu_uuid: str
    status: str
    reason: str | None = None


class Status(enum.StrEnum):
    UNKNOWN = "Unknown"


def test_device_health_reports_the_latest_set() -> None:
    metrics = PluginMetrics()
    assert not scrape(metrics).series(P + "device_health")  # nothing known yet
    metrics.set_device_health(
        [
            Health("gpu-0", GPU0, "Healthy"),
            Health("gpu-1", GPU1, "Unhealthy", "XID 79: GPU has fallen off the bus"),
        ]
    )
    got = scrape(metrics)
    health = P + "device_health"
    assert got.get(health, device="gpu-0", gpu_uuid=GPU0, status="Healthy") == 1
    assert got.get(health, device="gpu-0", gpu_uuid=GPU0, status="Unhealthy") == 0
    assert got.get(health, device="gpu-1", gpu_uuid=GPU1, status="Unhealthy") == 1
    assert got.get(health, device="gpu-1", gpu_uuid=GPU1, status="Unknown") == 0
    assert got.series(P + "device_health_reason_info") == [
        {"device": "gpu-1", "gpu_uuid": GPU1, "reason": "XID 79: GPU has fallen off the bus"}
    ]

    # The next report replaces the last: gpu-1 is gone, gpu-0's status is an enum.
    metrics.set_device_health([Health("gpu-0", GPU0, Status.UNKNOWN)])
    got = scrape(metrics)
    assert got.get(health, device="gpu-0", gpu_uuid=GPU0, status="Unknown") == 1
    assert got.get(health, device="gpu-0", gpu_uuid=GPU0, status="Healthy") == 0
    assert {s["device"] for s in got.series(health)} == {"gpu-0"}
    assert not got.series(P + "device_health_reason_info")


def test_an_unknown_health_status_is_refused_and_the_last_report_kept() -> None:
    metrics = PluginMetrics()
    metrics.set_device_health([Health("gpu-0", GPU0, "Healthy")])
    with pytest.raises(ValueError, match=r"gpu-1: health status 'Sick' is not one of Healthy"):
        metrics.set_device_health([Health("gpu-0", GPU0, "Healthy"), Health("gpu-1", GPU1, "Sick")])
    got = scrape(metrics)
    assert got.get(P + "device_health", device="gpu-0", gpu_uuid=GPU0, status="Healthy") == 1
    assert {s["device"] for s in got.series(P + "device_health")} == {"gpu-0"}


def test_every_metric_has_our_prefix_and_help() -> None:
    metrics = reading(FakeDriver())
    metrics.set_device_health([Health("gpu-0", GPU0, "Healthy", "")])
    text = generate_latest(metrics.registry).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    ours = {n for n in names if not n.startswith("process_")}
    assert ours and all(n.startswith(P) for n in ours), ours
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")]
    assert all(len(line.split(" ", 3)[3]) > 20 for line in helps)
