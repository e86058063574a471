"""``mps_namespaces``: a claim's planned devices to its MPS namespaces at the agent.

One namespace per GPU (a claim's shares there summed) and one per MIG instance;
the key is the lowest share key (shareID, else the 1.34 grant's); the SM cap is
the caps summed (at most 100), 100 when one share has none. Whole GPUs, MIG
devices, time-sliced shares and admin access hold none.
"""

from __future__ import annotations

import pytest

from dra_driver.base.ids import DeviceName, GpuUUID
from dra_driver.core.prepare import (
    MpsDevice,
    MpsNamespace,
    PlannedDevice,
    mps_namespaces,
    namespace_of,
    owned_shares,
)
from tests.support.planned import (
    admin,
    exclusive,
    mig_instance,
    mig_plan,
    mps_in_mig,
    mps_share,
    time_sliced,
)

GIB = 2**30
GPU0 = GpuUUID("GPU-0")  # (the builders' default GPU)
GPU1 = GpuUUID("GPU-1111")
MIG = mig_plan(19, "1g.10gb", 0, 1)


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
MADE = mig_plan(19, "1g.10gb", 1, 1, uuid="MIG-b", gi_id=13, ci_id=0, created=True)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(
            [mps_share(share_id="s1", memory_bytes=10 * GIB, compute_percent=25)],
            [ns("s1", 10, 25)],
            id="one-share",
        ),
        pytest.param(
            [
                mps_share(share_id="s2", memory_bytes=10 * GIB, compute_percent=25),
                mps_share(share_id="s1", memory_bytes=30 * GIB, compute_percent=50),
            ],
            [ns("s1", 40, 75)],
            id="two-shares-one-gpu-summed-lowest-key",
        ),
        pytest.param(
            [
                mps_share(share_id="a", memory_bytes=0, compute_percent=70),
                mps_share(share_id="b", memory_bytes=0, compute_percent=60),
            ],
            [ns("a", 0, 100)],
            id="sm-caps-summed-at-most-100",
        ),
        pytest.param(
            [
                mps_share(share_id="a", memory_bytes=4 * GIB, compute_percent=30),
                mps_share(share_id="b", memory_bytes=4 * GIB),
            ],
            [ns("a", 8, 100)],
            id="one-share-without-sm-cap-uncaps-the-namespace",
        ),
        pytest.param(
            [mps_share(share_id="s1", memory_bytes=2 * GIB)], [ns("s1", 2, 100)], id="no-sm-cap"
        ),
        pytest.param(
            [
                mps_share(
                    "gpu-1", gpu=GPU1, share_id="b", memory_bytes=6 * GIB, compute_percent=10
                ),
                mps_share("gpu-0", share_id="a", memory_bytes=4 * GIB, compute_percent=20),
            ],
            [ns("a", 4, 20), ns("b", 6, 10, gpu=GPU1, name="gpu-1")],
            id="shares-on-two-gpus-in-uuid-order",
        ),
        pytest.param(
            [
                mps_share(share_id=None, grant="g2", memory_bytes=3 * GIB),
                mps_share(share_id=None, grant="g1", memory_bytes=5 * GIB),
            ],
            [ns("g1", 8, 100)],
            id="grant-keyed-shares-1.34",
        ),
        pytest.param(
            [mps_share(share_id=None, grant=None, memory_bytes=3 * GIB)],
            [ns(None, 3, 100)],
            id="no-key-at-all",
        ),
        pytest.param(
            [
                mps_in_mig(MIG_A, share_id="m2", memory_bytes=2 * GIB, compute_percent=30, mig=MIG),
                mps_in_mig(MIG_A, share_id="m1", memory_bytes=4 * GIB, compute_percent=60, mig=MIG),
            ],
            [ns("m1", 6, 90, name=MIG_A, mig_device=MIG_A)],
            id="mps-inside-mig-instance-not-made-yet",
        ),
        pytest.param(
            [
                mps_in_mig(MIG_B, share_id="m1", memory_bytes=2 * GIB, mig=MADE),
                mps_share(share_id="s1", memory_bytes=10 * GIB, compute_percent=25),
            ],
            [ns("s1", 10, 25), ns("m1", 2, 100, name=MIG_B, mig_device=MIG_B, mig_uuid="MIG-b")],
            id="gpu-namespaces-then-mig-instances",
        ),
        pytest.param(
            [
                exclusive(),
                time_sliced("gpu-1", gpu=GPU1, share_id="s1"),
                mig_instance(MIG_A, mig=MIG),
                admin("gpu-1", gpu=GPU1),
            ],
            [],
            id="whole-gpu-timesliced-mig-admin-hold-none",
        ),
    ],
)
def test_mps_namespaces(devices: list[PlannedDevice], expected: list[MpsNamespace]) -> None:
    assert mps_namespaces(devices) == tuple(expected)


def test_each_share_finds_its_namespace() -> None:
    devices: list[MpsDevice] = [
        mps_share(share_id="a", memory_bytes=GIB),
        mps_share("gpu-1", gpu=GPU1, share_id="b", memory_bytes=GIB),
        mps_in_mig(MIG_B, share_id="c", memory_bytes=GIB, mig=MADE),
    ]
    namespaces = mps_namespaces(devices)
    assert [namespace_of(namespaces, d).key for d in devices] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="none of the claim's MPS namespaces"):
        namespace_of(namespaces, mps_share("gpu-9", gpu=GpuUUID("GPU-9"), share_id="s1"))


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param([mps_share(share_id="b"), mps_share(share_id="a")], [(GPU0, "a")], id="gpu"),
        pytest.param(
            [mps_in_mig(MIG_B, share_id="s1", mig=MADE)],
            [("MIG-b", "s1")],
            id="mig-by-instance-uuid",
        ),
        pytest.param(
            [mps_in_mig(MIG_A, share_id="s1", mig=MIG)], [], id="instance-not-made-holds-none"
        ),
        pytest.param([mps_share(share_id=None)], [], id="no-key-holds-none"),
    ],
)
def test_owned_shares(devices: list[PlannedDevice], expected: list[tuple[str, str]]) -> None:
    assert owned_shares(devices) == expected
