"""Re-discovers the node's GPUs every ``interval`` and spreads a change (a background task).

A MIG mode change after a reset or a GPU gone changes the inventory: the engine
and slice publishing read it from the shared :class:`CurrentInventory`, the
health model is told, then the slices are republished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from dra_driver.base.errors import DriverError
from dra_driver.core.model import Inventory
from dra_driver.plugin.current_inventory import CurrentInventory

__all__ = ["InventoryWatch"]

log = logging.getLogger(__name__)


class InventoryWatch:
    def __init__(
        self,
        discover: Callable[[], Awaitable[Inventory]],
        current: CurrentInventory,
        *,
        interval: float,
        follow_health: Callable[[Inventory], Awaitable[None]],
        republish: Callable[[], None] | None = None,
    ) -> None:
        """``discover``: the backend's ``inventory``; ``follow_health``: the health
        monitor's ``set_inventory``; ``republish``: slice publishing's
        ``request_publish`` (None: the plugin publishes none)."""
        self.discover = discover
        self.current = current
        self.interval = interval
        self.follow_health = follow_health
        self.republish = republish

    async def run(self) -> None:
        """Until cancelled; a failed discovery keeps the last inventory."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                inventory = await self.discover()
            except DriverError as err:
                log.warning("GPU re-discovery failed; keeping the last inventory: %s", err)
                continue
            if inventory != self.current.get():
                await self.changed(inventory)

    async def changed(self, inventory: Inventory) -> None:
        log.info("the GPU inventory changed; updating the plugin and republishing")
        self.current.set(inventory)  # the engine's and slice publishing's too
        # The health model follows the devices (and the kubelet hears the new list)
        # before the slices are rebuilt, so they carry the right taints.
        await self.follow_health(inventory)
        if self.republish is not None:
            self.republish()
