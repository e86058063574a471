"""The backends' liveness probes: NVML against the pynvml-shaped fake, and the fake backend."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

import pytest

from dra_driver.base.errors import InventoryError
from dra_driver.base.ids import GpuUUID
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.gpu.nvml import NvmlGpuBackend
from tests.support import fake_pynvml
from tests.support.fake_pynvml import FakeNvml

H100_0 = GpuUUID("GPU-5ed1b7c8-4f1a-6b2e-9c3d-1a2b3c4d5e6f")
H100_1 = GpuUUID("GPU-9a8b7c6d-5e4f-3a2b-1c0d-ffeeddccbbaa")
A100 = GpuUUID("GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")


def nvml_probe(fake: FakeNvml, *, discover_first: bool = True) -> Mapping[GpuUUID, str | None]:
    async def main() -> Mapping[GpuUUID, str | None]:
        backend = NvmlGpuBackend(fake, poll_ms=50)
        try:
            if discover_first:
                await backend.inventory()
            return await backend.probe()
        finally:
            await backend.close()

    return asyncio.run(main())


def test_every_gpu_answers() -> None:
    fake = FakeNvml()
    assert nvml_probe(fake) == {H100_0: None, H100_1: None, A100: None}
    probes = [name for name in fake.call_names() if name == "nvmlDeviceGetTemperature"]
    assert len(probes) == 3


def test_lost_gpu_is_named_with_why() -> None:
    fake = FakeNvml()

    async def main() -> Mapping[GpuUUID, str | None]:
        backend = NvmlGpuBackend(fake, poll_ms=50)
        try:
            await backend.inventory()
            fake.gpus[1].lost = True
            # Discovery now fails on the lost GPU; the probe knows it from the last one.
            with pytest.raises(InventoryError, match="fell off the bus"):
                await backend.inventory()
            return await backend.probe()
        finally:
            await backend.close()

    result = asyncio.run(main())
    assert result[H100_0] is None and result[A100] is None
    lost = result[H100_1]
    assert lost is not None and lost.startswith("GPU is lost: it has fallen off the bus")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (fake_pynvml.NVMLError_ResetRequired(), "GPU requires restart: it needs a GPU reset"),
        (fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_UNKNOWN), "nvmlDeviceGetTemperature failed"),
        (fake_pynvml.NVMLError_NotSupported(), None),  # it answered, just not this
        (fake_pynvml.NVMLError_NoPermission(), None),
    ],
    ids=["reset-required", "unknown", "not-supported", "no-permission"],
)
def test_probe_errors(error: Exception, expected: str | None) -> None:
    fake = FakeNvml()
    fake.gpus[2].failures["nvmlDeviceGetTemperature"] = error
    result = nvml_probe(fake)[A100]
    if expected is None:
        assert result is None
    else:
        assert result is not None and result.startswith(expected)


def test_gpu_nvml_no_longer_lists() -> None:
    fake = FakeNvml()

    async def main() -> Mapping[GpuUUID, str | None]:
        backend = NvmlGpuBackend(fake, poll_ms=50)
        try:
            await backend.inventory()
            fake.gpus[2].uuid = "GPU-somebody-else"
            return await backend.probe()
        finally:
            await backend.close()

    assert asyncio.run(main())[A100] == "NVML no longer lists it (gone from the bus?)"


def test_probe_before_any_inventory_discovers_first() -> None:
    fake = FakeNvml()
    assert set(nvml_probe(fake, discover_first=False)) == {H100_0, H100_1, A100}
    assert "nvmlDeviceGetCount" in fake.call_names()


def test_unusable_nvml_fails_the_whole_probe() -> None:
    fake = FakeNvml()

    async def main() -> None:
        backend = NvmlGpuBackend(fake, poll_ms=50)
        try:
            await backend.inventory()
            fake.failures["nvmlDeviceGetHandleByUUID"] = fake_pynvml.NVMLError_DriverNotLoaded()
            await backend.probe()
        finally:
            await backend.close()

    with pytest.raises(InventoryError, match="liveness probe cannot use NVML: Driver Not Loaded"):
        asyncio.run(main())


def test_probe_runs_on_the_nvml_thread_off_the_loop() -> None:
    fake = FakeNvml()
    loop_thread: list[int] = []

    async def main() -> None:
        loop_thread.append(threading.get_ident())
        backend = NvmlGpuBackend(fake, poll_ms=50)
        try:
            await backend.inventory()
            await backend.probe()
        finally:
            await backend.close()

    asyncio.run(main())
    (nvml_thread,) = fake.threads()
    assert nvml_thread != loop_thread[0]


# --- the fake backend -------------------------------------------------------------------


def test_fake_backend_lost_restored_and_reset() -> None:
    async def main() -> list[Mapping[GpuUUID, str | None]]:
        backend = FakeGpuBackend("h100-80gb:2", "node-a")
        seen = [await backend.probe()]
        lost = backend.mark_lost(1)
        seen.append(await backend.probe())
        assert backend.restore(1) == lost
        seen.append(await backend.probe())
        backend.inject_reset(0)
        seen += [await backend.probe(), await backend.probe()]
        await backend.close()
        return seen

    first, lost, restored, resetting, after = asyncio.run(main())
    assert set(first.values()) == {None}
    (gpu0, gpu1) = first
    assert lost == {gpu0: None, gpu1: "GPU is lost: it has fallen off the bus"}
    assert restored == first
    assert resetting == {gpu0: "the GPU is being reset", gpu1: None}
    assert after == first


def test_fake_backend_refuses_unknown_indices() -> None:
    backend = FakeGpuBackend("l4", "node-a")
    for poke in (backend.mark_lost, backend.restore, backend.inject_reset):
        with pytest.raises(IndexError, match="no fake GPU with index 3"):
            poke(3)
