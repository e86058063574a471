"""Whether this node can cap a container's GPU memory with the cgroup v2 ``dmem`` controller.

The kernel's ``dmem`` controller (Linux 6.14+, ``CONFIG_CGROUP_DMEM``) accounts
device memory per cgroup, per *region* a device driver registers. Interface
(Documentation/admin-guide/cgroup-v2.rst, "DMEM"):

* ``cgroup.controllers`` of the root lists ``dmem``;
* the root's ``dmem.capacity`` lists each region with its size in bytes, one
  ``<region> <bytes>`` line per region;
* every other cgroup has ``dmem.max``, ``dmem.min``, ``dmem.low`` and
  ``dmem.current`` (nested-keyed ``<region> <bytes|max>`` lines), once ``dmem``
  is enabled in its parent's ``cgroup.subtree_control``.

Region names are ``<driver>/<device>/<memory>``, the device being its PCI bus id:
the kernel docs' example (Intel xe, TTM) is ``drm/0000:03:00.0/vram0`` (and
``.../stolen``, which is not device memory); NVIDIA's driver, from release 615
with MPS v3 memory partitioning, registers one ``nvidia/<bus id>/vidmem`` per
GPU (NVIDIA's "Per-GPU Compute and Memory Limits with MPS" guide). Older NVIDIA
drivers register none: then there is nothing to limit and no hook is added.
Not verified on a GPU node by this project (no dmem-capable node yet).

Setting the limits is the hook's job (``dra_driver/dmemhook/dmem-hook.sh``):
NVIDIA says to set them with ``nvidia-smi memory-limits`` or NVML
(``nvmlDeviceSetMemoryLimits_v1``), not by writing these files, and the hook
does so where the driver offers the subcommand (docs/nvidia-interfaces.md:
dmem-set-nvidia-smi); this module only reads (dmem-read-capacity).

:func:`detect_dmem` reads the root cgroup (``--cgroup-root``: in the plugin's
pod, the host's ``/sys/fs/cgroup`` mounted read-only, because a container's own
``/sys/fs/cgroup`` is its cgroup namespace, without ``dmem.capacity``) and maps
each GPU's UUID to its device-memory regions. The rest is pure.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.base.ids import GpuUUID
from dra_driver.core.model import GpuInfo

DEFAULT_CGROUP_ROOT = "/sys/fs/cgroup"

_BUS_ID = re.compile(r"^([0-9a-f]{1,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_DEVICE_MEMORY = re.compile(r"^(vram\d*|vidmem)$")
"""Region leaf names that are a GPU's own memory (not stolen system memory, GTT...)."""


@dataclass(frozen=True)
class DmemDetection:
    regions: Mapping[GpuUUID, tuple[str, ...]] = field(default_factory=dict)
    """Device-memory regions per GPU; GPUs without any are absent."""
    notes: tuple[str, ...] = ()
    """What was found and why a GPU has no regions: one log line each."""


def canonical_bus_id(bus_id: str) -> str | None:
    """``00000000:3B:00.0`` / ``0000:3b:00.0`` → ``0000:3b:00.0``; None if not a bus id."""
    match = _BUS_ID.match(bus_id.strip().lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


def parse_capacity(text: str) -> dict[str, int]:
    """``dmem.capacity``: ``<region> <bytes>`` lines (lines that are not are skipped)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def device_memory_regions(regions: Iterable[str], pci_bus_id: str) -> tuple[str, ...]:
    """The regions that are the device memory of the GPU at ``pci_bus_id``, sorted."""
    wanted = canonical_bus_id(pci_bus_id)
    if wanted is None:
        return ()
    found = []
    for region in regions:
        parts = region.split("/")
        if (
            len(parts) == 3
            and canonical_bus_id(parts[1]) == wanted
            and _DEVICE_MEMORY.match(parts[2])
        ):
            found.append(region)
    return tuple(sorted(found))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


# docs/nvidia-interfaces.md: dmem-read-capacity
def detect_dmem(gpus: Sequence[GpuInfo], cgroup_root: str = DEFAULT_CGROUP_ROOT) -> DmemDetection:
    """Which of ``gpus`` have dmem regions on this node (I/O: reads ``cgroup_root``)."""
    controllers = _read(os.path.join(cgroup_root, "cgroup.controllers"))
    if controllers is None:
        return DmemDetection(
            notes=(
                f"dmem GPU-memory limits off: {cgroup_root} is not a cgroup v2 hierarchy "
                "(no cgroup.controllers; a cgroup v1 or hybrid host)",
            )
        )
    if "dmem" not in controllers.split():
        return DmemDetection(
            notes=(
                "dmem GPU-memory limits off: the kernel has no dmem cgroup controller "
                f"({cgroup_root}/cgroup.controllers: {controllers.strip() or 'empty'}); it "
                "needs Linux 6.14 or newer with CONFIG_CGROUP_DMEM",
            )
        )
    capacity_text = _read(os.path.join(cgroup_root, "dmem.capacity"))
    if capacity_text is None:
        return DmemDetection(
            notes=(
                f"dmem GPU-memory limits off: {cgroup_root} has no dmem.capacity, so it is "
                "not the root cgroup; mount the host's /sys/fs/cgroup into the plugin "
                "(read-only) and point --cgroup-root at it",
            )
        )
    capacity = parse_capacity(capacity_text)
    regions: dict[GpuUUID, tuple[str, ...]] = {}
    notes: list[str] = []
    for gpu in gpus:
        where = f"GPU {gpu.device_name} ({gpu.uuid}, PCI {gpu.pci_bus_id or 'unknown'})"
        found = device_memory_regions(capacity, gpu.pci_bus_id)
        if found:
            regions[gpu.uuid] = found
            notes.append(f"dmem GPU-memory limits on for {where}: region(s) {', '.join(found)}")
        else:
            notes.append(
                f"dmem GPU-memory limits off for {where}: dmem.capacity has no device-memory "
                f"region of it (regions: {', '.join(sorted(capacity)) or 'none'}); the NVIDIA "
                "driver registers nvidia/<bus id>/vidmem from release 615 (MPS v3 memory "
                "partitioning), older ones none; its MPS shares keep the daemon's limits only "
                "(per client process)"
            )
    return DmemDetection(regions=regions, notes=tuple(notes))
