"""Interfaces the core's callers depend on; adapters implement them.

Each protocol has a real implementation (official Kubernetes client, NVML) and
a fake for what this machine lacks (a cluster, a GPU), behind the same shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from dra_driver.core.errors import ClaimReplacedError
from dra_driver.core.ids import ClaimRef
from dra_driver.core.model import HealthEvent, Inventory, ResourceClaim


class ClaimSource(Protocol):
    """Reads ResourceClaims by the reference the kubelet sends."""

    async def get_claim(self, ref: ClaimRef) -> ResourceClaim:
        """Return the claim ``ref`` names.

        Raises :class:`~dra_driver.core.errors.ClaimNotFoundError` when it does
        not exist, :class:`~dra_driver.core.errors.ClaimReplacedError` when the
        stored claim has another UID, and
        :class:`~dra_driver.core.errors.ApiError` subclasses for API failures.
        """
        ...


class GpuBackend(Protocol):
    """Discovers the node's GPUs (NVML on a real node, a profile when faked)."""

    @property
    def name(self) -> str:
        """Backend name as given to ``--backend``."""
        ...

    async def inventory(self) -> Inventory:
        """Discover the GPUs; raises InventoryError on failure."""
        ...

    def health_events(self) -> AsyncIterator[HealthEvent]:
        """XID and similar events, as they happen, until :meth:`close`."""
        ...

    async def close(self) -> None:
        """Release backend resources (NVML shutdown)."""
        ...


def ensure_same_claim(ref: ClaimRef, claim: ResourceClaim) -> ResourceClaim:
    """Return ``claim`` if it is the object ``ref`` names, else raise ClaimReplacedError.

    The kubelet identifies a claim by namespace, name and UID; a claim deleted
    and re-created under the same name is a different claim and must not be
    prepared for the old reference.
    """
    if claim.ref.uid != ref.uid:
        raise ClaimReplacedError(
            ref,
            f"the ResourceClaim {ref.namespace}/{ref.name} now has UID {claim.ref.uid}: "
            "it was deleted and re-created; the pod must be re-created to use the new claim",
        )
    return claim
