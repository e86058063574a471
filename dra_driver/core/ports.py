"""Interfaces the core's callers depend on; adapters implement them.

Each protocol has a real implementation (official Kubernetes client, NVML) and
a fake for what this machine lacks (a cluster, a GPU), behind the same shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from dra_driver.base.errors import ClaimReplacedError
from dra_driver.base.ids import ClaimRef, GpuUUID
from dra_driver.core.model import (
    HealthEvent,
    Inventory,
    MigDevice,
    MigPlacement,
    ResourceClaim,
)


class ClaimSource(Protocol):
    """Reads ResourceClaims by the reference the kubelet sends."""

    async def get_claim(self, ref: ClaimRef) -> ResourceClaim:
        """Return the claim ``ref`` names.

        Raises :class:`~dra_driver.base.errors.ClaimNotFoundError` when it does
        not exist, :class:`~dra_driver.base.errors.ClaimReplacedError` when the
        stored claim has another UID, and
        :class:`~dra_driver.base.errors.ApiError` subclasses for API failures.
        """
        ...


class GpuBackend(Protocol):
    """Discovers the node's GPUs (NVML on a real node, a profile when faked).

    It also creates and destroys MIG devices for dynamic MIG. Calls may run
    concurrently; the backend serialises what must not interleave.
    """

    @property
    def name(self) -> str:
        """Backend name as given to ``--backend`` (logs only: decisions use the
        capabilities below, never the name)."""
        ...

    @property
    def has_device_nodes(self) -> bool:
        """The GPUs have device nodes on this host (``/dev/nvidia<minor>``, MIG's
        ``/dev/nvidia-caps``). False: containers get stand-in device nodes
        (:attr:`~dra_driver.core.prepare.NodeContext.fake_device_nodes`)."""
        ...

    @property
    def has_driver_files(self) -> bool:
        """An NVIDIA driver is installed whose libraries, binaries and control nodes
        containers need (the Container Toolkit's CDI spec, or our own discovery).
        False: containers get stand-in control nodes only."""
        ...

    @property
    def supports_dmem(self) -> bool:
        """The GPUs may have cgroup v2 dmem regions (real PCI bus ids), so that MPS
        shares can get kernel-enforced memory limits. False: dmem is never used."""
        ...

    @property
    def reads_mig_capabilities(self) -> bool:
        """MIG devices are reached through the host's MIG capability files
        (``<proc>/driver/nvidia/capabilities``), read when a MIG device is prepared.
        False: none are read."""
        ...

    async def inventory(self) -> Inventory:
        """Discover the GPUs; raises InventoryError on failure."""
        ...

    async def create_mig_device(
        self, gpu_uuid: GpuUUID, profile_id: int, placement: MigPlacement
    ) -> MigDevice:
        """Make a MIG device: a GPU instance at ``placement`` and its compute instance.

        ``profile_id`` is NVML's GPU-instance profile id (``MigProfile.id``) and
        ``placement`` one of that profile's placements. The compute instance
        spans the whole GPU instance (shared engines), so the MIG device has
        all of the instance's SMs and memory.

        Idempotent, so that a prepare retried after a crash finds what the
        first attempt made: if a GPU instance of ``profile_id`` exists at
        exactly ``placement``, it is returned (with its compute instance,
        created if the first attempt died between the two steps) instead of
        failing. A later :meth:`inventory` lists the new device.

        Raises :class:`~dra_driver.base.errors.MigPlacementBusyError` when the
        placement overlaps another instance (or the GPU has no room for the
        profile), and :class:`~dra_driver.base.errors.InventoryError` for an
        unknown GPU, MIG mode off, an unknown profile or a placement the
        profile does not have, and any other failure.
        """
        ...

    async def destroy_mig_device(self, gpu_uuid: GpuUUID, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` on ``gpu_uuid``: its compute instances, then itself.

        Idempotent: a GPU instance that does not exist (destroyed already, or
        never made) is not an error. Raises
        :class:`~dra_driver.base.errors.InventoryError` for an unknown GPU or
        when the driver refuses (e.g. a process still runs on the instance).
        """
        ...

    def health_events(self) -> AsyncIterator[HealthEvent]:
        """XID and similar events, as they happen, until :meth:`close`.

        ``xid`` 0 (:data:`~dra_driver.core.health.NOT_AN_XID`) means the event
        source itself failed for that GPU; the message says how.
        """
        ...

    async def probe(self) -> Mapping[GpuUUID, str | None]:
        """Ask every GPU of the latest inventory a cheap question (liveness).

        Per GPU: None when it answered, else why not (fallen off the bus,
        needs a reset). A GPU that answers again after it did not has been
        reset. Raises :class:`~dra_driver.base.errors.InventoryError` when
        the probe cannot run at all (the driver library is gone).
        """
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
