"""What the health streams send: the model's view, cut messages, timeouts."""

from __future__ import annotations

from dra_driver.base.ids import DeviceName, GpuUUID
from dra_driver.core.health import DeviceHealth, Status
from dra_driver.kubeletplugin.health import (
    MESSAGE_LIMIT,
    DeviceHealthState,
    Health,
    health_states,
    truncate_message,
)

GPU = GpuUUID("GPU-1")


def test_states_carry_status_reason_time_and_timeout() -> None:
    devices = [
        DeviceHealth(DeviceName("gpu-0"), GPU, Status.HEALTHY, since=5.0),
        DeviceHealth(DeviceName("gpu-1"), GPU, Status.UNHEALTHY, "xid-79", "XID 79", 6.0, True),
        DeviceHealth(DeviceName("gpu-2"), GPU, Status.UNKNOWN, "probe-failed", "NVML gone", 7.0),
    ]
    assert health_states(devices, "node-a", now=100.9, timeout_seconds=90) == [
        DeviceHealthState("node-a", "gpu-0", Health.HEALTHY, 100, "", 90),
        DeviceHealthState("node-a", "gpu-1", Health.UNHEALTHY, 100, "xid-79: XID 79", 90),
        DeviceHealthState("node-a", "gpu-2", Health.UNKNOWN, 100, "probe-failed: NVML gone", 90),
    ]


def test_long_messages_are_cut_visibly() -> None:
    assert truncate_message("x" * MESSAGE_LIMIT) == "x" * MESSAGE_LIMIT
    cut = truncate_message("x" * (MESSAGE_LIMIT + 1))
    assert len(cut) == MESSAGE_LIMIT and cut.endswith("...")
