"""The pure device-health model: XID classes, transitions, recovery, taints, slices."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.base.errors import ConfigError
from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.health import (
    APPLICATION_XIDS,
    EVENTS_FAILED,
    FATAL_XIDS,
    GPU_LOST,
    INFORMATIONAL_XIDS,
    MPS_DAEMON_DOWN,
    PROBE_FAILED,
    DeviceHealth,
    HealthModel,
    HealthSettings,
    Status,
    TaintEffect,
    XidClass,
    classify_xid,
    device_taints,
    parse_xid_list,
    unhealthy_taint_key,
)
from dra_driver.core.model import HealthEvent, Inventory
from dra_driver.core.published import device_names
from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slices import build_slices, validate_pool
from dra_driver.fakes.gpu import build_inventory, parse_shorthand

DRIVER = "gpu.fractional.dev"
KEY = f"{DRIVER}/unhealthy"
RECOVERY = 300.0
T0 = 1_000_000.0


def inventory(spec: str) -> Inventory:
    return build_inventory(parse_shorthand(spec), "node-a")


def mig_inventory() -> Inventory:
    """gpu-0 whole; gpu-1 MIG with two instances (and free placements besides)."""
    entries: list[dict[str, Any]] = [
        {"model": "h100-80gb"},
        {
            "model": "h100-80gb",
            "mig": True,
            "migInstances": [
                {"profile": "3g.40gb", "start": 0},
                {"profile": "1g.10gb", "start": 4},
            ],
        },
    ]
    return build_inventory(entries, "node-a")


def model(inv: Inventory, **settings: Any) -> HealthModel:
    return HealthModel(HealthSettings(recovery_s=RECOVERY, **settings), inv, T0)


def by_name(m: HealthModel) -> dict[str, DeviceHealth]:
    return {d.device_name: d for d in m.devices()}


def unhealthy_names(m: HealthModel) -> set[str]:
    return {d.device_name for d in m.devices() if d.status is not Status.HEALTHY}


def xid(inv: Inventory, gpu: int, code: int, mig: MigUUID | None = None) -> HealthEvent:
    return HealthEvent(inv.gpus[gpu].uuid, code, f"XID {code}", mig_uuid=mig)


# --- XIDs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (48, XidClass.FATAL),  # double-bit ECC
        (79, XidClass.FATAL),  # fallen off the bus
        (95, XidClass.FATAL),  # uncontained ECC
        (119, XidClass.FATAL),  # GSP RPC timeout
        (120, XidClass.FATAL),  # GSP error
        (74, XidClass.FATAL),  # NVLink
        (64, XidClass.FATAL),
        (109, XidClass.FATAL),  # RESET_GPU in NVIDIA's catalog
        (13, XidClass.APPLICATION),
        (31, XidClass.APPLICATION),
        (43, XidClass.APPLICATION),
        (45, XidClass.APPLICATION),
        (68, XidClass.APPLICATION),
        (94, XidClass.APPLICATION),  # contained ECC: the workload's problem
        (63, XidClass.INFORMATIONAL),
        (92, XidClass.INFORMATIONAL),
        (154, XidClass.INFORMATIONAL),
        (54, XidClass.DEVICE),  # auxiliary power
        (144, XidClass.DEVICE),  # NVLink5 workflow
        (4242, XidClass.DEVICE),  # unknown: treated as a device problem
    ],
)
def test_xid_classification(code: int, expected: XidClass) -> None:
    assert classify_xid(code) is expected


def test_ignored_xids_win_over_the_table() -> None:
    assert classify_xid(79, ignored={79}) is XidClass.IGNORED
    assert classify_xid(13, ignored=[13, 31]) is XidClass.IGNORED
    assert classify_xid(48, ignored={79}) is XidClass.FATAL


def test_xid_tables_are_disjoint_and_never_name_xid_0() -> None:
    tables = (FATAL_XIDS, APPLICATION_XIDS, INFORMATIONAL_XIDS)
    for i, first in enumerate(tables):
        assert 0 not in first
        for second in tables[i + 1 :]:
            assert not first & second


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", frozenset()), ("13", {13}), ("13, 31 43,", {13, 31, 43}), (" 79 ", {79})],
)
def test_parse_xid_list(text: str, expected: frozenset[int]) -> None:
    assert parse_xid_list(text) == expected


@pytest.mark.parametrize("text", ["13,x", "-1", "0", "1.5"])
def test_parse_xid_list_names_the_flag(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--ignored-xids: .* is not an XID"):
        parse_xid_list(text)


def test_settings_validation_names_the_flags() -> None:
    with pytest.raises(ConfigError, match="--health-recovery-seconds"):
        HealthSettings(recovery_s=-1).validate()
    HealthSettings(recovery_s=0, fatal_effect=TaintEffect.NO_EXECUTE).validate()


# --- transitions ------------------------------------------------------------------------


def test_all_devices_start_healthy_in_publishing_order() -> None:
    inv = mig_inventory()
    m = model(inv)
    assert [d.device_name for d in m.devices()] == device_names(inv)
    assert {d.status for d in m.devices()} == {Status.HEALTHY}
    assert {d.since for d in m.devices()} == {T0}
    migs = [d for d in m.devices() if d.mig_uuid is not None]
    assert len(migs) == 2  # the two existing instances; placements have no UUID


def test_device_xid_recovers_after_a_quiet_period() -> None:
    inv = inventory("h100-80gb:2")
    m = model(inv)
    changed = m.record_event(xid(inv, 0, 54), T0 + 1)
    assert [(d.device_name, d.status, d.reason, d.fatal) for d in changed] == [
        ("gpu-0", Status.UNHEALTHY, "xid-54", False)
    ]
    assert changed[0].since == T0 + 1
    assert "XID 54" in changed[0].message
    # The same XID again: no news, but the quiet period starts over.
    assert m.record_event(xid(inv, 0, 54), T0 + 200) == []
    assert m.tick(T0 + 1 + RECOVERY) == []
    (healed,) = m.tick(T0 + 200 + RECOVERY)
    assert (healed.device_name, healed.status, healed.reason) == ("gpu-0", Status.HEALTHY, "")
    assert healed.since == T0 + 200 + RECOVERY


@pytest.mark.parametrize("code", [13, 31, 43, 63, 92])
def test_application_and_informational_xids_change_nothing(code: int) -> None:
    inv = inventory("h100-80gb")
    m = model(inv)
    assert m.record_event(xid(inv, 0, code), T0 + 1) == []
    assert unhealthy_names(m) == set()


def test_ignored_fatal_xid_changes_nothing() -> None:
    inv = inventory("h100-80gb")
    m = model(inv, ignored_xids=frozenset({79}))
    assert m.record_event(xid(inv, 0, 79), T0 + 1) == []


def test_fatal_xid_waits_for_a_reset_not_for_time() -> None:
    inv = inventory("h100-80gb:2")
    m = model(inv)
    (sick,) = m.record_event(xid(inv, 1, 79), T0 + 1)
    assert (sick.device_name, sick.reason, sick.fatal) == ("gpu-1", "xid-79", True)
    assert "needs a GPU reset" in sick.message
    assert m.tick(T0 + 10 * RECOVERY) == []
    (healed,) = m.reset(inv.gpus[1].uuid, T0 + 10 * RECOVERY)
    assert healed.status is Status.HEALTHY


def test_non_fatal_xid_on_a_mig_device_stays_on_it() -> None:
    inv = mig_inventory()
    m = model(inv)
    gpu = inv.gpus[1]
    mig = gpu.mig_devices[0].uuid
    (sick,) = m.record_event(xid(inv, 1, 54, mig), T0 + 1)
    assert sick.mig_uuid == mig and sick.device_name.startswith("gpu-1-mig-3g40gb")
    assert sick.message.startswith("this MIG device: ")
    assert unhealthy_names(m) == {sick.device_name}


def test_fatal_xid_on_a_mig_device_takes_its_gpu_and_siblings() -> None:
    inv = mig_inventory()
    m = model(inv)
    gpu = inv.gpus[1]
    changed = m.record_event(xid(inv, 1, 48, gpu.mig_devices[1].uuid), T0 + 1)
    names = {d.device_name for d in changed}
    assert names == {n for n in device_names(inv) if n.startswith("gpu-1-")}
    assert "gpu-0" not in names
    for device in changed:
        assert device.fatal and device.reason == "xid-48"
        assert device.message.startswith(f"its GPU {gpu.uuid}: XID 48")
    assert m.reset(gpu.uuid, T0 + 2) == [by_name(m)[n] for n in device_names(inv) if n in names]
    assert unhealthy_names(m) == set()


def test_whole_gpu_xid_on_a_mig_gpu_reaches_every_mig_device() -> None:
    inv = mig_inventory()
    m = model(inv)
    changed = m.record_event(xid(inv, 1, 54), T0 + 1)
    assert {d.device_name for d in changed} == {
        n for n in device_names(inv) if n.startswith("gpu-1-")
    }


def test_probe_lost_then_answering_is_a_reset() -> None:
    inv = inventory("h100-80gb:2")
    m = model(inv)
    uuid = inv.gpus[0].uuid
    m.record_event(xid(inv, 0, 48), T0 + 1)
    (lost,) = m.record_probe({uuid: "GPU is lost", inv.gpus[1].uuid: None}, T0 + 2)
    # The worst problem (both fatal) is the oldest: the XID, and the message has both.
    assert lost.reason == "xid-48" and "the GPU does not answer: GPU is lost" in lost.message
    (back,) = m.record_probe({uuid: None}, T0 + 3)
    assert back.status is Status.HEALTHY  # the fatal XID went with the reset


def test_probe_lost_reason() -> None:
    inv = inventory("h100-80gb:2")
    m = model(inv)
    (lost,) = m.record_probe({inv.gpus[1].uuid: "GPU is lost: fallen off the bus"}, T0 + 1)
    assert (lost.device_name, lost.status, lost.reason, lost.fatal) == (
        "gpu-1",
        Status.UNHEALTHY,
        GPU_LOST,
        True,
    )
    assert m.record_probe({inv.gpus[1].uuid: "still lost"}, T0 + 2) != []  # new words
    assert by_name(m)["gpu-1"].since == T0 + 1


def test_probe_failure_is_unknown_and_clears_on_the_next_probe() -> None:
    inv = inventory("h100-80gb:2")
    m = model(inv)
    m.record_probe({inv.gpus[1].uuid: "GPU is lost"}, T0 + 1)
    changed = m.record_probe_failure("NVML is gone", T0 + 2)
    assert [(d.device_name, d.status, d.reason) for d in changed] == [
        ("gpu-0", Status.UNKNOWN, PROBE_FAILED)
    ]  # a lost GPU stays lost
    changed = m.record_probe({gpu.uuid: None for gpu in inv.gpus}, T0 + 3)
    assert {d.status for d in changed} == {Status.HEALTHY}
    assert unhealthy_names(m) == set()


def test_event_source_failure_is_unknown_until_quiet() -> None:
    inv = inventory("h100-80gb")
    m = model(inv)
    (unknown,) = m.record_event(HealthEvent(inv.gpus[0].uuid, 0, "wait failed"), T0)
    assert (unknown.status, unknown.reason) == (Status.UNKNOWN, EVENTS_FAILED)
    assert m.tick(T0 + RECOVERY - 1) == []
    assert m.tick(T0 + RECOVERY)[0].status is Status.HEALTHY


def test_mps_daemon_down_and_back() -> None:
    inv = inventory("h100-80gb:2")
    m = model(inv)
    uuid = inv.gpus[0].uuid
    (down,) = m.record_mps({uuid: "not running"}, T0 + 1)
    assert (down.device_name, down.reason, down.fatal) == ("gpu-0", MPS_DAEMON_DOWN, False)
    assert "MPS control daemon down: not running" in down.message
    assert m.tick(T0 + 10 * RECOVERY) == []  # a live condition, not a timed one
    (up,) = m.record_mps({}, T0 + 2)
    assert up.status is Status.HEALTHY


def test_worst_problem_first_and_every_problem_in_the_message() -> None:
    inv = inventory("h100-80gb")
    m = model(inv)
    uuid = inv.gpus[0].uuid
    m.record_mps({uuid: "not running"}, T0 + 1)
    (both,) = m.record_event(xid(inv, 0, 79), T0 + 2)
    assert both.reason == "xid-79" and both.fatal
    assert both.message.index("XID 79") < both.message.index("MPS control daemon down")
    (only_mps,) = m.reset(uuid, T0 + 3)  # the daemon is the agent's to report
    assert only_mps.reason == MPS_DAEMON_DOWN


def test_inventory_change_follows_devices_and_forgets_gone_subjects() -> None:
    before = inventory("h100-80gb:2")
    m = model(before)
    m.record_event(xid(before, 1, 79), T0 + 1)
    after = inventory("h100-80gb:1")  # gpu-1 is gone
    assert m.set_inventory(after, T0 + 2) == []
    assert [d.device_name for d in m.devices()] == ["gpu-0"]
    assert m.problems(before.gpus[1].uuid) == {}
    assert m.record_event(xid(before, 1, 79), T0 + 3) == []  # a GPU the node no longer has
    back = m.set_inventory(before, T0 + 4)
    assert [(d.device_name, d.status) for d in back] == [("gpu-1", Status.HEALTHY)]


def test_gpu_turning_to_mig_keeps_its_problems_on_its_mig_devices() -> None:
    before = inventory("h100-80gb:2")
    m = model(before)
    m.record_event(xid(before, 1, 79), T0 + 1)
    after = mig_inventory()  # same node, same UUIDs: GPU 1 now has MIG on
    changed = m.set_inventory(after, T0 + 2)
    migs = {n for n in device_names(after) if n.startswith("gpu-1-")}
    assert {d.device_name for d in changed} == migs
    assert unhealthy_names(m) == migs


def test_unknown_gpu_events_are_ignored() -> None:
    m = model(inventory("l4"))
    assert m.record_event(HealthEvent(GpuUUID("GPU-nope"), 79), T0) == []
    assert m.record_probe({GpuUUID("GPU-nope"): "lost"}, T0) == []


# --- taints -----------------------------------------------------------------------------


def test_taint_key_is_a_valid_label_key() -> None:
    assert unhealthy_taint_key(DRIVER) == KEY
    for bad in ("GPU.example.com", "gpu_example.com", "x" * 64 + ".com", "-gpu.io"):
        with pytest.raises(ConfigError, match="--driver-name"):
            unhealthy_taint_key(bad)


@pytest.mark.parametrize("effect", list(TaintEffect))
def test_device_taints(effect: TaintEffect) -> None:
    inv = inventory("h100-80gb:4")
    m = model(inv)
    m.record_event(xid(inv, 0, 54), T0)  # device error
    m.record_event(xid(inv, 1, 79), T0)  # fatal
    m.record_mps({inv.gpus[2].uuid: "down"}, T0)
    m.record_event(HealthEvent(inv.gpus[3].uuid, 0, "wait failed"), T0)  # unknown: no taint
    taints = device_taints(m.devices(), driver_name=DRIVER, fatal_effect=effect)
    assert taints == {
        "gpu-0": [{"key": KEY, "value": "xid-54", "effect": "NoSchedule"}],
        "gpu-1": [{"key": KEY, "value": "xid-79", "effect": str(effect)}],
        "gpu-2": [{"key": KEY, "value": "mps-daemon-down", "effect": "NoSchedule"}],
    }


@pytest.mark.parametrize("minor", [34, 35, 36])
def test_slices_carry_taints_only_where_the_cluster_keeps_them(minor: int) -> None:
    inv = mig_inventory()
    m = model(inv)
    m.record_event(xid(inv, 1, 79), T0)
    m.record_event(xid(inv, 0, 54), T0)
    taints = device_taints(m.devices(), driver_name=DRIVER, fatal_effect=TaintEffect.NO_EXECUTE)
    for caps in (
        Capabilities.for_version(minor),
        Capabilities(device_taints=True, counters_in_own_slice=minor >= 35),
    ):
        slices = build_slices(
            inv,
            driver_name=DRIVER,
            node_name="node-a",
            settings=NodeSettings(),
            capabilities=caps,
            taints=taints,
        )
        validate_pool([s.spec for s in slices], caps)
        published = {d["name"]: d.get("taints") for s in slices for d in s.spec.get("devices", ())}
        assert published, caps
        for name, found in published.items():
            assert found == (taints.get(name) if caps.device_taints else None), (caps, name)
        without = build_slices(
            inv, driver_name=DRIVER, node_name="node-a", settings=NodeSettings(), capabilities=caps
        )
        assert [s.key for s in without] == [s.key for s in slices]  # the layout never moves


# --- MPS shares inside MIG instances -------------------------------------------------


def test_a_mig_instances_mps_daemon_down_marks_that_instance_only() -> None:
    """The daemon of a MIG instance (keyed by its MIG UUID) serves that instance's
    shares: its failure marks that MIG device (so all its shares), not the GPU or
    the GPU's other instances."""
    inv = mig_inventory()
    m = model(inv)
    three_g, one_g = inv.gpus[1].mig_devices
    (down,) = m.record_mps({GpuUUID(three_g.uuid): "exited"}, T0 + 1)
    assert (down.device_name, down.reason) == ("gpu-1-mig-3g40gb-9-0", MPS_DAEMON_DOWN)
    assert "this MIG device: MPS control daemon down: exited" in down.message
    assert unhealthy_names(m) == {"gpu-1-mig-3g40gb-9-0"}
    (up,) = m.record_mps({}, T0 + 2)
    assert up.status is Status.HEALTHY
    assert one_g.uuid not in down.message


def test_an_instances_xid_marks_the_device_its_shares_are_prepared_on() -> None:
    """Shares of one instance are one device with several shareIDs: a fault of the
    instance marks that device, which is every share's."""
    inv = mig_inventory()
    m = model(inv)
    three_g = inv.gpus[1].mig_devices[0]
    m.record_event(xid(inv, 1, 54, three_g.uuid), T0)  # 43 is the application's own
    assert unhealthy_names(m) == {"gpu-1-mig-3g40gb-9-0"}
    assert "gpu-0" not in unhealthy_names(m)
