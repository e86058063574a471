"""The node's GPU inventory as last discovered, one holder shared by whoever reads it."""

from __future__ import annotations

from dra_driver.core.model import Inventory


class CurrentInventory:
    """The inventory of the last discovery: the runtime :meth:`set`\\ s it on a
    re-discovery that found a change; the engine and slice publishing :meth:`get` it."""

    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory

    def get(self) -> Inventory:
        return self._inventory

    def set(self, inventory: Inventory) -> None:
        self._inventory = inventory
