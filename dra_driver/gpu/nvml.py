"""NVML GPU backend: the node's GPUs, MIG geometry and XID events, read from the driver.

This is the only module that imports ``pynvml`` (nvidia-ml-py). Tests inject a
fake with the same shape (``tests/support/fake_pynvml.py``).

Threads
    pynvml calls block, so none runs on the event loop. Every call except the
    event wait runs on ONE dedicated worker thread (a single-worker
    ThreadPoolExecutor): the session starts there lazily (``nvmlInit`` on first
    use) and ends there (``nvmlShutdown`` in :meth:`close`), and an inventory
    is never interleaved with event registration or shutdown. NVML itself is
    thread-safe; the serialisation is for our own call ordering.

    ``nvmlEventSetWait_v2`` blocks for up to ``poll_ms`` at a time, so it runs
    on a second thread of its own: on the serialised thread it would hold up
    every inventory for as long as it waits. That is safe because NVML is
    thread-safe and the event thread calls NVML only on its event set, which
    it owns from registration until :meth:`close` has joined it; only then is
    the set freed. (It also reads the MIG-device map, which an inventory
    replaces whole, never mutates.) The event thread checks a stop flag after every wait, so
    :meth:`close` takes at most about one ``poll_ms``.

What is queried when
    :meth:`inventory`: per GPU its identity, memory, architecture, versions,
    PCI bus id and MIG mode; when MIG is enabled now, the GPU-instance profiles
    with their possible placements, and the MIG devices that exist. Nothing is
    cached: each call asks NVML again (MIG devices come and go).
    :meth:`health_events`: on first use, an event set registered for XID and
    double-bit ECC events on every GPU that supports them; a double-bit ECC
    event is reported as XID 48, the XID the driver logs for it. (Single-bit
    errors are corrected by the hardware and not asked for; XID 92 reports an
    excessive rate.) An event's MIG device is found among the MIG devices the
    latest :meth:`inventory` saw. A failing wait is reported once as an event
    (xid 0) for every GPU; the streams end at :meth:`close`, or if the event
    thread dies (the caller's supervisor sees it).
    :meth:`probe`: per GPU of the latest inventory, its handle by UUID and its
    temperature: a sensor read that reaches the GPU, so one that fell off the
    bus answers ``NVMLError_GpuIsLost`` and one that needs a reset
    ``NVMLError_ResetRequired``.

Dynamic MIG
    :meth:`create_mig_device` makes a GPU instance at a placement
    (``nvmlDeviceCreateGpuInstanceWithPlacement``) and one compute instance
    over all of it (the CI profile whose slice count is the GI's, shared
    engines), then finds the new MIG device's UUID among the GPU's MIG device
    handles by GI and CI id. It is idempotent: a GPU instance of that profile
    already at that placement (``nvmlDeviceGetGpuInstances`` +
    ``nvmlGpuInstanceGetInfo``) is reused, and its compute instance created
    only if missing, so a prepare retried after a crash between the two steps
    completes. A compute instance that cannot be made takes its new GPU
    instance down with it. :meth:`destroy_mig_device` destroys the GPU
    instance's compute instances (of every CI profile), then the instance; a
    GPU instance that is gone is not an error.

Errors
    Every NVML error becomes an :class:`InventoryError` (``raise ... from``)
    naming the GPU and the call, through :meth:`NvmlGpuBackend._translated`.
    ``NVMLError_InUse`` and ``NVMLError_InsufficientResources`` from creating
    a GPU instance become :class:`MigPlacementBusyError`, naming the existing
    MIG devices the placement overlaps.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import pynvml

from dra_driver.core.errors import InventoryError, MigPlacementBusyError
from dra_driver.core.ids import GpuUUID, MigUUID
from dra_driver.core.model import (
    GpuInfo,
    HealthEvent,
    Inventory,
    MigDevice,
    MigPlacement,
    MigProfile,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_MIB: Final = 1 << 20
_NO_INSTANCE: Final = 0xFFFFFFFF
"""gpuInstanceId/computeInstanceId of an event NVML does not attribute to a MIG device."""
_ABSENT: Final = object()
"""What :meth:`NvmlGpuBackend._call` returns for a tolerated error."""
_ARCH_PREFIX: Final = "NVML_DEVICE_ARCH_"
_DBE_XID: Final = 48
"""The XID the driver logs for a double-bit ECC error (NVIDIA's XID catalog)."""
_BUS_ID = re.compile(r"^([0-9a-f]+):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")

_Subscriber = tuple[asyncio.AbstractEventLoop, asyncio.Queue[HealthEvent | None]]


def normalise_pci_bus_id(raw: str | bytes) -> str:
    """NVML's ``00000000:3B:00.0`` → sysfs's ``0000:3b:00.0`` (4+ hex digit domain, lower case)."""
    text = _text(raw).strip().lower()
    match = _BUS_ID.match(text)
    if match is None:
        log.warning("unexpected PCI bus id %r from NVML; published as is", text)
        return text
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


def _text(value: Any) -> str:
    # nvidia-ml-py decodes char arrays to str; older releases returned bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(value: int) -> str:
    """NVML's ``13000`` → ``13.0`` (major·1000 + minor·10)."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _handle_key(handle: Any) -> int | None:
    # Each pynvml call returns a new ctypes pointer object for the same device,
    # so device handles are compared by the address they hold.
    return ctypes.cast(handle, ctypes.c_void_p).value


class NvmlGpuBackend:
    """A :class:`~dra_driver.core.ports.GpuBackend` over NVML.

    ``lib`` is the ``pynvml`` module (the default) or a fake of it. ``poll_ms``
    is how long one event wait blocks, which bounds how long :meth:`close`
    waits for the event thread.
    """

    def __init__(self, lib: Any | None = None, *, poll_ms: int = 1000) -> None:
        self._lib: Any = pynvml if lib is None else lib
        self._poll_ms = poll_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._arch_names = {
            getattr(self._lib, attr): attr.removeprefix(_ARCH_PREFIX).lower()
            for attr in dir(self._lib)
            if attr.startswith(_ARCH_PREFIX) and attr != f"{_ARCH_PREFIX}UNKNOWN"
        }
        self._closed = False
        self._initialized = False  # touched on the NVML thread only
        self._mig_uuids: dict[tuple[GpuUUID, int, int], MigUUID] = {}
        self._gpu_uuids: tuple[GpuUUID, ...] = ()  # of the latest inventory
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._event_set: Any = None
        self._subscribers: list[_Subscriber] = []
        self._subscribers_lock = threading.Lock()
        self._ended = False  # no more events: closed, or the event thread failed

    @property
    def name(self) -> str:
        return "nvml"

    async def inventory(self) -> Inventory:
        return await self._on_nvml_thread(self._discover)

    async def probe(self) -> Mapping[GpuUUID, str | None]:
        """Per GPU of the latest inventory: None when it answered, else why not."""
        return await self._on_nvml_thread(self._probe)

    async def health_events(self) -> AsyncIterator[HealthEvent]:
        """XID and ECC events until :meth:`close`; several consumers each get every event."""
        queue: asyncio.Queue[HealthEvent | None] = asyncio.Queue()
        subscriber = (asyncio.get_running_loop(), queue)
        with self._subscribers_lock:
            if self._ended:
                return
            self._subscribers.append(subscriber)
        try:
            await self._on_nvml_thread(self._start_watcher)
            while (event := await queue.get()) is not None:
                yield event
        finally:
            with self._subscribers_lock:
                self._subscribers.remove(subscriber)

    async def close(self) -> None:
        """Stop the event thread, free the event set, shut NVML down; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._end_streams()
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._shutdown)
        finally:
            self._executor.shutdown(wait=True)

    # -- the serialised NVML thread ------------------------------------------

    async def _on_nvml_thread(self, job: Callable[[], T]) -> T:
        if self._closed:
            raise InventoryError("the NVML backend is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    @contextlib.contextmanager
    def _translated(
        self, where: str, call: str, *, busy: str | None = None, hint: str = ""
    ) -> Iterator[None]:
        """Turn an NVML error from ``call`` into an InventoryError that names ``where``.

        With ``busy`` (what was being made), ``InUse`` and ``InsufficientResources``
        become :class:`MigPlacementBusyError`; ``hint`` ends other messages.
        """
        lib = self._lib
        try:
            yield
        except lib.NVMLError_GpuIsLost as err:
            raise InventoryError(
                f"{where}: {call} failed: {err}: the GPU fell off the bus; it needs a GPU "
                "reset or a node reboot (look for XID 79 in the kernel log)"
            ) from err
        except (lib.NVMLError_LibraryNotFound, lib.NVMLError_DriverNotLoaded, OSError) as err:
            raise InventoryError(
                f"NVML could not be loaded ({call} failed: {err}); check the NVIDIA driver "
                "installation and --driver-root, or use --backend fake on nodes without GPUs"
            ) from err
        except (lib.NVMLError_InUse, lib.NVMLError_InsufficientResources) as err:
            if busy is None:
                raise InventoryError(f"{where}: {call} failed: {err}{hint}") from err
            raise MigPlacementBusyError(
                f"{where}: cannot create {busy}: {call} failed: {err}: the placement overlaps "
                "an existing MIG instance or the GPU has no room left for the profile"
            ) from err
        except lib.NVMLError as err:
            raise InventoryError(f"{where}: {call} failed: {err}{hint}") from err

    def _call(
        self,
        where: str,
        call: str,
        *args: Any,
        tolerate: tuple[type[Exception], ...] = (),
        busy: str | None = None,
        hint: str = "",
    ) -> Any:
        """``pynvml.<call>(*args)``; ``_ABSENT`` for an error in ``tolerate``."""
        with self._translated(where, call, busy=busy, hint=hint):
            try:
                return getattr(self._lib, call)(*args)
            except tolerate:
                return _ABSENT

    def _ensure_init(self) -> None:
        if not self._initialized:
            self._call("NVML", "nvmlInit")
            self._initialized = True

    def _discover(self) -> Inventory:
        self._ensure_init()
        driver = _text(self._call("NVML", "nvmlSystemGetDriverVersion"))
        cuda: Any = _ABSENT
        if hasattr(self._lib, "nvmlSystemGetCudaDriverVersion_v2"):
            # _v2 asks libcuda, which a container may lack; the original call does not.
            v2 = "nvmlSystemGetCudaDriverVersion_v2"
            cuda = self._call("NVML", v2, tolerate=(self._lib.NVMLError,))
        if cuda is _ABSENT:
            cuda = self._call("NVML", "nvmlSystemGetCudaDriverVersion")
        count = self._call("NVML", "nvmlDeviceGetCount")
        gpus = tuple(self._gpu(i, driver, _cuda_version(cuda)) for i in range(count))
        self._gpu_uuids = tuple(gpu.uuid for gpu in gpus)
        self._mig_uuids = {
            (gpu.uuid, mig.gi_id, mig.ci_id): mig.uuid for gpu in gpus for mig in gpu.mig_devices
        }
        return Inventory(gpus=gpus)

    def _probe(self) -> dict[GpuUUID, str | None]:
        self._ensure_init()
        if not self._gpu_uuids:
            self._discover()
        return {uuid: self._probe_gpu(uuid) for uuid in self._gpu_uuids}

    def _probe_gpu(self, uuid: GpuUUID) -> str | None:
        lib = self._lib
        unusable = (lib.NVMLError_LibraryNotFound, lib.NVMLError_DriverNotLoaded, OSError)
        try:
            handle = lib.nvmlDeviceGetHandleByUUID(uuid)
            lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)
        except (lib.NVMLError_NotSupported, lib.NVMLError_NoPermission):
            return None  # it answered, just not this question
        except lib.NVMLError_GpuIsLost as err:
            return f"{err}: it has fallen off the bus; it needs a reset or the node a reboot"
        except lib.NVMLError_ResetRequired as err:
            return f"{err}: it needs a GPU reset"
        except lib.NVMLError_NotFound:
            return "NVML no longer lists it (gone from the bus?)"
        except unusable as err:
            raise InventoryError(
                f"the GPU liveness probe cannot use NVML: {err}; check the NVIDIA driver"
            ) from err
        except lib.NVMLError as err:
            return f"nvmlDeviceGetTemperature failed: {err}"
        return None

    def _handle(self, index: int) -> tuple[Any, GpuUUID, str]:
        """The device handle, UUID and log/error prefix of GPU ``index``."""
        handle = self._call(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
        uuid = GpuUUID(_text(self._call(f"GPU {index}", "nvmlDeviceGetUUID", handle)))
        return handle, uuid, f"GPU {index} ({uuid})"

    def _gpu(self, index: int, driver: str, cuda: str) -> GpuInfo:
        lib = self._lib
        handle, uuid, where = self._handle(index)
        major, minor = self._call(where, "nvmlDeviceGetCudaComputeCapability", handle)
        unsupported = (lib.NVMLError_NotSupported,)
        arch = self._call(where, "nvmlDeviceGetArchitecture", handle, tolerate=unsupported)
        mode = self._call(where, "nvmlDeviceGetMigMode", handle, tolerate=unsupported)
        capable = mode is not _ABSENT
        current, pending = mode if capable else (lib.NVML_DEVICE_MIG_DISABLE,) * 2
        enabled = current == lib.NVML_DEVICE_MIG_ENABLE
        profiles = self._profiles(where, handle) if enabled else ()
        pci = self._call(where, "nvmlDeviceGetPciInfo", handle)
        return GpuInfo(
            index=index,
            uuid=uuid,
            product_name=_text(self._call(where, "nvmlDeviceGetName", handle)),
            memory_bytes=int(self._call(where, "nvmlDeviceGetMemoryInfo", handle).total),
            minor=int(self._call(where, "nvmlDeviceGetMinorNumber", handle)),
            architecture=self._arch_names.get(arch, "unknown"),
            cuda_compute_capability=f"{major}.{minor}",
            driver_version=driver,
            cuda_driver_version=cuda,
            pci_bus_id=normalise_pci_bus_id(pci.busId),
            mig_capable=capable,
            mig_enabled=enabled,
            mig_pending=pending == lib.NVML_DEVICE_MIG_ENABLE,
            mig_profiles=profiles,
            mig_devices=self._mig_devices(where, handle, profiles) if enabled else (),
        )

    def _profiles(self, where: str, handle: Any) -> tuple[MigProfile, ...]:
        lib = self._lib
        absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument)
        profiles = []
        first, end = lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE, lib.NVML_GPU_INSTANCE_PROFILE_COUNT
        for profile_index in range(first, end):
            call = "nvmlDeviceGetGpuInstanceProfileInfo"
            info = self._call(where, call, handle, profile_index, tolerate=absent)
            if info is _ABSENT:
                continue
            name = _text(getattr(info, "name", "")).strip().removeprefix("MIG ")
            if not name:
                log.debug("%s: MIG profile id %d has no name; skipped", where, info.id)
                continue
            placements = self._placements(where, handle, info.id)
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

    def _placements(self, where: str, handle: Any, profile_id: int) -> tuple[MigPlacement, ...]:
        # C-style call: a NULL array asks for the count, then a sized array is filled.
        call = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        self._call(where, call, handle, profile_id, None, ctypes.byref(count))
        if not count.value:
            return ()
        array = (self._lib.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(where, call, handle, profile_id, array, ctypes.byref(count))
        return tuple(MigPlacement(int(p.start), int(p.size)) for p in array[: count.value])

    def _mig_devices(
        self, where: str, handle: Any, profiles: tuple[MigProfile, ...]
    ) -> tuple[MigDevice, ...]:
        names = {profile.id: profile.name for profile in profiles}
        devices = []
        for slot in range(self._call(where, "nvmlDeviceGetMaxMigDeviceCount", handle)):
            by_index, empty = "nvmlDeviceGetMigDeviceHandleByIndex", (self._lib.NVMLError_NotFound,)
            mig = self._call(where, by_index, handle, slot, tolerate=empty)
            if mig is _ABSENT:
                continue
            uuid = MigUUID(_text(self._call(where, "nvmlDeviceGetUUID", mig)))
            mig_where = f"{where} MIG device {uuid}"
            gi_id = int(self._call(mig_where, "nvmlDeviceGetGpuInstanceId", mig))
            gi = self._call(mig_where, "nvmlDeviceGetGpuInstanceById", handle, gi_id)
            info = self._call(mig_where, "nvmlGpuInstanceGetInfo", gi)
            ci_id = int(self._call(mig_where, "nvmlDeviceGetComputeInstanceId", mig))
            memory = int(self._call(mig_where, "nvmlDeviceGetMemoryInfo", mig).total)
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
                    memory_mib=memory // _MIB,
                )
            )
        return tuple(devices)

    # -- dynamic MIG (on the NVML thread) -------------------------------------

    async def create_mig_device(
        self, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement
    ) -> MigDevice:
        return await self._on_nvml_thread(lambda: self._create_mig(gpu_uuid, profile_id, placement))

    async def destroy_mig_device(self, gpu_uuid: GpuUUID, gi_id: int) -> None:
        await self._on_nvml_thread(lambda: self._destroy_mig(gpu_uuid, gi_id))

    def _by_uuid(self, gpu_uuid: GpuUUID) -> tuple[Any, str]:
        """The handle and log/error prefix of the GPU ``gpu_uuid``."""
        self._ensure_init()
        lib = self._lib
        where = f"GPU {gpu_uuid}"
        unknown = (lib.NVMLError_NotFound, lib.NVMLError_InvalidArgument)
        handle = self._call(where, "nvmlDeviceGetHandleByUUID", gpu_uuid, tolerate=unknown)
        if handle is _ABSENT:
            raise InventoryError(f"{where}: NVML knows no GPU with that UUID on this node")
        return handle, where

    def _gi_profile(self, where: str, handle: Any, profile_id: int) -> Any:
        """NVML's GPU-instance profile info for ``profile_id``; InventoryError if unknown."""
        lib = self._lib
        absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument, lib.NVMLError_NotFound)
        info: Any = _ABSENT
        by_id = "nvmlDeviceGetGpuInstanceProfileInfoById"
        if hasattr(lib, by_id):
            missing = (lib.NVMLError_FunctionNotFound,)
            info = self._call(where, by_id, handle, profile_id, tolerate=missing + absent)
        if info is _ABSENT:  # an older driver or binding: scan the profile indices
            call = "nvmlDeviceGetGpuInstanceProfileInfo"
            first, end = lib.NVML_GPU_INSTANCE_PROFILE_1_SLICE, lib.NVML_GPU_INSTANCE_PROFILE_COUNT
            for index in range(first, end):
                found = self._call(where, call, handle, index, tolerate=absent)
                if found is not _ABSENT and int(found.id) == profile_id:
                    info = found
                    break
        if info is _ABSENT:
            raise InventoryError(
                f"{where}: NVML knows no GPU-instance profile with id {profile_id} "
                "(nvidia-smi mig -lgip lists the ids)"
            )
        return info

    def _gpu_instance_at(
        self, where: str, handle: Any, info: Any, placement: MigPlacement
    ) -> tuple[Any, int] | None:
        """The GPU instance of profile ``info`` at exactly ``placement``, with its id."""
        lib = self._lib
        count = ctypes.c_uint(0)
        array = (lib.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
        call = "nvmlDeviceGetGpuInstances"
        self._call(where, call, handle, info.id, array, ctypes.byref(count))
        for gi in array[: count.value]:
            gi_info = self._call(where, "nvmlGpuInstanceGetInfo", gi)
            if (int(gi_info.placement.start), int(gi_info.placement.size)) == (
                placement.start,
                placement.size,
            ):
                return gi, int(gi_info.id)
        return None

    def _ci_profiles(self, where: str, gi: Any) -> list[Any]:
        """Every compute-instance profile (shared engines) the GPU instance ``gi`` supports."""
        lib = self._lib
        absent = (lib.NVMLError_NotSupported, lib.NVMLError_InvalidArgument)
        shared = lib.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        call = "nvmlGpuInstanceGetComputeInstanceProfileInfo"
        first, end = (
            lib.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
            lib.NVML_COMPUTE_INSTANCE_PROFILE_COUNT,
        )
        found = (self._call(where, call, gi, i, shared, tolerate=absent) for i in range(first, end))
        return [info for info in found if info is not _ABSENT]

    def _compute_instances(self, where: str, gi: Any, ci_profile: Any) -> list[Any]:
        lib = self._lib
        count = ctypes.c_uint(0)
        array = (lib.c_nvmlComputeInstance_t * max(int(ci_profile.instanceCount), 1))()
        call = "nvmlGpuInstanceGetComputeInstances"
        self._call(where, call, gi, ci_profile.id, array, ctypes.byref(count))
        return list(array[: count.value])

    def _create_mig(self, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement) -> MigDevice:
        lib = self._lib
        handle, where = self._by_uuid(gpu_uuid)
        mode = self._call(
            where, "nvmlDeviceGetMigMode", handle, tolerate=(lib.NVMLError_NotSupported,)
        )
        if mode is _ABSENT or mode[0] != lib.NVML_DEVICE_MIG_ENABLE:
            state = "not supported" if mode is _ABSENT else "disabled"
            raise InventoryError(f"{where}: cannot create a MIG device: MIG mode is {state}")
        info = self._gi_profile(where, handle, profile_id)
        name = _text(info.name).strip().removeprefix("MIG ")
        allowed = self._placements(where, handle, profile_id)
        if placement not in allowed:
            starts = ", ".join(f"{p.start}/{p.size}" for p in allowed)
            raise InventoryError(
                f"{where}: start {placement.start} size {placement.size} is not a placement of "
                f"{name} (profile id {profile_id}); its placements (start/size): {starts}"
            )
        wanted = f"{name} at start {placement.start} (size {placement.size})"
        found = self._gpu_instance_at(where, handle, info, placement)
        if found is None:
            gi = self._new_gpu_instance(where, handle, profile_id, placement, wanted)
            gi_id = int(self._call(where, "nvmlGpuInstanceGetInfo", gi).id)
            try:
                ci_id = self._ensure_compute_instance(where, gi, info, gi_id)
            except InventoryError:
                self._undo_gpu_instance(where, gi, gi_id)
                raise
        else:
            gi, gi_id = found
            log.info("%s: GPU instance %d (%s) exists already; reusing it", where, gi_id, wanted)
            ci_id = self._ensure_compute_instance(where, gi, info, gi_id)
        uuid, memory = self._mig_device_of(where, handle, gi_id, ci_id)
        self._mig_uuids = {**self._mig_uuids, (gpu_uuid, gi_id, ci_id): uuid}
        return MigDevice(
            uuid=uuid,
            gi_id=gi_id,
            ci_id=ci_id,
            profile_id=profile_id,
            profile_name=name,
            placement=placement,
            memory_mib=memory // _MIB,
        )

    def _new_gpu_instance(
        self, where: str, handle: Any, profile_id: int, placement: MigPlacement, wanted: str
    ) -> Any:
        c_placement = self._lib.c_nvmlGpuInstancePlacement_t()
        c_placement.start, c_placement.size = placement.start, placement.size
        call = "nvmlDeviceCreateGpuInstanceWithPlacement"
        try:
            return self._call(
                where, call, handle, profile_id, ctypes.byref(c_placement), busy=wanted
            )
        except MigPlacementBusyError as err:
            in_the_way = self._overlapping(where, handle, placement)
            if not in_the_way:
                raise
            raise MigPlacementBusyError(f"{err}; in the way: {in_the_way}") from err.__cause__

    def _overlapping(self, where: str, handle: Any, placement: MigPlacement) -> str:
        """The existing MIG devices ``placement`` overlaps, for an error message ('' if unknown)."""
        try:
            devices = self._mig_devices(where, handle, ())
        except InventoryError:
            return ""
        return "; ".join(
            f"MIG device {d.uuid} (GPU instance {d.gi_id}, profile id {d.profile_id}, "
            f"start {d.placement.start} size {d.placement.size})"
            for d in devices
            if d.placement.overlaps(placement)
        )

    def _ensure_compute_instance(self, where: str, gi: Any, info: Any, gi_id: int) -> int:
        """The id of ``gi``'s compute instance over the whole GI, created if missing."""
        gi_where = f"{where} GPU instance {gi_id}"
        full = [p for p in self._ci_profiles(gi_where, gi) if p.sliceCount == info.sliceCount]
        if not full:
            raise InventoryError(
                f"{gi_where}: NVML offers no compute-instance profile with "
                f"{info.sliceCount} slices (shared engines) for it"
            )
        ci_profile = full[0]
        existing = self._compute_instances(gi_where, gi, ci_profile)
        if existing:
            ci = existing[0]
        else:
            call = "nvmlGpuInstanceCreateComputeInstance"
            ci = self._call(gi_where, call, gi, ci_profile.id)
        return int(self._call(gi_where, "nvmlComputeInstanceGetInfo", ci).id)

    def _undo_gpu_instance(self, where: str, gi: Any, gi_id: int) -> None:
        try:
            self._call(where, "nvmlGpuInstanceDestroy", gi)
        except InventoryError as err:
            log.warning("%s: GPU instance %d is left behind: %s", where, gi_id, err)

    def _mig_device_of(
        self, where: str, handle: Any, gi_id: int, ci_id: int
    ) -> tuple[MigUUID, int]:
        """UUID and memory (bytes) of the MIG device GI ``gi_id`` / CI ``ci_id``."""
        by_index, empty = "nvmlDeviceGetMigDeviceHandleByIndex", (self._lib.NVMLError_NotFound,)
        for slot in range(self._call(where, "nvmlDeviceGetMaxMigDeviceCount", handle)):
            mig = self._call(where, by_index, handle, slot, tolerate=empty)
            if mig is _ABSENT:
                continue
            if (
                int(self._call(where, "nvmlDeviceGetGpuInstanceId", mig)) == gi_id
                and int(self._call(where, "nvmlDeviceGetComputeInstanceId", mig)) == ci_id
            ):
                uuid = MigUUID(_text(self._call(where, "nvmlDeviceGetUUID", mig)))
                return uuid, int(self._call(where, "nvmlDeviceGetMemoryInfo", mig).total)
        raise InventoryError(
            f"{where}: GPU instance {gi_id} with compute instance {ci_id} exists, but NVML "
            "lists no MIG device for it"
        )

    def _destroy_mig(self, gpu_uuid: GpuUUID, gi_id: int) -> None:
        lib = self._lib
        handle, where = self._by_uuid(gpu_uuid)
        gone = (lib.NVMLError_NotFound, lib.NVMLError_InvalidArgument)
        gi = self._call(where, "nvmlDeviceGetGpuInstanceById", handle, gi_id, tolerate=gone)
        if gi is _ABSENT:
            log.info("%s: GPU instance %d does not exist; nothing to destroy", where, gi_id)
            return
        gi_where = f"{where} GPU instance {gi_id}"
        in_use = "; a process still uses it: it can go once the container has exited"
        for ci_profile in self._ci_profiles(gi_where, gi):
            for ci in self._compute_instances(gi_where, gi, ci_profile):
                call = "nvmlComputeInstanceDestroy"
                self._call(gi_where, call, ci, tolerate=(lib.NVMLError_NotFound,), hint=in_use)
        destroy = "nvmlGpuInstanceDestroy"
        self._call(gi_where, destroy, gi, tolerate=(lib.NVMLError_NotFound,), hint=in_use)
        self._mig_uuids = {
            key: uuid for key, uuid in self._mig_uuids.items() if key[:2] != (gpu_uuid, gi_id)
        }

    def _start_watcher(self) -> None:
        """Register for events and start the event thread, the first time only."""
        if self._watcher is not None:
            return
        self._ensure_init()
        event_set = self._call("NVML", "nvmlEventSetCreate")
        try:
            gpus = self._register(event_set)
        except BaseException:
            self._free_event_set(event_set)
            raise
        self._event_set = event_set
        self._watcher = threading.Thread(
            target=self._watch, args=(event_set, gpus), name="nvml-events", daemon=True
        )
        self._watcher.start()

    def _register(self, event_set: Any) -> dict[int | None, GpuUUID]:
        lib = self._lib
        wanted = lib.nvmlEventTypeXidCriticalError | lib.nvmlEventTypeDoubleBitEccError
        skip = (lib.NVMLError_NotSupported, lib.NVMLError_GpuIsLost)
        gpus: dict[int | None, GpuUUID] = {}
        for index in range(self._call("NVML", "nvmlDeviceGetCount")):
            handle, uuid, where = self._handle(index)
            supported = self._call(where, "nvmlDeviceGetSupportedEventTypes", handle, tolerate=skip)
            mask = 0 if supported is _ABSENT else wanted & supported
            register = "nvmlDeviceRegisterEvents"
            if mask and self._call(where, register, handle, mask, event_set, tolerate=skip) is None:
                gpus[_handle_key(handle)] = uuid
            else:
                log.warning("%s: XID/ECC events are not available; no health events from it", where)
        return gpus

    def _shutdown(self) -> None:
        watcher = self._watcher
        if watcher is not None:
            watcher.join(2 * self._poll_ms / 1000 + 0.5)
            if watcher.is_alive():
                log.warning("the NVML event thread did not stop; its event set is left allocated")
            else:
                self._free_event_set(self._event_set)
        if self._initialized:
            self._initialized = False
            self._call("NVML", "nvmlShutdown")

    def _free_event_set(self, event_set: Any) -> None:
        try:
            self._lib.nvmlEventSetFree(event_set)
        except self._lib.NVMLError as err:
            log.warning("nvmlEventSetFree failed: %s", err)

    # -- the event thread ---------------------------------------------------

    def _watch(self, event_set: Any, gpus: dict[int | None, GpuUUID]) -> None:
        lib = self._lib
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    data = lib.nvmlEventSetWait_v2(event_set, self._poll_ms)
                except lib.NVMLError_Timeout:
                    failing = False
                    continue
                except lib.NVMLError as err:
                    # As NVIDIA's device plugin does: a failing wait makes every GPU suspect.
                    if not failing:
                        log.error("nvmlEventSetWait_v2 failed: %s; reporting every GPU", err)
                        message = f"NVML event wait failed: {err}"
                        for gpu in gpus.values():
                            self._publish(HealthEvent(gpu_uuid=gpu, xid=0, message=message))
                    failing = True
                    self._stop.wait(self._poll_ms / 1000)
                    continue
                failing = False
                uuid = gpus.get(_handle_key(data.device))
                if uuid is None:
                    log.warning("NVML event for a device we did not register; ignored")
                    continue
                event = self._health_event(uuid, data)
                if event is not None:
                    self._publish(event)
        except Exception:
            log.exception("the NVML event thread failed; no more health events")
        finally:
            self._end_streams()

    def _health_event(self, uuid: GpuUUID, data: Any) -> HealthEvent | None:
        lib = self._lib
        if data.eventType & lib.nvmlEventTypeXidCriticalError:
            xid, message = int(data.eventData), f"XID {int(data.eventData)}"
        elif data.eventType & lib.nvmlEventTypeDoubleBitEccError:
            xid, message = _DBE_XID, "double-bit ECC error"
        else:
            log.debug("GPU %s: NVML event type %#x ignored", uuid, data.eventType)
            return None
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        mig = None
        if gi != _NO_INSTANCE:
            # The MIG devices of that GPU instance (any, when no compute instance is named).
            found = [
                mig_uuid
                for (gpu, gi_id, ci_id), mig_uuid in self._mig_uuids.items()
                if gpu == uuid and gi_id == gi and ci in (ci_id, _NO_INSTANCE)
            ]
            mig = found[0] if len(found) == 1 else None
        return HealthEvent(gpu_uuid=uuid, xid=xid, message=message, mig_uuid=mig)

    def _end_streams(self) -> None:
        """End every consumer's stream, and those of consumers yet to come."""
        with self._subscribers_lock:
            self._ended = True
        self._publish(None)

    def _publish(self, item: HealthEvent | None) -> None:
        """Hand ``item`` to every consumer's loop (from any thread); None ends their streams."""
        with self._subscribers_lock:
            subscribers = list(self._subscribers)
        for loop, queue in subscribers:
            with contextlib.suppress(RuntimeError):  # that consumer's loop has closed
                loop.call_soon_threadsafe(queue.put_nowait, item)
