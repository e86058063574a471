"""A fake of the ``pynvml`` module (nvidia-ml-py 13.615.71) for the NVML backend's tests.

:class:`FakeNvml` instances stand in for the module: the functions the backend
calls, with pynvml's names, parameters and return shapes; the constants it
reads, with pynvml's values; and ``NVMLError`` with the subclasses it catches.
Like the real binding, device handles are ctypes pointers (a new pointer object
per call, the same address per device), char-array fields come back as ``str``
(``legacy_bytes=True`` gives ``bytes``, as older releases did), the placement
query is C-style (a ctypes array and a ``byref`` count), and every call before
``nvmlInit`` answers ``NVMLError_Uninitialized``.

The default node: GPU 0 is an H100 80GB HBM3 in MIG mode with the H100
GPU-instance profiles (ids as ``nvidia-smi mig -lgip`` prints them; engine and
memory figures plausible, not captured from hardware) and one 3g.40gb instance
at placement 0; GPU 1 is an H100 with MIG disabled; GPU 2 is an A100-SXM4-40GB
with MIG disabled.

Dynamic MIG is modelled: ``nvmlDeviceCreateGpuInstanceWithPlacement`` (the
placement passed with ``ctypes.byref``, as the C API takes a pointer) checks
MIG mode, the profile, the placement, overlap with existing GPU instances,
the profile's instance count and the GPU's 7 compute slices
(``NVMLError_InsufficientResources``); the new GPU instance gets the lowest
unused id from 1 and waits in ``FakeGpu.empty_instances`` until
``nvmlGpuInstanceCreateComputeInstance`` gives it its one compute instance
(id 0; only the CI profile spanning the whole GPU instance is modelled),
which makes it a MIG device with a fresh UUID. Destroying a compute instance
turns it back into an empty GPU instance; destroying a GPU instance that
still has one, or a compute instance whose ``FakeMigDevice.in_use`` is set,
answers ``NVMLError_InUse``. ``by_id_missing`` makes
``nvmlDeviceGetGpuInstanceProfileInfoById`` answer
``NVMLError_FunctionNotFound``, as an older driver does.

Knobs: ``init_error``, ``gpus[i].lost`` (every call on that GPU but the handle
and UUID lookups answers ``NVMLError_GpuIsLost``; the liveness probe's
``nvmlDeviceGetTemperature`` too), ``failures`` and
``gpus[i].failures`` (call name → exception to raise, on any call or on calls
with that GPU's handles), ``gpus[i].event_types``, :meth:`FakeNvml.push_event` (consumed by
``nvmlEventSetWait_v2``, which otherwise really waits its timeout) and
``wait_stall_s``. ``calls`` records ``(name, thread id)`` for every call.

Not modelled: compute instances smaller than their GPU instance, compute-
instance placements, remaining capacity, MIG mode changes, the refcount subtleties of
repeated ``nvmlInit``, and every other pynvml function.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_RESET_REQUIRED: "GPU requires restart",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient resources",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """pynvml's base error: ``value`` is the NVML return code, ``str()`` its text."""

    code: ClassVar[int] = NVML_ERROR_UNKNOWN

    def __init__(self, value: int | None = None) -> None:
        self.value = self.code if value is None else value
        super().__init__(self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_Uninitialized(NVMLError):
    code = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    code = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    code = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):
    code = NVML_ERROR_NO_PERMISSION


class NVMLError_NotFound(NVMLError):
    code = NVML_ERROR_NOT_FOUND


class NVMLError_InsufficientSize(NVMLError):
    code = NVML_ERROR_INSUFFICIENT_SIZE


class NVMLError_DriverNotLoaded(NVMLError):
    code = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_Timeout(NVMLError):
    code = NVML_ERROR_TIMEOUT


class NVMLError_LibraryNotFound(NVMLError):
    code = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    code = NVML_ERROR_GPU_IS_LOST


class NVMLError_ResetRequired(NVMLError):
    code = NVML_ERROR_RESET_REQUIRED


class NVMLError_FunctionNotFound(NVMLError):
    code = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_InUse(NVMLError):
    code = NVML_ERROR_IN_USE


class NVMLError_InsufficientResources(NVMLError):
    code = NVML_ERROR_INSUFFICIENT_RESOURCES


class _DeviceStruct(ctypes.Structure):
    """What a fake device handle points at: a GPU index and a MIG slot (-1: the GPU)."""

    _fields_ = [("gpu", ctypes.c_int), ("mig", ctypes.c_int)]


class _GpuInstanceStruct(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_int), ("gi", ctypes.c_uint)]


class _ComputeInstanceStruct(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_int), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


c_nvmlGpuInstance_t = ctypes.POINTER(_GpuInstanceStruct)
c_nvmlComputeInstance_t = ctypes.POINTER(_ComputeInstanceStruct)


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlComputeInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class c_nvmlGpuInstanceInfo_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.POINTER(_DeviceStruct)),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", c_nvmlGpuInstancePlacement_t),
    ]


class c_nvmlComputeInstanceInfo_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.POINTER(_DeviceStruct)),
        ("gpuInstance", c_nvmlGpuInstance_t),
        ("id", ctypes.c_uint),
        ("profileId", ctypes.c_uint),
        ("placement", c_nvmlComputeInstancePlacement_t),
    ]


class c_nvmlEventData_t(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.POINTER(_DeviceStruct)),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


@dataclass
class MemoryInfo:
    """``c_nvmlMemory_t``."""

    total: int
    free: int
    used: int


@dataclass
class PciInfo:
    """The fields of ``nvmlPciInfo_t`` the backend might read."""

    busId: str | bytes
    domain: int
    bus: int
    device: int


@dataclass
class GpuInstanceProfileInfo:
    """``c_nvmlGpuInstanceProfileInfo_v2_t``."""

    version: int
    id: int
    isP2pSupported: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    copyEngineCount: int
    decoderCount: int
    encoderCount: int
    jpegCount: int
    ofaCount: int
    memorySizeMB: int
    name: str | bytes


@dataclass
class ComputeInstanceProfileInfo:
    """``c_nvmlComputeInstanceProfileInfo_v2_t``."""

    version: int
    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    name: str | bytes


@dataclass
class FakeProfile:
    """One GPU-instance profile, under its ``NVML_GPU_INSTANCE_PROFILE_*`` index."""

    index: int
    id: int
    name: str
    """As NVML names it: ``MIG 1g.10gb``."""
    slices: int
    instances: int
    multiprocessors: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...]
    copy_engines: int = 1
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0


@dataclass
class FakeMigDevice:
    uuid: str
    gi_id: int
    ci_id: int
    profile_id: int
    start: int
    size: int
    memory_mib: int
    in_use: bool = False
    """A process runs on it: destroying its compute instance answers ``NVMLError_InUse``."""


@dataclass
class FakeGpuInstance:
    """A GPU instance without a compute instance (so not a MIG device yet)."""

    gi_id: int
    profile_id: int
    start: int
    size: int


@dataclass
class FakeGpu:
    name: str
    uuid: str
    minor: int
    memory_mib: int
    architecture: int
    compute_capability: tuple[int, int]
    bus_id: str
    mig_mode: tuple[int, int] | None = (0, 0)
    """(current, pending); None: not MIG capable (``NVMLError_NotSupported``)."""
    profiles: list[FakeProfile] = field(default_factory=list)
    mig_devices: list[FakeMigDevice] = field(default_factory=list)
    """GPU instances with their compute instance (id 0), in MIG-device slot order."""
    empty_instances: list[FakeGpuInstance] = field(default_factory=list)
    event_types: int = 0x1 | 0x2 | 0x8
    lost: bool = False
    temperature: int = 41
    failures: dict[str, Exception] = field(default_factory=dict)
    """Call name → exception, for calls on this GPU's handles."""


@dataclass
class FakeEventSet:
    registered: dict[int, int] = field(default_factory=dict)
    """GPU index → registered event-type mask."""
    freed: bool = False


@dataclass(frozen=True)
class _PushedEvent:
    gpu: int
    event_type: int
    data: int
    gi: int
    ci: int
    bypass_registration: bool


_H100_UUID = "GPU-5ed1b7c8-4f1a-6b2e-9c3d-1a2b3c4d5e6f"


def h100_profiles() -> list[FakeProfile]:
    """The H100 80GB GPU-instance profiles, in NVML profile-index order."""
    one = tuple((start, 1) for start in range(7))
    return [
        FakeProfile(0x0, 19, "MIG 1g.10gb", 1, 7, 16, 9856, one, 1, 1, 0, 1),
        FakeProfile(0x1, 14, "MIG 2g.20gb", 2, 3, 32, 19968, ((0, 2), (2, 2), (4, 2)), 2, 2, 0, 2),
        FakeProfile(0x2, 9, "MIG 3g.40gb", 3, 2, 60, 40192, ((0, 4), (4, 4)), 3, 3, 0, 3),
        FakeProfile(0x3, 5, "MIG 4g.40gb", 4, 1, 64, 40192, ((0, 4),), 4, 4, 0, 4),
        FakeProfile(0x4, 0, "MIG 7g.80gb", 7, 1, 132, 80896, ((0, 8),), 8, 7, 0, 7, 1),
        FakeProfile(0x7, 20, "MIG 1g.10gb+me", 1, 1, 16, 9856, one, 1, 1, 0, 1, 1),
        FakeProfile(
            0x9, 15, "MIG 1g.20gb", 1, 4, 26, 19968, tuple((s, 2) for s in (0, 2, 4, 6)), 1, 1, 0, 1
        ),
    ]


def _h100(uuid: str, minor: int, bus_id: str, **mig: Any) -> FakeGpu:
    return FakeGpu("NVIDIA H100 80GB HBM3", uuid, minor, 81559, 9, (9, 0), bus_id, **mig)


def default_gpus() -> list[FakeGpu]:
    """GPU 0: H100 in MIG mode with one 3g.40gb; GPU 1: H100; GPU 2: A100-40GB."""
    existing = FakeMigDevice("MIG-7c1e0f5a-2b3d-5e6f-8a9b-0c1d2e3f4a5b", 2, 0, 9, 0, 4, 40192)
    return [
        _h100(
            _H100_UUID,
            0,
            "00000000:18:00.0",
            mig_mode=(1, 1),
            profiles=h100_profiles(),
            mig_devices=[existing],
        ),
        _h100("GPU-9a8b7c6d-5e4f-3a2b-1c0d-ffeeddccbbaa", 1, "00000000:3B:00.0"),
        FakeGpu(
            "NVIDIA A100-SXM4-40GB",
            "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
            minor=2,
            memory_mib=40960,
            architecture=7,
            compute_capability=(8, 0),
            bus_id="00000000:86:00.0",
        ),
    ]


class FakeNvml:
    """Use an instance where the ``pynvml`` module goes."""

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_InsufficientSize = NVMLError_InsufficientSize
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_ResetRequired = NVMLError_ResetRequired
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_InUse = NVMLError_InUse
    NVMLError_InsufficientResources = NVMLError_InsufficientResources
    c_nvmlGpuInstancePlacement_t = c_nvmlGpuInstancePlacement_t
    c_nvmlGpuInstance_t = c_nvmlGpuInstance_t
    c_nvmlComputeInstance_t = c_nvmlComputeInstance_t

    NVML_SUCCESS = NVML_SUCCESS
    NVML_DEVICE_ARCH_KEPLER = 2
    NVML_DEVICE_ARCH_MAXWELL = 3
    NVML_DEVICE_ARCH_PASCAL = 4
    NVML_DEVICE_ARCH_VOLTA = 5
    NVML_DEVICE_ARCH_TURING = 6
    NVML_DEVICE_ARCH_AMPERE = 7
    NVML_DEVICE_ARCH_ADA = 8
    NVML_DEVICE_ARCH_HOPPER = 9
    NVML_DEVICE_ARCH_BLACKWELL = 10
    NVML_DEVICE_ARCH_DLA = 11
    NVML_DEVICE_ARCH_DLA2 = 12
    NVML_DEVICE_ARCH_RUBIN = 13
    NVML_DEVICE_ARCH_NPU3 = 15
    NVML_DEVICE_ARCH_UNKNOWN = 0xFFFFFFFF
    NVML_TEMPERATURE_GPU = 0
    NVML_DEVICE_MIG_DISABLE = 0x0
    NVML_DEVICE_MIG_ENABLE = 0x1
    NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_GPU_INSTANCE_PROFILE_2_SLICE = 0x1
    NVML_GPU_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_GPU_INSTANCE_PROFILE_4_SLICE = 0x3
    NVML_GPU_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_GPU_INSTANCE_PROFILE_8_SLICE = 0x5
    NVML_GPU_INSTANCE_PROFILE_6_SLICE = 0x6
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
    NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1 = 0x8
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 = 0x9
    NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX = 0xA
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    nvmlGpuInstanceProfileInfo_v2 = 0x02000098
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
    NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
    NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
    NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
    NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
    NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
    NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE_REV1 = 0x7
    NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE_NVL = 0x8
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
    nvmlComputeInstanceProfileInfo_v2 = 0x02000088
    nvmlEventTypeSingleBitEccError = 0x1
    nvmlEventTypeDoubleBitEccError = 0x2
    nvmlEventTypeXidCriticalError = 0x8

    MAX_MIG_DEVICES: ClassVar[int] = 7
    COMPUTE_SLICES: ClassVar[int] = 7
    CI_PROFILE_SLICES: ClassVar[dict[int, int]] = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
    """CI profile index (also its id here, as on real GPUs) → compute slices."""
    NO_INSTANCE: ClassVar[int] = 0xFFFFFFFF

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        driver_version: str = "580.65.06",
        cuda_version: int = 13000,
        legacy_bytes: bool = False,
    ) -> None:
        self.gpus = default_gpus() if gpus is None else gpus
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.legacy_bytes = legacy_bytes
        self.init_error: Exception | None = None
        self.failures: dict[str, Exception] = {}
        self.wait_stall_s = 0.0
        self.stalled = threading.Event()
        """Set once a wait has begun to overrun its timeout by ``wait_stall_s``."""
        self.calls: list[tuple[str, int]] = []
        self.event_sets: list[FakeEventSet] = []
        self.initialized = 0
        self.by_id_missing = False
        self._created = 0
        self._events: queue.Queue[_PushedEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._structs: dict[tuple[int, int], _DeviceStruct] = {}

    # -- test helpers -------------------------------------------------------

    def call_names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def threads(self, *, excluding: tuple[str, ...] = ("nvmlEventSetWait_v2",)) -> set[int]:
        """Thread ids that made calls other than ``excluding``."""
        return {ident for name, ident in self.calls if name not in excluding}

    def push_event(
        self,
        gpu: int,
        *,
        xid: int = 0,
        event_type: int = nvmlEventTypeXidCriticalError,
        gi: int | None = None,
        ci: int | None = None,
        bypass_registration: bool = False,
    ) -> None:
        """Queue an event; ``nvmlEventSetWait_v2`` returns it if ``gpu`` registered its type."""
        gi_id = self.NO_INSTANCE if gi is None else gi
        ci_id = self.NO_INSTANCE if ci is None else ci
        self._events.put(_PushedEvent(gpu, event_type, xid, gi_id, ci_id, bypass_registration))

    # -- plumbing -----------------------------------------------------------

    def _record(self, name: str) -> None:
        with self._lock:
            self.calls.append((name, threading.get_ident()))
        if name in self.failures:
            raise self.failures[name]
        if name != "nvmlInit" and not self.initialized:
            raise NVMLError_Uninitialized()

    def _text(self, value: str) -> str | bytes:
        return value.encode() if self.legacy_bytes else value

    def _handle(self, gpu: int, mig: int = -1) -> Any:
        # One struct per device (kept alive here), a new pointer object per call.
        struct = self._structs.setdefault((gpu, mig), _DeviceStruct(gpu, mig))
        return ctypes.pointer(struct)

    def _resolve(self, handle: Any, call: str) -> tuple[FakeGpu, FakeMigDevice | None]:
        self._record(call)
        target = handle.contents
        gpu = self.gpus[target.gpu]
        if call in gpu.failures:
            raise gpu.failures[call]
        if gpu.lost and call not in {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"}:
            raise NVMLError_GpuIsLost()
        return gpu, (gpu.mig_devices[target.mig] if target.mig >= 0 else None)

    def _gpu(self, handle: Any, call: str) -> FakeGpu:
        gpu, mig = self._resolve(handle, call)
        if mig is not None:
            raise NVMLError_InvalidArgument()
        return gpu

    def _mig(self, handle: Any, call: str) -> FakeMigDevice:
        _, mig = self._resolve(handle, call)
        if mig is None:
            raise NVMLError_InvalidArgument()
        return mig

    def _profile(self, gpu: FakeGpu, *, index: int | None = None, id: int | None = None) -> Any:
        for profile in gpu.profiles:
            if profile.index == index or profile.id == id:
                return profile
        return None

    # -- system -------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._record("nvmlInit")
        if self.init_error is not None:
            raise self.init_error
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._record("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._record("nvmlSystemGetDriverVersion")
        return self._text(self.driver_version)

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._record("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._record("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    # -- devices ------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._record("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._record("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self._handle(index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes:
        gpu, mig = self._resolve(handle, "nvmlDeviceGetUUID")
        return self._text(gpu.uuid if mig is None else mig.uuid)

    def nvmlDeviceGetName(self, handle: Any) -> str | bytes:
        return self._text(self._gpu(handle, "nvmlDeviceGetName").name)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetMinorNumber").minor

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> MemoryInfo:
        gpu, mig = self._resolve(handle, "nvmlDeviceGetMemoryInfo")
        total = (gpu.memory_mib if mig is None else mig.memory_mib) << 20
        return MemoryInfo(total=total, free=total, used=0)

    def nvmlDeviceGetArchitecture(self, device: Any) -> int:
        return self._gpu(device, "nvmlDeviceGetArchitecture").architecture

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability").compute_capability

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != self.NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument()
        return gpu.temperature

    def nvmlDeviceGetPciInfo(self, handle: Any) -> PciInfo:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        domain, bus, rest = gpu.bus_id.split(":")
        return PciInfo(self._text(gpu.bus_id), int(domain, 16), int(bus, 16), int(rest[:2], 16))

    # -- MIG ----------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            raise NVMLError_NotSupported()
        return list(gpu.mig_mode)

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> GpuInstanceProfileInfo:
        gpu = self._gpu(device, "nvmlDeviceGetGpuInstanceProfileInfo")
        if version != 2:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if gpu.mig_mode is None:
            raise NVMLError_NotSupported()
        if not 0 <= profile < self.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError_InvalidArgument()
        if profile == self.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX:
            raise NVMLError_InvalidArgument()  # as some drivers answer for graphics profiles
        found: FakeProfile | None = self._profile(gpu, index=profile)
        if found is None:
            raise NVMLError_NotSupported()
        return self._profile_info(found)

    def nvmlDeviceGetGpuInstanceProfileInfoById(
        self, device: Any, profileId: int
    ) -> GpuInstanceProfileInfo:
        gpu = self._gpu(device, "nvmlDeviceGetGpuInstanceProfileInfoById")
        if self.by_id_missing:
            raise NVMLError_FunctionNotFound()
        if gpu.mig_mode is None:
            raise NVMLError_NotSupported()
        found: FakeProfile | None = self._profile(gpu, id=profileId)
        if found is None:
            raise NVMLError_InvalidArgument()
        return self._profile_info(found)

    def _profile_info(self, found: FakeProfile) -> GpuInstanceProfileInfo:
        return GpuInstanceProfileInfo(
            version=self.nvmlGpuInstanceProfileInfo_v2,
            id=found.id,
            isP2pSupported=0,
            sliceCount=found.slices,
            instanceCount=found.instances,
            multiprocessorCount=found.multiprocessors,
            copyEngineCount=found.copy_engines,
            decoderCount=found.decoders,
            encoderCount=found.encoders,
            jpegCount=found.jpegs,
            ofaCount=found.ofas,
            memorySizeMB=found.memory_mib,
            name=self._text(found.name),
        )

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetGpuInstancePossiblePlacements")
        found: FakeProfile | None = self._profile(gpu, id=profileId)
        if found is None:
            raise NVMLError_InvalidArgument()
        count = countRef._obj  # the c_uint that ctypes.byref() wraps
        count.value = len(found.placements)
        if placementsRef is not None:
            if len(placementsRef) < len(found.placements):
                raise NVMLError_InsufficientSize()
            for slot, (start, size) in enumerate(found.placements):
                placementsRef[slot].start, placementsRef[slot].size = start, size
        return NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
        return self.MAX_MIG_DEVICES if gpu.mig_mode is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not 0 <= index < self.MAX_MIG_DEVICES:
            raise NVMLError_InvalidArgument()
        if index >= len(gpu.mig_devices):
            raise NVMLError_NotFound()
        return self._handle(device.contents.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        return self._mig(device, "nvmlDeviceGetComputeInstanceId").ci_id

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu = self._gpu(device, "nvmlDeviceGetGpuInstanceById")
        if self._instance(gpu, gpuInstanceId) is None:
            raise NVMLError_NotFound()
        return ctypes.pointer(_GpuInstanceStruct(device.contents.gpu, gpuInstanceId))

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> c_nvmlGpuInstanceInfo_t:
        index, _, instance = self._gi(gpuInstance, "nvmlGpuInstanceGetInfo")
        info = c_nvmlGpuInstanceInfo_t(id=instance.gi_id, profileId=instance.profile_id)
        info.device = self._handle(index)
        info.placement.start, info.placement.size = instance.start, instance.size
        return info

    # -- dynamic MIG ----------------------------------------------------------

    def _instances(self, gpu: FakeGpu) -> list[FakeMigDevice | FakeGpuInstance]:
        return [*gpu.mig_devices, *gpu.empty_instances]

    def _instance(self, gpu: FakeGpu, gi_id: int) -> FakeMigDevice | FakeGpuInstance | None:
        return next((i for i in self._instances(gpu) if i.gi_id == gi_id), None)

    def _gi(self, handle: Any, call: str) -> tuple[int, FakeGpu, FakeMigDevice | FakeGpuInstance]:
        """GPU index, GPU and instance a GPU-instance handle points at (NotFound: gone)."""
        self._record(call)
        index, gi_id = handle.contents.gpu, handle.contents.gi
        gpu = self.gpus[index]
        if call in gpu.failures:
            raise gpu.failures[call]
        instance = self._instance(gpu, gi_id)
        if instance is None:
            raise NVMLError_NotFound()
        return index, gpu, instance

    def _slices(self, gpu: FakeGpu, profile_id: int) -> int:
        found: FakeProfile | None = self._profile(gpu, id=profile_id)
        return found.slices if found is not None else 0

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._record("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for index, gpu in enumerate(self.gpus):
            if gpu.uuid == text:
                return self._handle(index)
        raise NVMLError_NotFound()

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        gpu = self._gpu(device, "nvmlDeviceCreateGpuInstanceWithPlacement")
        if not hasattr(placement, "_obj"):
            raise TypeError("pass the placement as ctypes.byref(c_nvmlGpuInstancePlacement_t)")
        start, size = placement._obj.start, placement._obj.size
        if gpu.mig_mode is None or gpu.mig_mode[0] != self.NVML_DEVICE_MIG_ENABLE:
            raise NVMLError_NotSupported()
        found: FakeProfile | None = self._profile(gpu, id=profileId)
        if found is None or (start, size) not in found.placements:
            raise NVMLError_InvalidArgument()
        existing = self._instances(gpu)
        overlaps = any(i.start < start + size and start < i.start + i.size for i in existing)
        same = sum(1 for i in existing if i.profile_id == profileId)
        used = sum(self._slices(gpu, i.profile_id) for i in existing)
        if overlaps or same >= found.instances or used + found.slices > self.COMPUTE_SLICES:
            raise NVMLError_InsufficientResources()
        taken = {i.gi_id for i in existing}
        gi_id = next(i for i in range(1, len(taken) + 2) if i not in taken)
        gpu.empty_instances.append(FakeGpuInstance(gi_id, profileId, start, size))
        return ctypes.pointer(_GpuInstanceStruct(device.contents.gpu, gi_id))

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        _, gpu, instance = self._gi(gpuInstance, "nvmlGpuInstanceDestroy")
        if isinstance(instance, FakeMigDevice):
            raise NVMLError_InUse()  # its compute instance must go first
        gpu.empty_instances.remove(instance)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetGpuInstances")
        if self._profile(gpu, id=profileId) is None:
            raise NVMLError_InvalidArgument()
        found = [i for i in self._instances(gpu) if i.profile_id == profileId]
        if len(gpuInstancesRef) < len(found):
            raise NVMLError_InsufficientSize()
        for slot, instance in enumerate(found):
            gpuInstancesRef[slot] = ctypes.pointer(
                _GpuInstanceStruct(device.contents.gpu, instance.gi_id)
            )
        countRef._obj.value = len(found)
        return NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> ComputeInstanceProfileInfo:
        _, gpu, instance = self._gi(device, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        if version != 2:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if engProfile != self.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError_InvalidArgument()
        if not 0 <= profile < self.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise NVMLError_InvalidArgument()
        gi_profile: FakeProfile = self._profile(gpu, id=instance.profile_id)
        slices = self.CI_PROFILE_SLICES.get(profile, 0)
        if not slices or slices > gi_profile.slices:
            raise NVMLError_NotSupported()
        gi_name = gi_profile.name.removeprefix("MIG ")
        return ComputeInstanceProfileInfo(
            version=self.nvmlComputeInstanceProfileInfo_v2,
            id=profile,
            sliceCount=slices,
            instanceCount=gi_profile.slices // slices,
            multiprocessorCount=gi_profile.multiprocessors * slices // gi_profile.slices,
            sharedCopyEngineCount=gi_profile.copy_engines,
            sharedDecoderCount=gi_profile.decoders,
            sharedEncoderCount=gi_profile.encoders,
            sharedJpegCount=gi_profile.jpegs,
            sharedOfaCount=gi_profile.ofas,
            name=self._text(f"MIG {slices}c.{gi_name}"),
        )

    def _full_ci(self, gpu: FakeGpu, instance: FakeMigDevice | FakeGpuInstance) -> int:
        """Id of the CI profile that spans the whole GPU instance (the only one modelled)."""
        slices = self._slices(gpu, instance.profile_id)
        return next(i for i, n in self.CI_PROFILE_SLICES.items() if n == slices)

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        index, gpu, instance = self._gi(gpuInstance, "nvmlGpuInstanceCreateComputeInstance")
        if isinstance(instance, FakeMigDevice):
            raise NVMLError_InsufficientResources()  # the GI is full already
        if profileId != self._full_ci(gpu, instance):
            raise NVMLError_NotSupported()  # smaller compute instances are not modelled
        self._created += 1
        name = f"{gpu.uuid}/{instance.gi_id}/0/{self._created}"
        profile: FakeProfile = self._profile(gpu, id=instance.profile_id)
        gpu.empty_instances.remove(instance)
        gpu.mig_devices.append(
            FakeMigDevice(
                uuid=f"MIG-{uuid.uuid5(uuid.NAMESPACE_OID, name)}",
                gi_id=instance.gi_id,
                ci_id=0,
                profile_id=instance.profile_id,
                start=instance.start,
                size=instance.size,
                memory_mib=profile.memory_mib,
            )
        )
        return ctypes.pointer(_ComputeInstanceStruct(index, instance.gi_id, 0))

    def _ci(self, handle: Any, call: str) -> tuple[int, FakeGpu, FakeMigDevice]:
        self._record(call)
        index, gi_id, ci_id = handle.contents.gpu, handle.contents.gi, handle.contents.ci
        gpu = self.gpus[index]
        if call in gpu.failures:
            raise gpu.failures[call]
        for mig in gpu.mig_devices:
            if (mig.gi_id, mig.ci_id) == (gi_id, ci_id):
                return index, gpu, mig
        raise NVMLError_NotFound()

    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        index, gpu, instance = self._gi(gpuInstance, "nvmlGpuInstanceGetComputeInstances")
        if profileId not in self.CI_PROFILE_SLICES:
            raise NVMLError_InvalidArgument()
        found = isinstance(instance, FakeMigDevice) and profileId == self._full_ci(gpu, instance)
        if found:
            if len(computeInstancesRef) < 1:
                raise NVMLError_InsufficientSize()
            computeInstancesRef[0] = ctypes.pointer(
                _ComputeInstanceStruct(index, instance.gi_id, 0)
            )
        countRef._obj.value = int(found)
        return NVML_SUCCESS

    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> c_nvmlComputeInstanceInfo_t:
        index, gpu, mig = self._ci(computeInstance, "nvmlComputeInstanceGetInfo")
        info = c_nvmlComputeInstanceInfo_t(id=mig.ci_id, profileId=self._full_ci(gpu, mig))
        info.device = self._handle(index)
        info.gpuInstance = ctypes.pointer(_GpuInstanceStruct(index, mig.gi_id))
        info.placement.start, info.placement.size = 0, self._slices(gpu, mig.profile_id)
        return info

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        _, gpu, mig = self._ci(computeInstance, "nvmlComputeInstanceDestroy")
        if mig.in_use:
            raise NVMLError_InUse()
        gpu.mig_devices.remove(mig)
        gpu.empty_instances.append(FakeGpuInstance(mig.gi_id, mig.profile_id, mig.start, mig.size))
        return NVML_SUCCESS

    # -- events -------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._record("nvmlEventSetCreate")
        event_set = FakeEventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetSupportedEventTypes").event_types

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if eventTypes & ~gpu.event_types:
            raise NVMLError_NotSupported()
        eventSet.registered[handle.contents.gpu] = eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
        self._record("nvmlEventSetWait_v2")
        if eventSet.freed:
            raise NVMLError_InvalidArgument()
        if self.wait_stall_s:
            self.stalled.set()
            time.sleep(self.wait_stall_s)
        deadline = time.monotonic() + timeoutms / 1000
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                break
            mask = eventSet.registered.get(event.gpu, 0)
            if event.bypass_registration or mask & event.event_type:
                data = c_nvmlEventData_t(
                    eventType=event.event_type,
                    eventData=event.data,
                    gpuInstanceId=event.gi,
                    computeInstanceId=event.ci,
                )
                data.device = self._handle(event.gpu)
                return data
        raise NVMLError_Timeout()

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._record("nvmlEventSetFree")
        eventSet.freed = True
