"""The GPU re-discovery: a change reaches the shared inventory, then the health model,
then slice publishing; an unchanged or failed discovery changes nothing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from dra_driver.base.errors import DriverError
from dra_driver.base.ids import GpuUUID
from dra_driver.core.model import GpuInfo, Inventory
from dra_driver.plugin.current_inventory import CurrentInventory
from dra_driver.plugin.inventory_watch import InventoryWatch
from tests.support.node import run_checked


def gpus(count: int) -> Inventory:
    return Inventory(
        tuple(GpuInfo(i, GpuUUID(f"GPU-{i}"), "NVIDIA L4", 24 << 30, i) for i in range(count))
    )


class Discoveries:
    """What the backend finds, one answer per discovery; then it waits for ever."""

    def __init__(self, *answers: Inventory | DriverError) -> None:
        self.answers = list(answers)
        self.done = asyncio.Event()

    async def __call__(self) -> Inventory:
        if not self.answers:
            self.done.set()
            await asyncio.Event().wait()
        answer = self.answers.pop(0)
        if isinstance(answer, DriverError):
            raise answer
        return answer


def test_a_change_is_followed_in_order_and_the_rest_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    current = CurrentInventory(gpus(2))
    told: list[str] = []

    async def follow_health(inventory: Inventory) -> None:
        assert current.get() == inventory, "the shared inventory is set first"
        told.append(f"health {len(inventory.gpus)}")

    async def scenario() -> None:
        found = Discoveries(gpus(2), DriverError("NVML: GPU is lost"), gpus(1), gpus(1))
        watch = InventoryWatch(
            found,
            current,
            interval=0,
            follow_health=follow_health,
            republish=lambda: told.append("republish"),
        )
        task = asyncio.create_task(watch.run())
        await asyncio.wait_for(found.done.wait(), 5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.WARNING, logger="dra_driver.plugin.inventory_watch"):
        run_checked(scenario())
    assert told == ["health 1", "republish"]
    assert current.get() == gpus(1)
    assert "GPU re-discovery failed; keeping the last inventory: NVML: GPU is lost" in caplog.text


def test_without_publishing_only_the_health_model_follows() -> None:
    current = CurrentInventory(gpus(2))
    told: list[Inventory] = []

    async def follow_health(inventory: Inventory) -> None:
        told.append(inventory)

    watch = InventoryWatch(Discoveries(), current, interval=0, follow_health=follow_health)
    run_checked(watch.changed(gpus(3)))
    assert told == [gpus(3)] and current.get() == gpus(3)
