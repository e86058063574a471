"""NVML GPU backend: the node's GPUs, MIG geometry and XID events, read from the driver.

Only :mod:`.backend` imports ``pynvml`` (nvidia-ml-py); the other modules get
it, or a fake with the same shape (``tests/support/fake_pynvml.py``), from
there. One module per concern:

* :mod:`.backend`: :class:`NvmlGpuBackend`, the async port; the serialised
  NVML thread (see its docstring for the threads);
* :mod:`.calls`: NVML calls and the session; every NVML error becomes an
  ``InventoryError`` (``MigPlacementBusyError`` for a busy placement);
* :mod:`.discovery`: :meth:`NvmlGpuBackend.inventory`: GPUs, MIG profiles,
  placements and MIG devices, asked again each time;
* :mod:`.mig`: dynamic MIG, :meth:`NvmlGpuBackend.create_mig_device`
  (idempotent) and :meth:`NvmlGpuBackend.destroy_mig_device`;
* :mod:`.events`: :meth:`NvmlGpuBackend.health_events` (XID and double-bit
  ECC events, on a thread of their own) and :meth:`NvmlGpuBackend.probe`.
"""

from dra_driver.gpu.nvml.backend import NvmlGpuBackend
from dra_driver.gpu.nvml.discovery import normalise_pci_bus_id

__all__ = ["NvmlGpuBackend", "normalise_pci_bus_id"]
