"""Packing policies: a sort key per candidate placement; the smallest key wins."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator.model import Device
from dra_driver.base.quantity import Amount


@dataclass(frozen=True)
class Placement:
    device: Device
    free_memory_after: Amount
    """Memory the device has left after this placement (0 for a dedicated device)."""
    shares: int
    """Shares the device holds before this placement."""
    index: int
    """The GPU index (``index`` or ``parentIndex`` attribute; large if absent)."""
    total_memory: Amount


Policy = Callable[[Placement], tuple[Any, ...]]


def best_fit(p: Placement) -> tuple[Any, ...]:
    """The GPU left with the least free memory that still fits; ties: fewer shares, lower
    index (then the smaller device, e.g. the smallest MIG partition)."""
    return (p.free_memory_after, p.shares, p.index, p.total_memory, p.device.pool, p.device.name)


def first_fit(p: Placement) -> tuple[Any, ...]:
    """Pool, GPU index and name order: the first device that fits."""
    return (p.device.pool, p.index, p.total_memory, p.device.name)
