"""CDI edits for one MIG device (pure)."""

from __future__ import annotations

import pytest

from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.cdi import NVIDIACTL, CapNode, ContainerEdits, DeviceNode, mig_device_edits
from dra_driver.core.model import GpuInfo, MigDevice, MigPlacement

MIG = MigDevice(MigUUID("MIG-1"), 2, 0, 9, "3g.40gb", MigPlacement(0, 4), 40192)
GPU = GpuInfo(
    index=1,
    uuid=GpuUUID("GPU-1"),
    product_name="NVIDIA H100 80GB HBM3",
    memory_bytes=80 << 30,
    minor=3,
    mig_capable=True,
    mig_enabled=True,
    mig_devices=(MIG,),
)
CAPS = (CapNode.for_minor(509, 21, 0o444), CapNode.for_minor(509, 22, 0o444))


def test_nodes_of_a_mig_device() -> None:
    edits = mig_device_edits(GPU, MIG, CAPS)
    assert edits == ContainerEdits(
        device_nodes=(
            DeviceNode("/dev/nvidia3", type="c", major=195, minor=3),
            DeviceNode("/dev/nvidia-caps/nvidia-cap21", "c", 509, 21, file_mode=0o444),
            DeviceNode("/dev/nvidia-caps/nvidia-cap22", "c", 509, 22, file_mode=0o444),
            NVIDIACTL,
        )
    )
    assert edits.env == ()  # visibility comes from the nodes; see the module docstring
    assert edits.render()["deviceNodes"][1] == {
        "path": "/dev/nvidia-caps/nvidia-cap21",
        "type": "c",
        "major": 509,
        "minor": 21,
        "fileMode": 292,  # 0o444, as the driver's DeviceFileMode says
    }


def test_control_nodes_are_the_callers_choice() -> None:
    uvm = DeviceNode("/dev/nvidia-uvm", major=510, minor=0)
    nodes = mig_device_edits(GPU, MIG, CAPS, control_nodes=(uvm, NVIDIACTL)).device_nodes
    assert [n.path for n in nodes][3:] == ["/dev/nvidia-uvm", "/dev/nvidiactl"]
    assert len(mig_device_edits(GPU, MIG, CAPS, control_nodes=()).device_nodes) == 3
    # A control node that repeats one of the device's own nodes is not added twice.
    twice = mig_device_edits(GPU, MIG, CAPS, control_nodes=(CAPS[0].device_node(),))
    assert len(twice.device_nodes) == 3


def test_a_device_made_after_the_inventory_is_fine() -> None:
    new = MigDevice(MigUUID("MIG-2"), 5, 0, 19, "1g.10gb", MigPlacement(6, 1), 9856)
    assert len(mig_device_edits(GPU, new, CAPS).device_nodes) == 4


def test_mixed_up_cap_nodes() -> None:
    with pytest.raises(ValueError, match="GI and CI capability nodes are both"):
        mig_device_edits(GPU, MIG, (CAPS[0], CAPS[0]))
