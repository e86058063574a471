"""``mps_namespaces``: a claim's planned devices to its MPS namespaces at the agent.

One namespace per GPU (a claim's shares there summed) and one per MIG instance;
the key is the lowest share key (shareID, else the 1.34 grant's); the SM cap is
the caps summed (at most 100), 100 when one share has none. Whole GPUs, MIG
devices, time-sliced shares and admin access hold none.
"""

from __future__ import annotations

import pytest

from dra_driver.base.ids import DeviceName, GpuUUID, PoolName
from dra_driver.core.prepare import (
    MigPlan,
    Mode,
    MpsNamespace,
    PlannedDevice,
    ShareLimits,
    mps_namespaces,
    namespace_of,
    owned_shares,
)

GIB = 2**30
GPU0 = GpuUUID("GPU-0000")
GPU1 = GpuUUID("GPU-1111")
MIG = MigPlan(profile_id=19, profile_name="1g.10gb", placement_start=0, placement_size=1)


def dev(
    name: str = "gpu-0",
    gpu: GpuUUID = GPU0,
    *,
    mode: Mode = Mode.MPS,
    share_id: str | None = "s1",
    grant: str | None = None,
    memory: int = 0,
    percent: int = 0,
    limits: bool = True,
    mig: MigPlan | None = None,
) -> PlannedDevice:
    return PlannedDevice(
        request_names=("r",),
        pool_name=PoolName("node"),
        device_name=DeviceName(name),
        share_id=share_id,
        gpu_uuid=gpu,
        mode=mode,
        cdi_device_ids=(),
        limits=ShareLimits(memory * GIB, percent) if limits else None,
        mig=mig,
        grant_share_id=grant,
    )


def ns(
    key: str | None,
    memory: int,
    percent: int,
    *,
    gpu: GpuUUID = GPU0,
    name: str = "gpu-0",
    mig_device: str | None = None,
    mig_uuid: str | None = None,
) -> MpsNamespace:
    return MpsNamespace(
        gpu_uuid=gpu,
        device_name=DeviceName(name),
        key=key,
        memory_limit_bytes=memory * GIB,
        active_thread_percentage=percent,
        mig_device=DeviceName(mig_device) if mig_device is not None else None,
        mig_uuid=mig_uuid,
    )


MIG_A = "gpu-0-mig-1g10gb-19-0"
MIG_B = "gpu-0-mig-1g10gb-19-1"
MADE = MigPlan(19, "1g.10gb", 1, 1, mig_uuid="MIG-b", gi_id=13, ci_id=0, created=True)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param([dev(memory=10, percent=25)], [ns("s1", 10, 25)], id="one-share"),
        pytest.param(
            [dev(share_id="s2", memory=10, percent=25), dev(share_id="s1", memory=30, percent=50)],
            [ns("s1", 40, 75)],
            id="two-shares-one-gpu-summed-lowest-key",
        ),
        pytest.param(
            [dev(share_id="a", percent=70), dev(share_id="b", percent=60)],
            [ns("a", 0, 100)],
            id="sm-caps-summed-at-most-100",
        ),
        pytest.param(
            [dev(share_id="a", memory=4, percent=30), dev(share_id="b", memory=4, percent=0)],
            [ns("a", 8, 100)],
            id="one-share-without-sm-cap-uncaps-the-namespace",
        ),
        pytest.param([dev(memory=2, percent=0)], [ns("s1", 2, 100)], id="no-sm-cap"),
        pytest.param([dev(limits=False)], [ns("s1", 0, 0)], id="no-limits-recorded"),
        pytest.param(
            [
                dev("gpu-1", GPU1, share_id="b", memory=6, percent=10),
                dev("gpu-0", GPU0, share_id="a", memory=4, percent=20),
            ],
            [ns("a", 4, 20), ns("b", 6, 10, gpu=GPU1, name="gpu-1")],
            id="shares-on-two-gpus-in-uuid-order",
        ),
        pytest.param(
            [dev(share_id=None, grant="g2", memory=3), dev(share_id=None, grant="g1", memory=5)],
            [ns("g1", 8, 100)],
            id="grant-keyed-shares-1.34",
        ),
        pytest.param(
            [dev(share_id=None, grant=None, memory=3)], [ns(None, 3, 100)], id="no-key-at-all"
        ),
        pytest.param(
            [
                dev(MIG_A, share_id="m2", memory=2, percent=30, mig=MIG),
                dev(MIG_A, share_id="m1", memory=4, percent=60, mig=MIG),
            ],
            [ns("m1", 6, 90, name=MIG_A, mig_device=MIG_A)],
            id="mps-inside-mig-instance-not-made-yet",
        ),
        pytest.param(
            [
                dev(MIG_B, share_id="m1", memory=2, mig=MADE),
                dev(share_id="s1", memory=10, percent=25),
            ],
            [ns("s1", 10, 25), ns("m1", 2, 100, name=MIG_B, mig_device=MIG_B, mig_uuid="MIG-b")],
            id="gpu-namespaces-then-mig-instances",
        ),
        pytest.param(
            [
                dev(mode=Mode.EXCLUSIVE, share_id=None, limits=False),
                dev("gpu-1", GPU1, mode=Mode.SHARED, limits=False),
                dev(MIG_A, mode=Mode.MIG, share_id=None, limits=False, mig=MIG),
                dev("gpu-1", GPU1, mode=Mode.ADMIN, share_id=None, limits=False),
            ],
            [],
            id="whole-gpu-timesliced-mig-admin-hold-none",
        ),
    ],
)
def test_mps_namespaces(devices: list[PlannedDevice], expected: list[MpsNamespace]) -> None:
    assert mps_namespaces(devices) == tuple(expected)


def test_each_share_finds_its_namespace() -> None:
    devices = [
        dev(share_id="a", memory=1),
        dev("gpu-1", GPU1, share_id="b", memory=1),
        dev(MIG_B, share_id="c", memory=1, mig=MADE),
    ]
    namespaces = mps_namespaces(devices)
    assert [namespace_of(namespaces, d).key for d in devices] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="none of the claim's MPS namespaces"):
        namespace_of(namespaces, dev("gpu-9", GpuUUID("GPU-9")))


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param([dev(share_id="b"), dev(share_id="a")], [(GPU0, "a")], id="gpu"),
        pytest.param([dev(MIG_B, mig=MADE)], [("MIG-b", "s1")], id="mig-by-instance-uuid"),
        pytest.param([dev(MIG_A, mig=MIG)], [], id="instance-not-made-holds-none"),
        pytest.param([dev(share_id=None)], [], id="no-key-holds-none"),
    ],
)
def test_owned_shares(devices: list[PlannedDevice], expected: list[tuple[str, str]]) -> None:
    assert owned_shares(devices) == expected
