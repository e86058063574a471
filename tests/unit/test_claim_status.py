"""The status.devices builder (core/claim_writes/claim_status.py), field by field, against the
API rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_driver.core.claim_writes import (
    DATA_LIMIT_BYTES,
    HealthSnapshot,
    HealthStatus,
    check_condition,
    check_entry,
    claim_status_entries,
    condition_reason,
    device_data,
    device_status_entry,
    entry_key,
)
from dra_driver.core.prepare import PlannedDevice
from tests.support.planned import (
    admin,
    exclusive,
    mig_instance,
    mig_plan,
    mps_in_mig,
    mps_share,
    time_sliced,
)

DRIVER = "gpu.fractional.dev"
T0 = "2026-01-02T03:04:05Z"
T1 = "2026-01-02T04:00:00Z"
GIB = 1 << 30


CDI = ("k8s.gpu.fractional.dev/claim=uid-gpu-0",)
WHOLE = exclusive(cdi=CDI)
"""gpu-0, whole."""


def conditions(entry: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in entry["conditions"]}


def test_mps_share_entry_field_by_field() -> None:
    device = mps_share(
        share_id="3f1c0d4e-1111-4222-8333-944455556666",
        memory_bytes=10 * GIB,
        compute_percent=25,
        cdi=CDI,
    )
    entry = device_status_entry(device, driver_name=DRIVER, ready_since=T0)
    assert list(entry) == ["driver", "pool", "device", "shareID", "conditions", "data"]
    assert entry_key(entry) == (DRIVER, "node-a", "gpu-0", "3f1c0d4e-1111-4222-8333-944455556666")
    ready, health = entry["conditions"]
    assert ready == {
        "type": "Ready",
        "status": "True",
        "reason": "Prepared",
        "message": "an MPS share of GPU GPU-0: memory limit 10Gi, 25% of the SMs",
        "lastTransitionTime": T0,
    }
    assert health == {
        "type": "DeviceHealthy",
        "status": "Unknown",
        "reason": "NotReported",
        "message": "no health report for this device yet",
        "lastTransitionTime": T0,
    }
    assert entry["data"] == {
        "apiVersion": "gpu.fractional.dev/v1alpha1",
        "kind": "DeviceStatus",
        "mode": "mps",
        "gpuUUID": "GPU-0",
        "shareID": "3f1c0d4e-1111-4222-8333-944455556666",
        "memoryLimit": "10Gi",
        "memoryLimitBytes": 10 * GIB,
        "computePercent": 25,
        "requests": ["gpu"],
        "cdiDeviceIDs": ["k8s.gpu.fractional.dev/claim=uid-gpu-0"],
    }
    assert check_entry(entry) == []


def test_whole_gpu_has_no_share_id_and_no_limits() -> None:
    entry = device_status_entry(WHOLE, driver_name=DRIVER, ready_since=T0)
    assert "shareID" not in entry
    assert entry_key(entry) == (DRIVER, "node-a", "gpu-0", "")
    assert entry["data"]["mode"] == "exclusive"
    assert not {"memoryLimit", "computePercent", "mig", "shareID"} & set(entry["data"])
    assert conditions(entry)["Ready"]["message"] == "the whole GPU GPU-0, held by this claim alone"


def test_mig_device_names_its_uuid_profile_and_placement() -> None:
    mig = mig_plan(19, "1g.10gb", 3, 1, uuid="MIG-aaaa", created=True)
    entry = device_status_entry(
        mig_instance("gpu-0-mig-1g10gb-3", mig=mig, cdi=CDI), driver_name=DRIVER, ready_since=T0
    )
    assert entry["data"]["mig"] == {
        "profile": "1g.10gb",
        "profileID": 19,
        "placement": {"start": 3, "size": 1},
        "uuid": "MIG-aaaa",
    }
    assert "MIG-aaaa" in conditions(entry)["Ready"]["message"]
    assert "1g.10gb" in conditions(entry)["Ready"]["message"]


@pytest.mark.parametrize(
    ("device", "words", "mode"),
    [
        (time_sliced(cdi=CDI), "time-sliced share", "shared"),
        (admin(cdi=CDI), "admin access", "admin"),
        (WHOLE, "whole GPU", "exclusive"),
    ],
    ids=["shared", "admin", "exclusive"],
)
def test_ready_message_says_the_mode(device: PlannedDevice, words: str, mode: str) -> None:
    """``data.mode`` is an API: a time-sliced share is still "shared" there."""
    entry = device_status_entry(device, driver_name=DRIVER, ready_since=T0)
    assert words in conditions(entry)["Ready"]["message"]
    assert entry["data"]["mode"] == mode


def test_mps_without_sm_cap_says_so() -> None:
    device = mps_share(share_id="s", memory_bytes=GIB, cdi=CDI)
    entry = device_status_entry(device, driver_name=DRIVER, ready_since=T0)
    assert conditions(entry)["Ready"]["message"].endswith("memory limit 1Gi, no SM cap")


@pytest.mark.parametrize(
    ("health", "status", "reason", "since"),
    [
        (HealthSnapshot(HealthStatus.HEALTHY, "", "", T1), "True", "Healthy", T1),
        (HealthSnapshot(HealthStatus.UNHEALTHY, "XidError", "XID 79", T1), "False", "XidError", T1),
        (HealthSnapshot(HealthStatus.UNKNOWN, "", ""), "Unknown", "Unknown", T0),
        (HealthSnapshot(HealthStatus.UNHEALTHY, "xid error 79!", ""), "False", "XidError79", T0),
    ],
    ids=["healthy", "unhealthy", "unknown-no-time", "reason-made-valid"],
)
def test_health_condition(health: HealthSnapshot, status: str, reason: str, since: str) -> None:
    entry = device_status_entry(WHOLE, driver_name=DRIVER, ready_since=T0, health=health)
    cond = conditions(entry)["DeviceHealthy"]
    assert (cond["status"], cond["reason"], cond["lastTransitionTime"]) == (status, reason, since)
    assert cond["message"]
    assert check_condition(cond) == []


def test_two_shares_of_one_gpu_are_two_entries_and_duplicates_are_dropped() -> None:
    a = mps_share(share_id="share-a", memory_bytes=GIB, cdi=CDI)
    b = mps_share(share_id="share-b", memory_bytes=2 * GIB, cdi=CDI)
    entries = claim_status_entries([a, b, a], driver_name=DRIVER, ready_since=T0)
    assert [entry_key(e) for e in entries] == [
        (DRIVER, "node-a", "gpu-0", "share-a"),
        (DRIVER, "node-a", "gpu-0", "share-b"),
    ]
    assert [e["data"]["memoryLimitBytes"] for e in entries] == [GIB, 2 * GIB]


def test_health_is_looked_up_per_device() -> None:
    sick = HealthSnapshot(HealthStatus.UNHEALTHY, "XidError", "XID 48", T1)
    entries = claim_status_entries(
        [exclusive("gpu-0", cdi=CDI), exclusive("gpu-1", cdi=CDI)],
        driver_name=DRIVER,
        ready_since=T0,
        health=lambda d: sick if d.device_name == "gpu-1" else None,
    )
    assert [conditions(e)["DeviceHealthy"]["status"] for e in entries] == ["Unknown", "False"]


def test_observed_generation_is_optional() -> None:
    plain = device_status_entry(WHOLE, driver_name=DRIVER, ready_since=T0)
    assert "observedGeneration" not in conditions(plain)["Ready"]
    with_gen = device_status_entry(WHOLE, driver_name=DRIVER, ready_since=T0, observed_generation=3)
    assert conditions(with_gen)["Ready"]["observedGeneration"] == 3
    assert check_entry(with_gen) == []


def test_data_stays_within_the_limit_when_lists_are_huge() -> None:
    requests = tuple(f"request-{i:02d}-" + "x" * 50 for i in range(32))
    cdi = tuple(f"k8s.gpu.fractional.dev/claim={'u' * 200}-{i}" for i in range(40))
    data = device_data(exclusive(requests=requests, cdi=cdi), DRIVER)
    assert len(json.dumps(data).encode()) <= DATA_LIMIT_BYTES
    assert "requests" not in data and "cdiDeviceIDs" not in data
    assert data["mode"] == "exclusive"
    small = device_data(WHOLE, DRIVER)
    assert small["requests"] == ["gpu"]


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("XidError", "X", "XidError"),
        ("gpu fell off the bus", "X", "GpuFellOffTheBus"),
        ("79", "Unhealthy", "Unhealthy"),
        ("", "Healthy", "Healthy"),
        ("ECC:DoubleBit", "X", "ECC:DoubleBit"),
        ("trailing,", "X", "Trailing"),
    ],
)
def test_condition_reason(text: str, default: str, expected: str) -> None:
    assert condition_reason(text, default) == expected


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"status": "Maybe"}, "status"),
        ({"reason": "not camel case"}, "reason"),
        ({"reason": ""}, "reason"),
        ({"lastTransitionTime": "yesterday"}, "lastTransitionTime"),
        ({"observedGeneration": -1}, "observedGeneration"),
        ({"message": "m" * 32769}, "message"),
        ({"type": ""}, "type"),
    ],
)
def test_check_condition_catches_what_the_api_refuses(change: dict[str, Any], problem: str) -> None:
    good = device_status_entry(WHOLE, driver_name=DRIVER, ready_since=T0)["conditions"][0]
    assert check_condition(good) == []
    problems = check_condition({**good, **change})
    assert problems and problem in problems[0]


def test_check_entry_catches_what_the_api_refuses() -> None:
    good = device_status_entry(WHOLE, driver_name=DRIVER, ready_since=T0)
    assert check_entry(good) == []
    assert "device" in check_entry({**good, "device": "GPU_0"})[0]
    assert check_entry({**good, "conditions": good["conditions"] * 5})  # 10 > 8, duplicates
    assert "data" in check_entry({**good, "data": {"blob": "x" * DATA_LIMIT_BYTES}})[0]
    assert "driver" in check_entry({k: v for k, v in good.items() if k != "driver"})[0]


def test_health_status_parse() -> None:
    assert HealthStatus.parse(" unhealthy ") is HealthStatus.UNHEALTHY
    assert HealthStatus.parse("Healthy") is HealthStatus.HEALTHY
    assert HealthStatus.parse("on fire") is HealthStatus.UNKNOWN


def test_mps_share_inside_mig_names_the_instance_and_its_limits() -> None:
    mig = mig_plan(19, "1g.10gb", 3, 1, uuid="MIG-bbbb", gi_id=1, ci_id=0)
    device = mps_in_mig(
        "gpu-0-mig-1g10gb-19-3", share_id="s", memory_bytes=2 * GIB, compute_percent=30, mig=mig,
        cdi=CDI,
    )  # fmt: skip
    entry = device_status_entry(device, driver_name=DRIVER, ready_since=T0)
    message = conditions(entry)["Ready"]["message"]
    assert "an MPS share of MIG device MIG-bbbb, profile 1g.10gb" in message
    assert "memory limit 2Gi, 30% of the SMs" in message
    assert entry["data"]["mig"]["uuid"] == "MIG-bbbb"
