"""What every device has given out, from all allocated claims (whoever allocated them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocator.model import Device, Pool, allocated_results
from dra_driver.base.quantity import Amount

DeviceKey = tuple[str, str, str]
"""(driver, pool, device)."""
CounterKey = tuple[str, str, str]
"""(driver, pool, counter set)."""


@dataclass(slots=True)
class DeviceUse:
    exclusive: bool = False
    """A result without shareID holds the whole device."""
    shares: int = 0
    consumed: dict[str, Amount] = field(default_factory=dict)

    @property
    def in_use(self) -> bool:
        return self.exclusive or self.shares > 0


@dataclass
class Ledger:
    devices: dict[DeviceKey, DeviceUse] = field(default_factory=dict)
    counters: dict[CounterKey, dict[str, Amount]] = field(default_factory=dict)

    def use(self, key: DeviceKey) -> DeviceUse:
        return self.devices.get(key) or DeviceUse()

    def counters_used(self, key: CounterKey) -> Mapping[str, Amount]:
        return self.counters.get(key, {})

    def add(
        self,
        key: DeviceKey,
        device: Device | None,
        share_id: str | None,
        consumed: Mapping[str, Amount],
    ) -> None:
        use = self.devices.setdefault(key, DeviceUse())
        first = not use.in_use
        if share_id is None:
            use.exclusive = True
        else:
            use.shares += 1
            for name, amount in consumed.items():
                use.consumed[name] = use.consumed.get(name, 0) + amount
        if device is not None and first:  # counters are consumed once per device
            for counter_set, counters in device.consumes_counters:
                used = self.counters.setdefault((key[0], key[1], counter_set), {})
                for name, amount in counters.items():
                    used[name] = used.get(name, 0) + amount


def build_ledger(pools: Iterable[Pool], allocated_claims: Iterable[Mapping[str, Any]]) -> Ledger:
    """The ledger of ``allocated_claims``; ``adminAccess`` results hold nothing."""
    devices = {d.key: d for pool in pools for d in pool.devices}
    ledger = Ledger()
    for claim in allocated_claims:
        for result in allocated_results(claim):
            if result.admin_access:
                continue
            key = (result.driver, result.pool, result.device)
            ledger.add(key, devices.get(key), result.share_id, result.consumed)
    return ledger
