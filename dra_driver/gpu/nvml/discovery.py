"""What NVML says the node has: GPUs, their MIG profiles and placements, MIG devices.

Per GPU its identity, memory, architecture, versions, PCI bus id and MIG
mode; when MIG is enabled now, the GPU-instance profiles with their possible
placements, and the MIG devices that exist. Nothing is cached: each
:func:`discover` asks NVML again (MIG devices come and go). Runs on the
serialised NVML thread.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from typing import Any, Final

from dra_driver.base.ids import MigUUID
from dra_driver.core.model import GpuInfo, Inventory, MigDevice, MigPlacement, MigProfile
from dra_driver.gpu.nvml.calls import ABSENT, NvmlCalls, log, text

MIB: Final = 1 << 20
_ARCH_PREFIX: Final = "NVML_DEVICE_ARCH_"
_BUS_ID = re.compile(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")


def normalise_pci_bus_id(raw: str | bytes) -> str:
    """NVML's ``00000000:3B:00.0`` → sysfs's ``0000:3b:00.0`` (4+ hex digit domain, lower case)."""
    bus_id = text(raw).strip().lower()
    match = _BUS_ID.match(bus_id)
    if match is None:
        log.warning("unexpected PCI bus id %r from NVML; published as is", bus_id)
        return bus_id
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


def _cuda_version(value: int) -> str:
    """NVML's ``13000`` → ``13.0`` (major·1000 + minor·10)."""
    return f"{value // 1000}.{value % 1000 // 10}"


def architecture_names(lib: Any) -> dict[Any, str]:
    """``NVML_DEVICE_ARCH_*`` values → ``hopper``, ``ampere``, ... (not ``unknown``)."""
    return {
        getattr(lib, attr): attr.removeprefix(_ARCH_PREFIX).lower()
        for attr in dir(lib)
        if attr.startswith(_ARCH_PREFIX) and attr != f"{_ARCH_PREFIX}UNKNOWN"
    }


def discover(nvml: NvmlCalls, arch_names: Mapping[Any, str]) -> Inventory:
    """The node's GPUs as NVML sees them now."""
    nvml.ensure_init()
    # docs/nvidia-interfaces.md: nvml-versions, nvml-enumerate
    driver = text(nvml.call("NVML", "nvmlSystemGetDriverVersion"))
    cuda: Any = ABSENT
    if hasattr(nvml.lib, "nvmlSystemGetCudaDriverVersion_v2"):
        # _v2 asks libcuda, which a container may lack; the original call does not.
        v2 = "nvmlSystemGetCudaDriverVersion_v2"
        cuda = nvml.call("NVML", v2, tolerate=(nvml.lib.NVMLError,))
    if cuda is ABSENT:
        cuda = nvml.call("NVML", "nvmlSystemGetCudaDriverVersion")
    count = nvml.call("NVML", "nvmlDeviceGetCount")
    return Inventory(
        gpus=tuple(_gpu(nvml, arch_names, i, driver, _cuda_version(cuda)) for i in range(count))
    )


# docs/nvidia-interfaces.md: nvml-gpu-facts, nvml-mig-mode
def _gpu(
    nvml: NvmlCalls, arch_names: Mapping[Any, str], index: int, driver: str, cuda: str
) -> GpuInfo:
    lib = nvml.lib
    handle, uuid, where = nvml.handle(index)
    major, minor = nvml.call(where, "nvmlDeviceGetCudaComputeCapability", handle)
    unsupported = (lib.NVMLError_NotSupported,)
    arch = nvml.call(where, "nvmlDeviceGetArchitecture", handle, tolerate=unsupported)
    mode = nvml.call(where, "nvmlDeviceGetMigMode", handle, tolerate=unsupported)
    capable = mode is not ABSENT
    current, pending = mode if capable else (lib.NVML_DEVICE_MIG_DISABLE,) * 2
    enabled = current == lib.NVML_DEVICE_MIG_ENABLE
    profiles = _profiles(nvml, where, handle) if enabled else ()
    pci = nvml.call(where, "nvmlDeviceGetPciInfo", handle)
    return GpuInfo(
        index=index,
        uuid=uuid,
        product_name=text(nvml.call(where, "nvmlDeviceGetName", handle)),
        memory_bytes=int(nvml.call(where, "nvmlDeviceGetMemoryInfo", handle).total),
        minor=int(nvml.call(where, "nvmlDeviceGetMinorNumber", handle)),
        architecture=arch_names.get(arch, "unknown"),
        cuda_compute_capability=f"{major}.{minor}",
        driver_version=driver,
        cuda_driver_version=cuda,
        pci_bus_id=normalise_pci_bus_id(pci.busId),
        mig_capable=capable,
        mig_enabled=enabled,
        mig_pending=pending == lib.NVML_DEVICE_MIG_ENABLE,
        mig_profiles=profiles,
        mig_devices=mig_devices(nvml, where, handle, profiles) if enabled else (),
    )


# docs/nvidia-interfaces.md: nvml-mig-profiles
def _profiles(nvml: NvmlCalls, where: str, handle: Any) -> tuple[MigProfile, ...]:
    lib = nvml.lib
    absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument)
    profiles = []
    first, end = lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE, lib.NVML_GPU_INSTANCE_PROFILE_COUNT
    for profile_index in range(first, end):
        call = "nvmlDeviceGetGpuInstanceProfileInfo"
        info = nvml.call(where, call, handle, profile_index, tolerate=absent)
        if info is ABSENT:
            continue
        name = text(getattr(info, "name", "")).strip().removeprefix("MIG ")
        if not name:
            log.debug("%s: MIG profile id %d has no name; skipped", where, info.id)
            continue
        placements = possible_placements(nvml, where, handle, info.id)
        if not placements:
            log.debug("%s: MIG profile %s has no placements; skipped", where, name)
            continue
        profiles.append(
            MigProfile(
                id=int(info.id),
                name=name,
                compute_slices=int(info.sliceCount),
                memory_mib=int(info.memorySizeMB),
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=placements,
            )
        )
    return tuple(profiles)


# docs/nvidia-interfaces.md: nvml-mig-placements
def possible_placements(
    nvml: NvmlCalls, where: str, handle: Any, profile_id: int
) -> tuple[MigPlacement, ...]:
    """Where a GPU instance of ``profile_id`` can go on the GPU ``handle``."""
    # C-style call: a NULL array asks for the count, then a sized array is filled.
    call = "nvmlDeviceGetGpuInstancePossiblePlacements"
    count = ctypes.c_uint(0)
    nvml.call(where, call, handle, profile_id, None, ctypes.byref(count))
    if not count.value:
        return ()
    array = (nvml.lib.c_nvmlGpuInstancePlacement_t * count.value)()
    nvml.call(where, call, handle, profile_id, array, ctypes.byref(count))
    return tuple(MigPlacement(int(p.start), int(p.size)) for p in array[: count.value])


# docs/nvidia-interfaces.md: nvml-mig-devices
def mig_devices(
    nvml: NvmlCalls, where: str, handle: Any, profiles: tuple[MigProfile, ...]
) -> tuple[MigDevice, ...]:
    """The MIG devices that exist on the GPU ``handle``; ``profiles`` name their profiles."""
    names = {profile.id: profile.name for profile in profiles}
    devices = []
    for slot in range(nvml.call(where, "nvmlDeviceGetMaxMigDeviceCount", handle)):
        by_index, empty = "nvmlDeviceGetMigDeviceHandleByIndex", (nvml.lib.NVMLError_NotFound,)
        mig = nvml.call(where, by_index, handle, slot, tolerate=empty)
        if mig is ABSENT:
            continue
        uuid = MigUUID(text(nvml.call(where, "nvmlDeviceGetUUID", mig)))
        mig_where = f"{where} MIG device {uuid}"
        gi_id = int(nvml.call(mig_where, "nvmlDeviceGetGpuInstanceId", mig))
        gi = nvml.call(mig_where, "nvmlDeviceGetGpuInstanceById", handle, gi_id)
        info = nvml.call(mig_where, "nvmlGpuInstanceGetInfo", gi)
        ci_id = int(nvml.call(mig_where, "nvmlDeviceGetComputeInstanceId", mig))
        memory = int(nvml.call(mig_where, "nvmlDeviceGetMemoryInfo", mig).total)
        if info.profileId not in names:
            log.warning("%s: GPU-instance profile id %d is unknown", mig_where, info.profileId)
        devices.append(
            MigDevice(
                uuid=uuid,
                gi_id=gi_id,
                ci_id=ci_id,
                profile_id=int(info.profileId),
                profile_name=names.get(info.profileId, ""),
                placement=MigPlacement(int(info.placement.start), int(info.placement.size)),
                memory_mib=memory // MIB,
            )
        )
    return tuple(devices)
