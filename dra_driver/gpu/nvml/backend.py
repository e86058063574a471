"""NvmlGpuBackend: the GpuBackend port over NVML, every call off the event loop.

This is the only module that imports ``pynvml`` (nvidia-ml-py); the other
modules of the package get it, or the tests' fake of it, from here.

Threads
    pynvml calls block, so none runs on the event loop. Every call except the
    event wait runs on ONE dedicated worker thread (a single-worker
    ThreadPoolExecutor): the session starts there lazily (``nvmlInit`` on first
    use) and ends there (``nvmlShutdown`` in :meth:`NvmlGpuBackend.close`), and
    an inventory is never interleaved with event registration or shutdown.
    NVML itself is thread-safe; the serialisation is for our own call ordering.
    The event wait has a thread of its own (:mod:`dra_driver.gpu.nvml.events`);
    it also reads the MIG-device map, which an inventory replaces whole, never
    mutates.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pynvml

from dra_driver.base.errors import InventoryError
from dra_driver.base.ids import GpuUUID, MigUUID
from dra_driver.core.model import HealthEvent, Inventory, MigDevice, MigPlacement
from dra_driver.gpu.nvml.calls import NvmlCalls
from dra_driver.gpu.nvml.discovery import architecture_names, discover
from dra_driver.gpu.nvml.events import HealthEvents, MigKey, probe_gpu
from dra_driver.gpu.nvml.mig import create_mig, destroy_mig

T = TypeVar("T")


class NvmlGpuBackend:
    """A :class:`~dra_driver.core.ports.GpuBackend` over NVML.

    ``lib`` is the ``pynvml`` module (the default) or a fake of it. ``poll_ms``
    is how long one event wait blocks, which bounds how long :meth:`close`
    waits for the event thread.
    """

    def __init__(self, lib: Any | None = None, *, poll_ms: int = 1000) -> None:
        self._lib: Any = pynvml if lib is None else lib
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nvml")
        self._arch_names = architecture_names(self._lib)
        self._nvml = NvmlCalls(self._lib)  # touched on the NVML thread only
        self._closed = False
        self._mig_uuids: dict[MigKey, MigUUID] = {}
        self._gpu_uuids: tuple[GpuUUID, ...] = ()  # of the latest inventory
        self._events = HealthEvents(self._nvml, poll_ms=poll_ms, mig_uuids=self._latest_migs)

    @property
    def name(self) -> str:
        return "nvml"

    # Capabilities (GpuBackend): real GPUs have device nodes, an installed driver,
    # possibly dmem regions, and MIG capability files.
    @property
    def has_device_nodes(self) -> bool:
        return True

    @property
    def has_driver_files(self) -> bool:
        return True

    @property
    def supports_dmem(self) -> bool:
        return True

    @property
    def reads_mig_capabilities(self) -> bool:
        return True

    async def inventory(self) -> Inventory:
        return await self._on_nvml_thread(self._discover)

    async def probe(self) -> Mapping[GpuUUID, str | None]:
        """Per GPU of the latest inventory: None when it answered, else why not."""
        return await self._on_nvml_thread(self._probe)

    async def health_events(self) -> AsyncIterator[HealthEvent]:
        """XID and ECC events until :meth:`close`; several consumers each get every event."""
        queue: asyncio.Queue[HealthEvent | None] = asyncio.Queue()
        subscriber = (asyncio.get_running_loop(), queue)
        if not self._events.subscribe(subscriber):
            return
        try:
            await self._on_nvml_thread(self._events.start)
            while (event := await queue.get()) is not None:
                yield event
        finally:
            self._events.unsubscribe(subscriber)

    async def create_mig_device(
        self, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement
    ) -> MigDevice:
        return await self._on_nvml_thread(lambda: self._create_mig(gpu_uuid, profile_id, placement))

    async def destroy_mig_device(self, gpu_uuid: GpuUUID, gi_id: int) -> None:
        await self._on_nvml_thread(lambda: self._destroy_mig(gpu_uuid, gi_id))

    async def close(self) -> None:
        """Stop the event thread, free the event set, shut NVML down; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.stop()
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._shutdown)
        finally:
            self._executor.shutdown(wait=True)

    # -- on the serialised NVML thread ----------------------------------------

    async def _on_nvml_thread(self, job: Callable[[], T]) -> T:
        if self._closed:
            raise InventoryError("the NVML backend is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    def _latest_migs(self) -> Mapping[MigKey, MigUUID]:
        return self._mig_uuids

    def _discover(self) -> Inventory:
        inventory = discover(self._nvml, self._arch_names)
        gpus = inventory.gpus
        self._gpu_uuids = tuple(gpu.uuid for gpu in gpus)
        self._mig_uuids = {
            (gpu.uuid, mig.gi_id, mig.ci_id): mig.uuid for gpu in gpus for mig in gpu.mig_devices
        }
        return inventory

    def _probe(self) -> dict[GpuUUID, str | None]:
        self._nvml.ensure_init()
        if not self._gpu_uuids:
            self._discover()
        return {uuid: probe_gpu(self._lib, uuid) for uuid in self._gpu_uuids}

    def _create_mig(self, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement) -> MigDevice:
        mig = create_mig(self._nvml, gpu_uuid, profile_id, placement)
        self._mig_uuids = {**self._mig_uuids, (gpu_uuid, mig.gi_id, mig.ci_id): mig.uuid}
        return mig

    def _destroy_mig(self, gpu_uuid: GpuUUID, gi_id: int) -> None:
        if destroy_mig(self._nvml, gpu_uuid, gi_id):
            self._mig_uuids = {
                key: uuid for key, uuid in self._mig_uuids.items() if key[:2] != (gpu_uuid, gi_id)
            }

    def _shutdown(self) -> None:
        self._events.release()
        self._nvml.shutdown()
