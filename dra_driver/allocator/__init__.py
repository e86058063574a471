"""The pure allocator of the controller path: slices, classes and allocated claims in, one
claim's allocation (or the reason it has none) out. No Kubernetes client, no I/O."""

from dra_driver.allocator.allocate import (
    Allocation,
    AllocationOutcome,
    AllocatorState,
    Result,
    allocate,
)
from dra_driver.allocator.cel import CelError, SelectorCache, is_sentinel, sentinel_expression
from dra_driver.allocator.packing import Placement, Policy, best_fit, first_fit

__all__ = [
    "Allocation",
    "AllocationOutcome",
    "AllocatorState",
    "CelError",
    "Placement",
    "Policy",
    "Result",
    "SelectorCache",
    "allocate",
    "best_fit",
    "first_fit",
    "is_sentinel",
    "sentinel_expression",
]
