"""The pure allocator of the controller path: slices, classes and allocated claims in, one
claim's allocation (or the reason it has none) out. No Kubernetes client, no I/O."""

from dra_driver.allocator.allocate import (
    Allocation,
    AllocationOutcome,
    AllocatorState,
    DeviceMemory,
    Failure,
    Result,
    allocate,
    requested_size,
)
from dra_driver.allocator.cel import CelError, SelectorCache, is_sentinel, sentinel_expression
from dra_driver.allocator.k8s_rules import (
    keeps_off,
    node_fits_pod,
    tolerated,
    tolerates,
    why_node_unfit,
)
from dra_driver.allocator.packing import Placement, Policy, best_fit, first_fit
from dra_driver.allocator.quota import (
    InvalidQuotaError,
    VramQuota,
    parse_vram_quota,
    quota_annotation,
)

__all__ = [
    "Allocation",
    "AllocationOutcome",
    "AllocatorState",
    "CelError",
    "DeviceMemory",
    "Failure",
    "InvalidQuotaError",
    "Placement",
    "Policy",
    "Result",
    "SelectorCache",
    "VramQuota",
    "allocate",
    "best_fit",
    "first_fit",
    "is_sentinel",
    "keeps_off",
    "node_fits_pod",
    "parse_vram_quota",
    "quota_annotation",
    "requested_size",
    "sentinel_expression",
    "tolerated",
    "tolerates",
    "why_node_unfit",
]
