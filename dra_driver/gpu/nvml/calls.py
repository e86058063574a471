"""NVML calls with our error mapping: every NVML error becomes an InventoryError.

:class:`NvmlCalls` wraps the ``pynvml`` module (or the tests' fake of it)
that :class:`~dra_driver.gpu.nvml.backend.NvmlGpuBackend` was given; the
other modules of this package reach NVML only through it, on the serialised
NVML thread (the event thread only through ``lib``, on its own event set).

Errors
    Every NVML error becomes an :class:`InventoryError` (``raise ... from``)
    naming the GPU and the call, through :meth:`NvmlCalls.translated`.
    ``NVMLError_InUse`` and ``NVMLError_InsufficientResources`` from creating
    a GPU instance become :class:`MigPlacementBusyError`, naming the existing
    MIG devices the placement overlaps.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator
from typing import Any, Final

from dra_driver.base.errors import InventoryError, MigPlacementBusyError
from dra_driver.base.ids import GpuUUID

log = logging.getLogger("dra_driver.gpu.nvml")
"""The one logger of the NVML backend, whichever of its modules logs."""

ABSENT: Final = object()
"""What :meth:`NvmlCalls.call` returns for a tolerated error."""


def text(value: Any) -> str:
    # nvidia-ml-py decodes char arrays to str; older releases returned bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def handle_key(handle: Any) -> int | None:
    # Each pynvml call returns a new ctypes pointer object for the same device,
    # so device handles are compared by the address they hold.
    return ctypes.cast(handle, ctypes.c_void_p).value


class NvmlCalls:
    """``pynvml`` (or a fake of it) as ``lib``, its calls translated; the NVML session.

    Used on the serialised NVML thread only (``initialized`` is not locked).
    """

    def __init__(self, lib: Any) -> None:
        self.lib: Any = lib
        self.initialized = False

    @contextlib.contextmanager
    def translated(
        self, where: str, call: str, *, busy: str | None = None, hint: str = ""
    ) -> Iterator[None]:
        """Turn an NVML error from ``call`` into an InventoryError that names ``where``.

        With ``busy`` (what was being made), ``InUse`` and ``InsufficientResources``
        become :class:`MigPlacementBusyError`; ``hint`` ends other messages.
        """
        lib = self.lib
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

    def call(
        self,
        where: str,
        call: str,
        *args: Any,
        tolerate: tuple[type[Exception], ...] = (),
        busy: str | None = None,
        hint: str = "",
    ) -> Any:
        """``pynvml.<call>(*args)``; ``ABSENT`` for an error in ``tolerate``."""
        with self.translated(where, call, busy=busy, hint=hint):
            try:
                return getattr(self.lib, call)(*args)
            except tolerate:
                return ABSENT

    # docs/nvidia-interfaces.md: nvml-session
    def ensure_init(self) -> None:
        if not self.initialized:
            self.call("NVML", "nvmlInit")
            self.initialized = True

    def shutdown(self) -> None:
        """``nvmlShutdown``, if the session was started."""
        if self.initialized:
            self.initialized = False
            self.call("NVML", "nvmlShutdown")

    # docs/nvidia-interfaces.md: nvml-enumerate
    def handle(self, index: int) -> tuple[Any, GpuUUID, str]:
        """The device handle, UUID and log/error prefix of GPU ``index``."""
        handle = self.call(f"GPU {index}", "nvmlDeviceGetHandleByIndex", index)
        uuid = GpuUUID(text(self.call(f"GPU {index}", "nvmlDeviceGetUUID", handle)))
        return handle, uuid, f"GPU {index} ({uuid})"
