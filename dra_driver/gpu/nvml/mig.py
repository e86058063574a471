"""Dynamic MIG: create and destroy MIG devices through NVML (on the NVML thread).

:func:`create_mig` makes a GPU instance at a placement
(``nvmlDeviceCreateGpuInstanceWithPlacement``) and one compute instance over
all of it (the CI profile whose slice count is the GI's, shared engines),
then finds the new MIG device's UUID among the GPU's MIG device handles by GI
and CI id. It is idempotent: a GPU instance of that profile already at that
placement (``nvmlDeviceGetGpuInstances`` + ``nvmlGpuInstanceGetInfo``) is
reused, and its compute instance created only if missing, so a prepare
retried after a crash between the two steps completes. A compute instance
that cannot be made takes its new GPU instance down with it.
:func:`destroy_mig` destroys the GPU instance's compute instances (of every
CI profile), then the instance; a GPU instance that is gone is not an error.
"""

from __future__ import annotations

import ctypes
from typing import Any

from dra_driver.base.errors import InventoryError, MigPlacementBusyError
from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.model import MigDevice, MigPlacement
from dra_driver.gpu.nvml.calls import ABSENT, NvmlCalls, log, text
from dra_driver.gpu.nvml.discovery import MIB, mig_devices, possible_placements


# docs/nvidia-interfaces.md: nvml-mig-mode, nvml-mig-create, nvml-mig-find
def create_mig(
    nvml: NvmlCalls, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement
) -> MigDevice:
    """The MIG device of profile ``profile_id`` at ``placement``, made if missing."""
    lib = nvml.lib
    handle, where = _by_uuid(nvml, gpu_uuid)
    mode = nvml.call(where, "nvmlDeviceGetMigMode", handle, tolerate=(lib.NVMLError_NotSupported,))
    if mode is ABSENT or mode[0] != lib.NVML_DEVICE_MIG_ENABLE:
        state = "not supported" if mode is ABSENT else "disabled"
        raise InventoryError(f"{where}: cannot create a MIG device: MIG mode is {state}")
    info = _gi_profile(nvml, where, handle, profile_id)
    name = text(info.name).strip().removeprefix("MIG ")
    allowed = possible_placements(nvml, where, handle, profile_id)
    if placement not in allowed:
        starts = ", ".join(f"{p.start}/{p.size}" for p in allowed)
        raise InventoryError(
            f"{where}: start {placement.start} size {placement.size} is not a placement of "
            f"{name} (profile id {profile_id}); its placements (start/size): {starts}"
        )
    wanted = f"{name} at start {placement.start} (size {placement.size})"
    found = _gpu_instance_at(nvml, where, handle, info, placement)
    if found is None:
        gi = _new_gpu_instance(nvml, where, handle, profile_id, placement, wanted=wanted)
        gi_id = int(nvml.call(where, "nvmlGpuInstanceGetInfo", gi).id)
        try:
            ci_id = _ensure_compute_instance(nvml, where, gi, info, gi_id)
        except InventoryError:
            _undo_gpu_instance(nvml, where, gi, gi_id)
            raise
    else:
        gi, gi_id = found
        log.info("%s: GPU instance %d (%s) exists already; reusing it", where, gi_id, wanted)
        ci_id = _ensure_compute_instance(nvml, where, gi, info, gi_id)
    uuid, memory = _mig_device_of(nvml, where, handle, gi_id, ci_id)
    return MigDevice(
        uuid=uuid,
        gi_id=gi_id,
        ci_id=ci_id,
        profile_id=profile_id,
        profile_name=name,
        placement=placement,
        memory_mib=memory // MIB,
    )


# docs/nvidia-interfaces.md: nvml-mig-destroy
def destroy_mig(nvml: NvmlCalls, gpu_uuid: GpuUUID, gi_id: int) -> bool:
    """Destroy GPU instance ``gi_id`` and its compute instances; False if it did not exist."""
    lib = nvml.lib
    handle, where = _by_uuid(nvml, gpu_uuid)
    gone = (lib.NVMLError_NotFound, lib.NVMLError_InvalidArgument)
    gi = nvml.call(where, "nvmlDeviceGetGpuInstanceById", handle, gi_id, tolerate=gone)
    if gi is ABSENT:
        log.info("%s: GPU instance %d does not exist; nothing to destroy", where, gi_id)
        return False
    gi_where = f"{where} GPU instance {gi_id}"
    in_use = "; a process still uses it: it can go once the container has exited"
    for ci_profile in _ci_profiles(nvml, gi_where, gi):
        for ci in _compute_instances(nvml, gi_where, gi, ci_profile):
            call = "nvmlComputeInstanceDestroy"
            nvml.call(gi_where, call, ci, tolerate=(lib.NVMLError_NotFound,), hint=in_use)
    destroy = "nvmlGpuInstanceDestroy"
    nvml.call(gi_where, destroy, gi, tolerate=(lib.NVMLError_NotFound,), hint=in_use)
    return True


def _by_uuid(nvml: NvmlCalls, gpu_uuid: GpuUUID) -> tuple[Any, str]:
    """The handle and log/error prefix of the GPU ``gpu_uuid``."""
    nvml.ensure_init()
    lib = nvml.lib
    where = f"GPU {gpu_uuid}"
    unknown = (lib.NVMLError_NotFound, lib.NVMLError_InvalidArgument)
    handle = nvml.call(where, "nvmlDeviceGetHandleByUUID", gpu_uuid, tolerate=unknown)
    if handle is ABSENT:
        raise InventoryError(f"{where}: NVML knows no GPU with that UUID on this node")
    return handle, where


def _gi_profile(nvml: NvmlCalls, where: str, handle: Any, profile_id: int) -> Any:
    """NVML's GPU-instance profile info for ``profile_id``; InventoryError if unknown."""
    lib = nvml.lib
    absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument, lib.NVMLError_NotFound)
    info: Any = ABSENT
    by_id = "nvmlDeviceGetGpuInstanceProfileInfoById"
    if hasattr(lib, by_id):
        missing = (lib.NVMLError_FunctionNotFound,)
        info = nvml.call(where, by_id, handle, profile_id, tolerate=missing + absent)
    if info is ABSENT:  # an older driver or binding: scan the profile indices
        call = "nvmlDeviceGetGpuInstanceProfileInfo"
        first, end = lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE, lib.NVML_GPU_INSTANCE_PROFILE_COUNT
        for index in range(first, end):
            found = nvml.call(where, call, handle, index, tolerate=absent)
            if found is not ABSENT and int(found.id) == profile_id:
                info = found
                break
    if info is ABSENT:
        raise InventoryError(
            f"{where}: NVML knows no GPU-instance profile with id {profile_id} "
            "(nvidia-smi mig -lgip lists the ids)"
        )
    return info


def _gpu_instance_at(
    nvml: NvmlCalls, where: str, handle: Any, info: Any, placement: MigPlacement
) -> tuple[Any, int] | None:
    """The GPU instance of profile ``info`` at exactly ``placement``, with its id."""
    lib = nvml.lib
    count = ctypes.c_uint(0)
    array = (lib.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
    call = "nvmlDeviceGetGpuInstances"
    nvml.call(where, call, handle, info.id, array, ctypes.byref(count))
    for gi in array[: count.value]:
        gi_info = nvml.call(where, "nvmlGpuInstanceGetInfo", gi)
        if (int(gi_info.placement.start), int(gi_info.placement.size)) == (
            placement.start,
            placement.size,
        ):
            return gi, int(gi_info.id)
    return None


def _ci_profiles(nvml: NvmlCalls, where: str, gi: Any) -> list[Any]:
    """Every compute-instance profile (shared engines) the GPU instance ``gi`` supports."""
    lib = nvml.lib
    absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument)
    shared = lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    call = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
    first, end = (
        lib.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
        lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
    )
    found = (nvml.call(where, call, gi, i, shared, tolerate=absent) for i in range(first, end))
    return [info for info in found if info is not ABSENT]


def _compute_instances(nvml: NvmlCalls, where: str, gi: Any, ci_profile: Any) -> list[Any]:
    lib = nvml.lib
    count = ctypes.c_uint(0)
    array = (lib.c_nvmlComputeInstance_t * max(int(ci_profile.instanceCount), 1))()
    call = "nvmlGpuInstanceGetComputeInstances"
    nvml.call(where, call, gi, ci_profile.id, array, ctypes.byref(count))
    return list(array[: count.value])


def _new_gpu_instance(
    nvml: NvmlCalls,
    where: str,
    handle: Any,
    profile_id: int,
    placement: MigPlacement,
    *,
    wanted: str,
) -> Any:
    c_placement = nvml.lib.c_nvmlGpuInstancePlacement_t()
    c_placement.start, c_placement.size = placement.start, placement.size
    call = "nvmlDeviceCreateGpuInstanceWithPlacement"
    try:
        return nvml.call(where, call, handle, profile_id, ctypes.byref(c_placement), busy=wanted)
    except MigPlacementBusyError as err:
        in_the_way = _overlapping(nvml, where, handle, placement)
        if not in_the_way:
            raise
        raise MigPlacementBusyError(f"{err}; in the way: {in_the_way}") from err.__cause__


def _overlapping(nvml: NvmlCalls, where: str, handle: Any, placement: MigPlacement) -> str:
    """The existing MIG devices ``placement`` overlaps, for an error message ('' if unknown)."""
    try:
        devices = mig_devices(nvml, where, handle, ())
    except InventoryError:
        return ""
    return "; ".join(
        f"MIG device {d.uuid} (GPU instance {d.gi_id}, profile id {d.profile_id}, "
        f"start {d.placement.start} size {d.placement.size})"
        for d in devices
        if d.placement.overlaps(placement)
    )


def _ensure_compute_instance(nvml: NvmlCalls, where: str, gi: Any, info: Any, gi_id: int) -> int:
    """The id of ``gi``'s compute instance over the whole GI, created if missing."""
    gi_where = f"{where} GPU instance {gi_id}"
    full = [p for p in _ci_profiles(nvml, gi_where, gi) if p.sliceCount == info.sliceCount]
    if not full:
        raise InventoryError(
            f"{gi_where}: NVML offers no compute-instance profile with "
            f"{info.sliceCount} slices (shared engines) for it"
        )
    ci_profile = full[0]
    existing = _compute_instances(nvml, gi_where, gi, ci_profile)
    if existing:
        ci = existing[0]
    else:
        call = "nvmlGpuInstanceCreateComputeInstance"
        ci = nvml.call(gi_where, call, gi, ci_profile.id)
    return int(nvml.call(gi_where, "nvmlComputeInstanceGetInfo", ci).id)


def _undo_gpu_instance(nvml: NvmlCalls, where: str, gi: Any, gi_id: int) -> None:
    try:
        nvml.call(where, "nvmlGpuInstanceDestroy", gi)
    except InventoryError as err:
        log.warning("%s: GPU instance %d is left behind: %s", where, gi_id, err)


# docs/nvidia-interfaces.md: nvml-mig-devices
def _mig_device_of(
    nvml: NvmlCalls, where: str, handle: Any, gi_id: int, ci_id: int
) -> tuple[MigUUID, int]:
    """UUID and memory (bytes) of the MIG device GI ``gi_id`` / CI ``ci_id``."""
    by_index, empty = "nvmlDeviceGetMigDeviceHandleByIndex", (nvml.lib.NVMLError_NotFound,)
    for slot in range(nvml.call(where, "nvmlDeviceGetMaxMigDeviceCount", handle)):
        mig = nvml.call(where, by_index, handle, slot, tolerate=empty)
        if mig is ABSENT:
            continue
        if (
            int(nvml.call(where, "nvmlDeviceGetGpuInstanceId", mig)) == gi_id
            and int(nvml.call(where, "nvmlDeviceGetComputeInstanceId", mig)) == ci_id
        ):
            uuid = MigUUID(text(nvml.call(where, "nvmlDeviceGetUUID", mig)))
            return uuid, int(nvml.call(where, "nvmlDeviceGetMemoryInfo", mig).total)
    raise InventoryError(
        f"{where}: GPU instance {gi_id} with compute instance {ci_id} exists, but NVML "
        "lists no MIG device for it"
    )
