"""Allocate one claim, as the scheduler would, from slices, classes and the ledger.

Pure: no Kubernetes client, no I/O. The search runs per node (node-local pools),
request by request (``firstAvailable`` alternatives in order), with backtracking
within a step budget; among the nodes where the claim fits, the one whose
solution has the smallest packing key wins.

Within one claim a device is picked at most once unless a ``matchAttribute``
constraint covers both requests (so a ``count > 1`` share never lands twice on
one GPU unless asked).

An optional :class:`~dra_driver.allocator.quota.VramQuota` caps the memory the
claim's namespace holds on controller-managed devices: a placement that would
exceed it is not taken, and when every placement that fits would, the reason
names the namespace, the quota, the memory in use and the memory asked.

This module is the entry point: the one-shot :func:`allocate`, and the names
callers import from here. The parts, one job each:

* :mod:`~dra_driver.allocator.result`: results, allocation, outcome, status JSON;
* :mod:`~dra_driver.allocator.search`: one claim's backtracking search on one node;
* :mod:`~dra_driver.allocator.device_index`: matching devices per request shape,
  grouped by capacity signature, in packing order;
* :mod:`~dra_driver.allocator.node_search`: the node-by-node search of multi-device
  claims;
* :mod:`~dra_driver.allocator.state`: :class:`AllocatorState`, the incremental
  allocator (and its single-device path).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dra_driver.allocator.cel import SelectorCache
from dra_driver.allocator.packing import Policy, best_fit
from dra_driver.allocator.quota import VramQuota
from dra_driver.allocator.result import Allocation, AllocationOutcome, Failure, Result
from dra_driver.allocator.search import requested_size
from dra_driver.allocator.state import (
    ALLOCATOR_ATTRIBUTE,
    CONTROLLER,
    AllocatorState,
    DeviceMemory,
)

__all__ = [
    "ALLOCATOR_ATTRIBUTE",
    "CONTROLLER",
    "Allocation",
    "AllocationOutcome",
    "AllocatorState",
    "DeviceMemory",
    "Failure",
    "Result",
    "allocate",
    "requested_size",
]


def allocate(
    claim_obj: Mapping[str, Any],
    *,
    slices: Iterable[Mapping[str, Any]],
    classes: Iterable[Mapping[str, Any]],
    allocated_claims: Iterable[Mapping[str, Any]],
    node_filter: Callable[[str], bool] | None = None,
    driver_name: str,
    policy: Policy = best_fit,
    share_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    cache: SelectorCache | None = None,
    quota: VramQuota | None = None,
) -> AllocationOutcome:
    """Allocate ``claim_obj`` (a ResourceClaim as JSON) or say why it cannot be.

    ``quota``: the VRAM quota of the claim's namespace, charged with what the
    namespace's ``allocated_claims`` hold (see :mod:`dra_driver.allocator.quota`).
    One-shot: builds a throwaway :class:`AllocatorState`. To allocate many claims
    against the same slices, build the state once and call its ``allocate``.
    """
    state = AllocatorState(
        slices=slices,
        classes=classes,
        allocated_claims=allocated_claims,
        driver_name=driver_name,
        cache=cache,
    )
    return state.allocate(
        claim_obj,
        node_filter=node_filter,
        policy=policy,
        share_id=share_id,
        record=False,
        quota=quota,
    )
