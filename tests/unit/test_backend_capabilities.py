"""What a GPU backend can do is a property of the backend (core/ports.py), not its name."""

from __future__ import annotations

import asyncio

from dra_driver.core.ports import GpuBackend
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.gpu.nvml import NvmlGpuBackend
from tests.support.fake_pynvml import FakeNvml

CAPABILITIES = ("has_device_nodes", "has_driver_files", "supports_dmem", "reads_mig_capabilities")


def capabilities(backend: GpuBackend) -> dict[str, bool]:
    return {name: getattr(backend, name) for name in CAPABILITIES}


def test_the_protocol_declares_every_capability() -> None:
    for name in CAPABILITIES:
        assert isinstance(getattr(GpuBackend, name), property), name


def test_fake_gpus_have_none() -> None:
    backend = FakeGpuBackend("h100-80gb:1", "node-a")
    assert capabilities(backend) == dict.fromkeys(CAPABILITIES, False)


def test_nvml_gpus_have_all() -> None:
    backend = NvmlGpuBackend(FakeNvml(), poll_ms=50)
    try:
        assert capabilities(backend) == dict.fromkeys(CAPABILITIES, True)
    finally:
        asyncio.run(backend.close())
