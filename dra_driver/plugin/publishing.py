"""Keeps this node's ResourceSlices published for as long as the plugin runs.

What the cluster keeps is probed (server-side dry run) at start and again
after every kubelet registration: the kubelet wipes the node's slices when it
starts, and a control-plane upgrade between two registrations may have
turned feature gates on or off. Each publish rebuilds the slices from the
inventory with the pure builder, with the health monitor's device taints
where the cluster keeps taints, and lets the publisher write only the
difference (a changed taint bumps the pool generation). Slices are never
deleted on shutdown: during a rolling update the next pod publishes the same
pool, and after an uninstall the kubelet wipes them 30 s after the driver is
gone.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NoReturn

from dra_driver.core.model import Inventory
from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slices import DesiredSlice, build_slices, validate_pool
from dra_driver.k8s.publisher import PublishResult, SlicePublisher
from dra_driver.plugin.current_inventory import CurrentInventory

log = logging.getLogger(__name__)

ProbeFn = Callable[[], Awaitable[Capabilities]]
TaintsFn = Callable[[], Mapping[str, Sequence[Mapping[str, Any]]]]
"""Device name → its device taints now (``HealthMonitor.taints``)."""


def without_mig_devices(inventory: Inventory, uuids: set[str]) -> Inventory:
    """``inventory`` as if the MIG instances ``uuids`` did not exist."""
    if not uuids:
        return inventory
    gpus = tuple(
        dataclasses.replace(
            gpu, mig_devices=tuple(d for d in gpu.mig_devices if d.uuid not in uuids)
        )
        for gpu in inventory.gpus
    )
    return dataclasses.replace(inventory, gpus=gpus)


class SlicePublishing:
    def __init__(
        self,
        publisher: SlicePublisher,
        probe: ProbeFn,
        *,
        inventory: CurrentInventory,
        settings: NodeSettings,
        driver_name: str,
        node_name: str,
        hidden_mig_devices: Callable[[], Awaitable[set[str]]] | None = None,
        taints: TaintsFn | None = None,
    ) -> None:
        """``hidden_mig_devices``: UUIDs of MIG instances the plugin created for
        claims; they are published as the placements they came from, not as
        pre-existing instances, so creating one does not change the pool.
        ``taints``: the device taints to publish (device health); call
        :meth:`request_publish` when they change."""
        self.publisher = publisher
        self.hidden_mig_devices = hidden_mig_devices
        self.probe = probe
        self._inventory = inventory
        self.settings = settings
        self.driver_name = driver_name
        self.node_name = node_name
        self.taints = taints
        self.capabilities: Capabilities | None = None
        self.last_result: PublishResult | None = None
        """The last successful publish."""
        self.failing: str | None = None
        """Why the publishes since the last success failed (None: the last one succeeded)."""
        self._reprobe = True

    @property
    def inventory(self) -> Inventory:
        """The node's GPUs as last discovered (what is published)."""
        return self._inventory.get()

    def on_registered(self) -> None:
        """The kubelet (re)registered us: probe again, then publish."""
        self._reprobe = True
        self.publisher.request_publish()

    def request_publish(self) -> None:
        """Publish again soon (the inventory or the device taints changed)."""
        self.publisher.request_publish()

    async def desired(self) -> list[DesiredSlice]:
        if self._reprobe or self.capabilities is None:
            self.capabilities = await self.probe()
            self._reprobe = False
            log.info("cluster keeps: %s", self.capabilities)
        inventory = self.inventory
        if self.hidden_mig_devices is not None:
            inventory = without_mig_devices(inventory, await self.hidden_mig_devices())
        slices = build_slices(
            inventory,
            driver_name=self.driver_name,
            node_name=self.node_name,
            settings=self.settings,
            capabilities=self.capabilities,
            taints=self.taints() if self.taints is not None else None,
        )
        # Our own copy of the API server's rules: a slice it would reject is
        # a bug here, better reported as such than as an HTTP 422.
        validate_pool([s.spec for s in slices], self.capabilities)
        return slices

    def _published(self, result: PublishResult) -> None:
        self.last_result = result
        self.failing = None
        if result.changed:
            log.info(
                "published ResourceSlices generation %d: %d created, %d updated, %d deleted",
                result.generation,
                len(result.created),
                len(result.updated),
                len(result.deleted),
            )

    def _failed(self, err: Exception, failures: int) -> None:
        self.failing = f"{failures} publish(es) in a row failed, the last with: {err}"

    async def run(self) -> NoReturn:
        await self.publisher.run(self.desired, on_publish=self._published, on_failure=self._failed)
