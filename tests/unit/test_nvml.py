"""The NVML backend against a fake pynvml: inventory, threads, errors, health events."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pynvml
import pytest

from dra_driver.base.errors import InventoryError, MigPlacementBusyError
from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.model import (
    GpuInfo,
    HealthEvent,
    Inventory,
    MigDevice,
    MigPlacement,
    MigProfile,
)
from dra_driver.gpu.nvml import NvmlGpuBackend, normalise_pci_bus_id
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeNvml

T = TypeVar("T")

H100_0 = GpuUUID("GPU-5ed1b7c8-4f1a-6b2e-9c3d-1a2b3c4d5e6f")
H100_1 = GpuUUID("GPU-9a8b7c6d-5e4f-3a2b-1c0d-ffeeddccbbaa")
A100 = GpuUUID("GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
MIG_3G = MigUUID("MIG-7c1e0f5a-2b3d-5e6f-8a9b-0c1d2e3f4a5b")
MIB = 1 << 20


def _places(size: int, *starts: int) -> tuple[MigPlacement, ...]:
    return tuple(MigPlacement(start, size) for start in starts)


# Written out by hand from nvidia-smi's H100 table, not derived from the fake's data.
H100_PROFILES = (
    MigProfile(19, "1g.10gb", 1, 9856, 16, 1, 1, 0, 1, 0, _places(1, 0, 1, 2, 3, 4, 5, 6)),
    MigProfile(14, "2g.20gb", 2, 19968, 32, 2, 2, 0, 2, 0, _places(2, 0, 2, 4)),
    MigProfile(9, "3g.40gb", 3, 40192, 60, 3, 3, 0, 3, 0, _places(4, 0, 4)),
    MigProfile(5, "4g.40gb", 4, 40192, 64, 4, 4, 0, 4, 0, _places(4, 0)),
    MigProfile(0, "7g.80gb", 7, 80896, 132, 8, 7, 0, 7, 1, _places(8, 0)),
    MigProfile(20, "1g.10gb+me", 1, 9856, 16, 1, 1, 0, 1, 1, _places(1, 0, 1, 2, 3, 4, 5, 6)),
    MigProfile(15, "1g.20gb", 1, 19968, 26, 1, 1, 0, 1, 0, _places(2, 0, 2, 4, 6)),
)
DRIVER, CUDA = "580.65.06", "13.0"
EXPECTED = Inventory(
    gpus=(
        GpuInfo(
            index=0,
            uuid=H100_0,
            product_name="NVIDIA H100 80GB HBM3",
            memory_bytes=81559 * MIB,
            minor=0,
            architecture="hopper",
            cuda_compute_capability="9.0",
            pci_bus_id="0000:18:00.0",
            mig_capable=True,
            mig_enabled=True,
            mig_pending=True,
            mig_profiles=H100_PROFILES,
            mig_devices=(MigDevice(MIG_3G, 2, 0, 9, "3g.40gb", MigPlacement(0, 4), 40192),),
            driver_version=DRIVER,
            cuda_driver_version=CUDA,
        ),
        GpuInfo(
            index=1,
            uuid=H100_1,
            product_name="NVIDIA H100 80GB HBM3",
            memory_bytes=81559 * MIB,
            minor=1,
            architecture="hopper",
            cuda_compute_capability="9.0",
            pci_bus_id="0000:3b:00.0",
            mig_capable=True,
            driver_version=DRIVER,
            cuda_driver_version=CUDA,
        ),
        GpuInfo(
            index=2,
            uuid=A100,
            product_name="NVIDIA A100-SXM4-40GB",
            memory_bytes=40960 * MIB,
            minor=2,
            architecture="ampere",
            cuda_compute_capability="8.0",
            pci_bus_id="0000:86:00.0",
            mig_capable=True,
            driver_version=DRIVER,
            cuda_driver_version=CUDA,
        ),
    )
)


def scenario(
    fake: FakeNvml, body: Callable[[NvmlGpuBackend], Awaitable[T]], poll_ms: int = 50
) -> T:
    """Run ``body`` with a backend over ``fake`` on a fresh loop, closing the backend after."""

    async def main() -> T:
        backend = NvmlGpuBackend(fake, poll_ms=poll_ms)
        try:
            return await body(backend)
        finally:
            await backend.close()

    return asyncio.run(main())


def inventory(fake: FakeNvml) -> Inventory:
    return scenario(fake, lambda backend: backend.inventory())


async def next_event(events: AsyncIterator[HealthEvent]) -> HealthEvent:
    return await asyncio.wait_for(anext(events), 2)


# -- the fake itself -------------------------------------------------------------


def test_fake_matches_the_real_pynvml() -> None:
    """Names, parameters, constants and struct fields as nvidia-ml-py has them."""
    for name, value in vars(FakeNvml).items():
        if name.startswith("nvml") and callable(value):
            real = inspect.signature(getattr(pynvml, name)).parameters
            assert list(inspect.signature(value).parameters)[1:] == list(real), name
        elif name.startswith(("NVML_", "nvml")):
            assert getattr(pynvml, name) == value, name
        elif name.startswith("NVMLError_"):
            assert getattr(pynvml, name)().value == value().value, name
    for struct in ("c_nvmlGpuInstancePlacement_t", "c_nvmlGpuInstanceInfo_t", "c_nvmlEventData_t"):
        fields = [f[0] for f in getattr(fake_pynvml, struct)._fields_]
        assert fields == [f[0] for f in getattr(pynvml, struct)._fields_], struct
    for fake_struct, real_struct in [
        (fake_pynvml.GpuInstanceProfileInfo, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t),
        (fake_pynvml.MemoryInfo, pynvml.c_nvmlMemory_t),
        (fake_pynvml.PciInfo, pynvml.nvmlPciInfo_t),
    ]:
        real_fields = [f[0] for f in real_struct._fields_]
        assert set(inspect.get_annotations(fake_struct)) <= set(real_fields), fake_struct


# -- inventory ----------------------------------------------------------------


@pytest.mark.parametrize("legacy_bytes", [False, True], ids=["str", "bytes"])
def test_inventory_of_the_node(legacy_bytes: bool) -> None:
    assert inventory(FakeNvml(legacy_bytes=legacy_bytes)) == EXPECTED


def test_name_and_lazy_init() -> None:
    fake = FakeNvml()
    backend = NvmlGpuBackend(fake)
    assert backend.name == "nvml"
    assert fake.calls == []  # nothing before first use
    asyncio.run(backend.close())
    assert fake.calls == []  # never initialised, so no nvmlShutdown either


def test_every_call_but_the_wait_runs_on_one_thread_off_the_loop() -> None:
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> int:
        await asyncio.gather(backend.inventory(), backend.inventory())
        events = backend.health_events()
        fake.push_event(1, xid=79)
        await next_event(events)
        return threading.get_ident()

    loop_thread = scenario(fake, body)
    (nvml_thread,) = fake.threads()
    assert nvml_thread != loop_thread
    names = fake.call_names()
    assert names.count("nvmlInit") == 1
    assert names[0] == "nvmlInit"
    assert names[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]
    (wait_thread,) = {i for name, i in fake.calls if name == "nvmlEventSetWait_v2"}
    assert wait_thread not in {nvml_thread, loop_thread}
    alive = {thread.ident for thread in threading.enumerate()}
    assert not alive & {nvml_thread, wait_thread}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        (b"00000000:3B:00.0", "0000:3b:00.0"),
        ("00010000:01:00.1", "10000:01:00.1"),
        ("0000:af:00.0", "0000:af:00.0"),
        ("not-a-bus-id", "not-a-bus-id"),
    ],
)
def test_pci_bus_id_is_normalised(raw: str | bytes, expected: str) -> None:
    assert normalise_pci_bus_id(raw) == expected


@pytest.mark.parametrize(
    ("v2_fails", "value", "expected"),
    [(False, 13000, "13.0"), (False, 12020, "12.2"), (True, 12080, "12.8")],
)
def test_cuda_driver_version(v2_fails: bool, value: int, expected: str) -> None:
    fake = FakeNvml(cuda_version=value)
    if v2_fails:  # libcuda missing in the container: the original call answers
        fake.failures["nvmlSystemGetCudaDriverVersion_v2"] = fake.NVMLError_LibraryNotFound()
    assert inventory(fake).gpus[0].cuda_driver_version == expected
    assert ("nvmlSystemGetCudaDriverVersion" in fake.call_names()) == v2_fails


def test_mig_mode_not_supported_and_pending() -> None:
    fake = FakeNvml()
    fake.gpus[1].mig_mode = (0, 1)
    fake.gpus[2].mig_mode = None
    _, h100, a100 = inventory(fake).gpus
    assert (h100.mig_capable, h100.mig_enabled, h100.mig_pending) == (True, False, True)
    assert (a100.mig_capable, a100.mig_enabled, a100.mig_pending) == (False, False, False)
    assert a100.mig_profiles == h100.mig_profiles == ()


@pytest.mark.parametrize("how", ["unknown-value", "not-supported"])
def test_unknown_architecture(how: str) -> None:
    fake = FakeNvml()
    if how == "unknown-value":
        fake.gpus[2].architecture = fake.NVML_DEVICE_ARCH_UNKNOWN
    else:
        fake.failures["nvmlDeviceGetArchitecture"] = fake.NVMLError_NotSupported()
    assert inventory(fake).gpus[2].architecture == "unknown"


def test_profiles_without_name_or_placements_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml()
    profiles = {p.id: p for p in fake.gpus[0].profiles}
    profiles[19].name = ""
    profiles[9].placements = ()
    with caplog.at_level(logging.DEBUG, "dra_driver.gpu.nvml"):
        gpu = inventory(fake).gpus[0]
    assert [p.name for p in gpu.mig_profiles] == [
        "2g.20gb", "4g.40gb", "7g.80gb", "1g.10gb+me", "1g.20gb",
    ]  # fmt: skip
    # The existing 3g.40gb instance is still reported: it occupies its placement.
    (mig,) = gpu.mig_devices
    assert (mig.profile_id, mig.profile_name, mig.placement) == (9, "", MigPlacement(0, 4))
    assert "profile 3g.40gb has no placements" in caplog.text
    assert "profile id 19 has no name" in caplog.text
    assert "profile id 9 is unknown" in caplog.text


# -- errors -------------------------------------------------------------------


def test_lost_gpu_names_the_gpu_and_the_bus() -> None:
    fake = FakeNvml()
    fake.gpus[1].lost = True
    with pytest.raises(InventoryError) as caught:
        inventory(fake)
    message = str(caught.value)
    assert message.startswith(f"GPU 1 ({H100_1}): nvmlDeviceGetCudaComputeCapability failed")
    assert "fell off the bus" in message
    assert isinstance(caught.value.__cause__, fake.NVMLError_GpuIsLost)


@pytest.mark.parametrize(
    "error",
    [
        fake_pynvml.NVMLError_LibraryNotFound(),
        fake_pynvml.NVMLError_DriverNotLoaded(),
        OSError("libnvidia-ml.so.1: cannot open shared object file"),
    ],
    ids=["library-not-found", "driver-not-loaded", "os-error"],
)
def test_nvml_that_cannot_load_points_at_the_fix(error: Exception) -> None:
    fake = FakeNvml()
    fake.init_error = error
    with pytest.raises(InventoryError) as caught:
        inventory(fake)
    message = str(caught.value)
    assert message.startswith("NVML could not be loaded (nvmlInit failed: ")
    assert "--driver-root" in message
    assert "--backend fake" in message
    assert caught.value.__cause__ is error
    assert fake.call_names() == ["nvmlInit"]  # no nvmlShutdown for a session never started


def test_other_errors_name_the_gpu_call_and_nvml_message() -> None:
    fake = FakeNvml()
    fake.failures["nvmlDeviceGetMemoryInfo"] = fake.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(InventoryError, match=r"^GPU 0 ") as caught:
        inventory(fake)
    assert str(caught.value) == f"GPU 0 ({H100_0}): nvmlDeviceGetMemoryInfo failed: Unknown Error"


def test_closed_backend_refuses_work() -> None:
    async def body() -> list[HealthEvent]:
        backend = NvmlGpuBackend(FakeNvml())
        await backend.close()
        await backend.close()  # idempotent
        with pytest.raises(InventoryError, match="closed"):
            await backend.inventory()
        return [event async for event in backend.health_events()]

    assert asyncio.run(body()) == []


# -- health events ---------------------------------------------------------------


def test_xid_event_reaches_every_consumer() -> None:
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> list[HealthEvent]:
        first, second = backend.health_events(), backend.health_events()
        both = asyncio.gather(next_event(first), next_event(second))
        await asyncio.sleep(0.05)  # both have subscribed
        fake.push_event(1, xid=79)
        return list(await both)

    expected = HealthEvent(gpu_uuid=H100_1, xid=79, message="XID 79")
    assert scenario(fake, body) == [expected, expected]


@pytest.mark.parametrize(
    ("gi", "ci", "mig"),
    [(2, 0, MIG_3G), (2, None, MIG_3G), (5, 0, None), (None, None, None)],
    ids=["gi-ci", "gi-only", "unknown-gi", "whole-gpu"],
)
def test_event_attributed_to_a_mig_device(
    gi: int | None, ci: int | None, mig: MigUUID | None
) -> None:
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> HealthEvent:
        await backend.inventory()  # the MIG devices an event is matched against
        events = backend.health_events()
        fake.push_event(0, xid=43, gi=gi, ci=ci)
        return await next_event(events)

    assert scenario(fake, body) == HealthEvent(H100_0, 43, "XID 43", mig_uuid=mig)


def test_ecc_events() -> None:
    """A double-bit error is XID 48; single-bit ones are not asked for (hardware-corrected)."""
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> list[HealthEvent]:
        events = backend.health_events()
        fake.push_event(2, event_type=fake.nvmlEventTypeSingleBitEccError)
        fake.push_event(2, event_type=fake.nvmlEventTypeDoubleBitEccError)
        return [await next_event(events)]

    assert scenario(fake, body) == [HealthEvent(A100, 48, "double-bit ECC error")]
    masks = set(fake.event_sets[0].registered.values())
    assert masks == {fake.nvmlEventTypeXidCriticalError | fake.nvmlEventTypeDoubleBitEccError}


@pytest.mark.parametrize("why", ["no-event-types", "register-not-supported", "lost"])
def test_gpus_without_events_are_skipped(why: str, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml()
    if why == "no-event-types":
        fake.gpus[2].event_types = 0
    elif why == "register-not-supported":
        fake.gpus[2].failures["nvmlDeviceRegisterEvents"] = fake.NVMLError_NotSupported()
    else:
        fake.gpus[2].lost = True

    async def body(backend: NvmlGpuBackend) -> HealthEvent:
        events = backend.health_events()
        fake.push_event(2, xid=31, bypass_registration=True)  # NVML would not deliver it
        fake.push_event(0, xid=48)
        return await next_event(events)

    with caplog.at_level(logging.WARNING, "dra_driver.gpu.nvml"):
        event = scenario(fake, body)
    assert event == HealthEvent(H100_0, 48, "XID 48")
    assert set(fake.event_sets[0].registered) == {0, 1}
    assert f"GPU 2 ({A100}): XID/ECC events are not available" in caplog.text
    assert "a device we did not register" in caplog.text


def test_failing_wait_reports_every_gpu_once() -> None:
    fake = FakeNvml()
    fake.failures["nvmlEventSetWait_v2"] = fake.NVMLError_GpuIsLost()

    async def body(backend: NvmlGpuBackend) -> list[HealthEvent]:
        events = backend.health_events()
        reported = [await next_event(events) for _ in range(3)]
        await asyncio.sleep(0.2)  # several more failed waits, reported no more
        del fake.failures["nvmlEventSetWait_v2"]
        fake.push_event(1, xid=79)
        return [*reported, await next_event(events)]

    message = "NVML event wait failed: GPU is lost"
    assert scenario(fake, body) == [
        HealthEvent(H100_0, 0, message),
        HealthEvent(H100_1, 0, message),
        HealthEvent(A100, 0, message),
        HealthEvent(H100_1, 79, "XID 79"),
    ]


def test_event_thread_crash_ends_the_streams(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml()
    fake.failures["nvmlEventSetWait_v2"] = RuntimeError("a bug")

    async def body(backend: NvmlGpuBackend) -> tuple[list[HealthEvent], list[HealthEvent]]:
        before = [event async for event in backend.health_events()]
        after = [event async for event in backend.health_events()]  # the thread is gone
        return before, after

    assert scenario(fake, body) == ([], [])
    assert "the NVML event thread failed" in caplog.text


def test_registration_failure_frees_the_event_set() -> None:
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> None:
        await backend.inventory()
        fake.failures["nvmlDeviceGetCount"] = fake.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(InventoryError, match="NVML: nvmlDeviceGetCount failed"):
            await anext(backend.health_events())

    scenario(fake, body)
    (event_set,) = fake.event_sets
    assert event_set.freed


def test_close_is_prompt_and_releases_everything(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml()
    fake.failures["nvmlEventSetFree"] = fake.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN)

    async def body() -> tuple[float, HealthEvent | None]:
        backend = NvmlGpuBackend(fake)  # the real poll interval, 1 s
        events = backend.health_events()
        fake.push_event(1, xid=79)
        await next_event(events)
        pending = asyncio.ensure_future(anext(events, None))
        await asyncio.sleep(0.05)  # the event thread is inside a wait
        started = time.monotonic()
        await backend.close()
        elapsed = time.monotonic() - started
        return elapsed, await asyncio.wait_for(pending, 1)

    elapsed, last = asyncio.run(body())
    assert elapsed < 2
    assert last is None  # the consumer's stream ended
    assert fake.initialized == 0
    assert fake.call_names()[-2:] == ["nvmlEventSetFree", "nvmlShutdown"]
    assert "nvmlEventSetFree failed: Unknown Error" in caplog.text


def test_close_leaves_the_set_of_a_stuck_event_thread(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> None:
        events = backend.health_events()
        fake.push_event(0, xid=79)
        await next_event(events)
        fake.wait_stall_s = 1.0  # the next wait overruns its timeout
        assert await asyncio.to_thread(fake.stalled.wait, 2)

    scenario(fake, body, poll_ms=10)
    assert not fake.event_sets[0].freed
    assert fake.call_names()[-1] == "nvmlShutdown"
    assert "the NVML event thread did not stop" in caplog.text


# -- dynamic MIG ----------------------------------------------------------------

P_1G, P_2G, P_3G = 19, 14, 9  # GPU-instance profile ids of the fake H100


def test_fake_mig_structs_match_the_real_pynvml() -> None:
    for struct in ("c_nvmlComputeInstanceInfo_t", "c_nvmlComputeInstancePlacement_t"):
        fields = [f[0] for f in getattr(fake_pynvml, struct)._fields_]
        assert fields == [f[0] for f in getattr(pynvml, struct)._fields_], struct
    real = [f[0] for f in pynvml.c_nvmlComputeInstanceProfileInfo_v2_t._fields_]
    assert list(inspect.get_annotations(fake_pynvml.ComputeInstanceProfileInfo)) == real


def create(
    fake: FakeNvml, profile_id: int, start: int, size: int, gpu: GpuUUID = H100_0
) -> tuple[MigDevice, Inventory]:
    async def body(backend: NvmlGpuBackend) -> tuple[MigDevice, Inventory]:
        device = await backend.create_mig_device(gpu, profile_id, MigPlacement(start, size))
        return device, await backend.inventory()

    return scenario(fake, body)


def destroy(fake: FakeNvml, gi_id: int, gpu: GpuUUID = H100_0) -> Inventory:
    async def body(backend: NvmlGpuBackend) -> Inventory:
        await backend.destroy_mig_device(gpu, gi_id)
        return await backend.inventory()

    return scenario(fake, body)


def test_create_makes_a_gpu_and_a_compute_instance() -> None:
    fake = FakeNvml()
    device, inv = create(fake, P_1G, 4, 1)
    (made,) = fake.gpus[0].mig_devices[1:]
    assert device == MigDevice(
        MigUUID(made.uuid), 1, 0, P_1G, "1g.10gb", MigPlacement(4, 1), 9856
    )  # GI id 1: the lowest free one (the 3g.40gb has 2)
    assert inv.gpus[0].mig_devices == (EXPECTED.gpus[0].mig_devices[0], device)
    assert not fake.gpus[0].empty_instances
    assert len(fake.threads()) == 1
    assert fake.call_names().count("nvmlDeviceCreateGpuInstanceWithPlacement") == 1


def test_create_is_idempotent() -> None:
    fake = FakeNvml()

    async def body(backend: NvmlGpuBackend) -> list[MigDevice]:
        place = MigPlacement(4, 2)
        return [await backend.create_mig_device(H100_0, P_2G, place) for _ in range(2)]

    first, again = scenario(fake, body)
    assert first == again
    assert fake.call_names().count("nvmlDeviceCreateGpuInstanceWithPlacement") == 1
    assert fake.call_names().count("nvmlGpuInstanceCreateComputeInstance") == 1
    # The pre-existing 3g.40gb at 0 is "created" too: found, not made again.
    existing, _ = create(fake, P_3G, 0, 4)
    assert existing == EXPECTED.gpus[0].mig_devices[0]


def test_create_completes_a_gpu_instance_left_without_compute_instance() -> None:
    fake = FakeNvml()
    fake.gpus[0].empty_instances.append(fake_pynvml.FakeGpuInstance(5, P_1G, 6, 1))
    device, inv = create(fake, P_1G, 6, 1)
    assert (device.gi_id, device.ci_id, device.placement) == (5, 0, MigPlacement(6, 1))
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in fake.call_names()
    assert device in inv.gpus[0].mig_devices


def test_profile_found_by_scanning_without_the_by_id_call() -> None:
    fake = FakeNvml()
    fake.by_id_missing = True
    device, _ = create(fake, P_2G, 4, 2)
    assert device.profile_name == "2g.20gb"
    assert "nvmlDeviceGetGpuInstanceProfileInfo" in fake.call_names()


def test_overlapping_placement_is_busy_and_names_what_is_in_the_way() -> None:
    fake = FakeNvml()
    with pytest.raises(MigPlacementBusyError) as caught:
        create(fake, P_2G, 2, 2)  # memory slices 2-3, inside the 3g.40gb at 0-3
    message = str(caught.value)
    assert "2g.20gb at start 2 (size 2)" in message
    assert f"{MIG_3G} (GPU instance 2" in message
    assert isinstance(caught.value.__cause__, fake_pynvml.NVMLError_InsufficientResources)
    assert fake.gpus[0].empty_instances == []


@pytest.mark.parametrize(
    "error",
    [fake_pynvml.NVMLError_InUse(), fake_pynvml.NVMLError_InsufficientResources()],
    ids=["in-use", "insufficient-resources"],
)
def test_nvml_busy_errors_become_placement_busy(error: Exception) -> None:
    fake = FakeNvml()
    fake.failures["nvmlDeviceCreateGpuInstanceWithPlacement"] = error
    with pytest.raises(MigPlacementBusyError, match=r"1g\.10gb at start 6") as caught:
        create(fake, P_1G, 6, 1)
    assert caught.value.__cause__ is error


@pytest.mark.parametrize(
    ("gpu", "profile_id", "start", "size", "fragment"),
    [
        (H100_0, P_1G, 7, 1, "not a placement of 1g.10gb .*: 0/1, 1/1, 2/1"),
        (H100_0, 99, 0, 1, "no GPU-instance profile with id 99"),
        (H100_1, P_1G, 0, 1, "MIG mode is disabled"),
        (GpuUUID("GPU-nope"), P_1G, 0, 1, "GPU GPU-nope: NVML knows no GPU"),
    ],
    ids=["bad-placement", "unknown-profile", "mig-off", "unknown-gpu"],
)
def test_create_refusals(
    gpu: GpuUUID, profile_id: int, start: int, size: int, fragment: str
) -> None:
    with pytest.raises(InventoryError, match=fragment) as caught:
        create(FakeNvml(), profile_id, start, size, gpu)
    assert not isinstance(caught.value, MigPlacementBusyError)


def test_failed_compute_instance_takes_its_new_gpu_instance_down() -> None:
    fake = FakeNvml()
    failure = fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN)
    fake.gpus[0].failures["nvmlGpuInstanceCreateComputeInstance"] = failure
    with pytest.raises(
        InventoryError, match="GPU instance 1: nvmlGpuInstanceCreateComputeInstance"
    ):
        create(fake, P_1G, 4, 1)
    assert fake.gpus[0].empty_instances == []
    assert "nvmlGpuInstanceDestroy" in fake.call_names()


def test_destroy_removes_the_device() -> None:
    fake = FakeNvml()
    device, _ = create(fake, P_1G, 4, 1)
    inv = destroy(fake, device.gi_id)
    assert inv.gpus[0].mig_devices == EXPECTED.gpus[0].mig_devices
    assert fake.gpus[0].empty_instances == []
    inv = destroy(fake, 2)  # the pre-existing one
    assert inv.gpus[0].mig_devices == ()


def test_destroy_of_a_gpu_instance_without_compute_instance() -> None:
    fake = FakeNvml()
    fake.gpus[0].empty_instances.append(fake_pynvml.FakeGpuInstance(5, P_1G, 6, 1))
    destroy(fake, 5)
    assert fake.gpus[0].empty_instances == []


def test_destroy_unknown_gpu_instance_is_a_no_op() -> None:
    fake = FakeNvml()
    assert destroy(fake, 6) == EXPECTED
    assert "nvmlGpuInstanceDestroy" not in fake.call_names()


def test_destroy_refused_while_in_use() -> None:
    fake = FakeNvml()
    fake.gpus[0].mig_devices[0].in_use = True
    with pytest.raises(InventoryError, match="In use by another client; a process still uses it"):
        destroy(fake, 2)
    assert len(fake.gpus[0].mig_devices) == 1


def test_destroy_of_unknown_gpu_is_an_error() -> None:
    with pytest.raises(InventoryError, match="NVML knows no GPU"):
        destroy(FakeNvml(), 1, GpuUUID("GPU-nope"))
