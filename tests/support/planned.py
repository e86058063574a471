"""Planned devices for tests: one builder per variant, every field defaulted.

Each builder takes the device name first and the rest by keyword; what a test
does not name is a plain value of node ``node-a``'s GPU ``GPU-0``, asked by
request ``gpu``, with no CDI device ids.
"""

from __future__ import annotations

from dra_driver.base.ids import DeviceName, GpuUUID, PoolName
from dra_driver.core.prepare import (
    Admin,
    CommonFields,
    Exclusive,
    MigInstance,
    MigInstanceIds,
    MigPlan,
    MpsInMig,
    MpsLimits,
    MpsShare,
    TimeSliced,
)

GIB = 1 << 30
POOL = "node-a"
GPU = "GPU-0"


def _at(
    name: str,
    *,
    gpu: str,
    share_id: str | None,
    requests: tuple[str, ...],
    pool: str,
    cdi: tuple[str, ...],
) -> CommonFields:
    return requests, PoolName(pool), DeviceName(name), share_id, GpuUUID(gpu), cdi


def mig_plan(
    profile_id: int = 19,
    profile_name: str = "1g.10gb",
    start: int = 0,
    size: int = 1,
    *,
    uuid: str | None = None,
    gi_id: int = 0,
    ci_id: int = 0,
    created: bool = False,
) -> MigPlan:
    """A MIG instance at a placement; with ``uuid``, one that exists (ids ``gi_id``, ``ci_id``)."""
    instance = MigInstanceIds(uuid, gi_id, ci_id) if uuid is not None else None
    return MigPlan(profile_id, profile_name, start, size, instance=instance, created=created)


def exclusive(
    name: str = "gpu-0",
    *,
    gpu: str = GPU,
    share_id: str | None = None,
    requests: tuple[str, ...] = ("gpu",),
    pool: str = POOL,
    cdi: tuple[str, ...] = (),
) -> Exclusive:
    return Exclusive(*_at(name, gpu=gpu, share_id=share_id, requests=requests, pool=pool, cdi=cdi))


def time_sliced(
    name: str = "gpu-0",
    *,
    gpu: str = GPU,
    share_id: str | None = "s",
    grant: str | None = None,
    requests: tuple[str, ...] = ("gpu",),
    pool: str = POOL,
    cdi: tuple[str, ...] = (),
) -> TimeSliced:
    return TimeSliced(
        *_at(name, gpu=gpu, share_id=share_id, requests=requests, pool=pool, cdi=cdi),
        grant_share_id=grant,
    )


def mps_share(
    name: str = "gpu-0",
    *,
    gpu: str = GPU,
    share_id: str | None = "s",
    memory_bytes: int = GIB,
    compute_percent: int = 0,
    grant: str | None = None,
    requests: tuple[str, ...] = ("gpu",),
    pool: str = POOL,
    cdi: tuple[str, ...] = (),
) -> MpsShare:
    return MpsShare(
        *_at(name, gpu=gpu, share_id=share_id, requests=requests, pool=pool, cdi=cdi),
        limits=MpsLimits(memory_bytes, compute_percent),
        grant_share_id=grant,
    )


def mig_instance(
    name: str = "gpu-0-mig-1g10gb-19-0",
    *,
    mig: MigPlan | None = None,
    gpu: str = GPU,
    share_id: str | None = None,
    requests: tuple[str, ...] = ("gpu",),
    pool: str = POOL,
    cdi: tuple[str, ...] = (),
) -> MigInstance:
    """A MIG device (``mig`` unset: a 1g.10gb instance at placement 0, not made yet)."""
    return MigInstance(
        *_at(name, gpu=gpu, share_id=share_id, requests=requests, pool=pool, cdi=cdi),
        mig=mig if mig is not None else mig_plan(),
    )


def mps_in_mig(
    name: str = "gpu-0-mig-1g10gb-19-0",
    *,
    mig: MigPlan | None = None,
    gpu: str = GPU,
    share_id: str | None = "s",
    memory_bytes: int = GIB,
    compute_percent: int = 0,
    requests: tuple[str, ...] = ("gpu",),
    pool: str = POOL,
    cdi: tuple[str, ...] = (),
) -> MpsInMig:
    """An MPS share of a MIG instance (``mig`` unset: as :func:`mig_instance`'s)."""
    return MpsInMig(
        *_at(name, gpu=gpu, share_id=share_id, requests=requests, pool=pool, cdi=cdi),
        limits=MpsLimits(memory_bytes, compute_percent),
        mig=mig if mig is not None else mig_plan(),
    )


def admin(
    name: str = "gpu-0",
    *,
    gpu: str = GPU,
    mig: MigPlan | None = None,
    share_id: str | None = None,
    requests: tuple[str, ...] = ("gpu",),
    pool: str = POOL,
    cdi: tuple[str, ...] = (),
) -> Admin:
    return Admin(
        *_at(name, gpu=gpu, share_id=share_id, requests=requests, pool=pool, cdi=cdi), mig=mig
    )
