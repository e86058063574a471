"""Known GPU models for the fake backend.

Figures are the public product specifications (memory as NVML reports the
total, in MiB). The inventory issue grows these into full profile files with
MIG profiles and placements; the foundation needs only what a whole GPU is.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuModel:
    key: str
    """Shorthand used by ``--fake-gpus``, e.g. ``h100-80gb``."""
    product_name: str
    memory_mib: int

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


KNOWN_MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel("a100-40gb", "NVIDIA A100-SXM4-40GB", 40960),
        GpuModel("a100-80gb", "NVIDIA A100-SXM4-80GB", 81920),
        GpuModel("h100-80gb", "NVIDIA H100 80GB HBM3", 81559),
        GpuModel("h200-141gb", "NVIDIA H200", 143771),
        GpuModel("l4", "NVIDIA L4", 23034),
    )
}
