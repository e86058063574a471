"""Consumable capacity exactly as the scheduler computes it (dra-facts 6).

``consumed_capacity`` is ``calculateConsumedCapacity``, ``violates_policy`` is
``violatesPolicy`` and ``fits`` is ``CmpRequestOverCapacity``. Where the API server
dropped consumable capacity (before 1.36), the request policy comes from the int
attributes the slice builder publishes instead (``memoryUsable``, ``memoryMin``,
``memoryStep``, ``memoryDefault``, ``clientsMax``): see :func:`effective_capacity`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from dra_driver.allocator.model import Capacity, Device, RequestPolicy
from dra_driver.base.quantity import Amount


def _ceil_div(a: Amount, b: Amount) -> int:
    return -((-a) // b)


def consume_one(requested: Amount | None, capacity: Capacity) -> Amount:  # noqa: PLR0911
    policy = capacity.policy
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return capacity.value
    if policy is None:
        return requested
    if policy.min is not None:
        if requested < policy.min:
            return policy.min
        if policy.step is None or policy.step == 0:
            return requested
        return policy.min + _ceil_div(requested - policy.min, policy.step) * policy.step
    if policy.valid_values:
        for value in policy.valid_values:  # sorted ascending
            if value >= requested:
                return value
    return requested


def consumed_capacity(
    requests: Mapping[str, Amount], capacity: Mapping[str, Capacity]
) -> dict[str, Amount]:
    """What one allocation consumes of every capacity key of the device."""
    return {key: consume_one(requests.get(key), cap) for key, cap in capacity.items()}


def violates_policy(value: Amount, policy: RequestPolicy | None) -> bool:  # noqa: PLR0911
    if policy is None:
        return False
    if policy.default is not None and value == policy.default:
        return False
    if policy.min is not None:
        if policy.max is not None and value > policy.max:
            return True
        if policy.step:
            return (value - policy.min) % policy.step != 0
        return False
    if policy.valid_values:
        return value not in policy.valid_values
    return False


def fits(
    requests: Mapping[str, Amount],
    capacity: Mapping[str, Capacity],
    used: Mapping[str, Amount],
) -> dict[str, Amount] | str:
    """The consumption if it fits beside ``used`` (all shares so far), else the reason."""
    for key in requests:
        if key not in capacity:
            return f"no capacity {key!r}"
    consumed = consumed_capacity(requests, capacity)
    for key, amount in consumed.items():
        cap = capacity[key]
        if key in requests and violates_policy(amount, cap.policy):
            return f"{key} {amount} violates the request policy"
        if used.get(key, 0) + amount > cap.value:
            return f"{key}: {amount} does not fit ({used.get(key, 0)} of {cap.value} in use)"
    return consumed


def effective_capacity(device: Device) -> tuple[bool, Mapping[str, Capacity]]:
    """(shareable, capacities) as the controller sees the device.

    A device with ``allowMultipleAllocations`` is taken as published. Otherwise, if
    it carries ``memoryUsable`` (the API server dropped consumable capacity), it is
    shareable with ``memory`` = memoryUsable (policy memoryDefault/memoryMin/
    memoryStep), ``clients`` = clientsMax (default 1, min 1, step 1) and
    ``computePercent`` = 100 (default 0, min 0, step 1), as the 1.36 slices say.
    """
    if device.allow_multiple_allocations:
        return True, device.capacity
    attrs = device.attributes
    usable = attrs.get("memoryUsable")
    if not isinstance(usable, int) or isinstance(usable, bool):
        return False, device.capacity

    def attr(name: str) -> int | None:
        value = attrs.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    names = ("memoryDefault", "memoryMin", "memoryStep", "clientsMax")
    return True, _attribute_capacity(usable, *(attr(n) for n in names))


@functools.lru_cache(maxsize=256)
def _attribute_capacity(
    usable: int, default: int | None, low: int | None, step: int | None, clients: int | None
) -> Mapping[str, Capacity]:
    """The capacities a pre-1.36 device's attributes stand for; one (never mutated)
    mapping per distinct set of attributes, not one per device and call."""
    caps = {
        "memory": Capacity(usable, RequestPolicy(default=default, min=low, step=step)),
        "computePercent": Capacity(100, RequestPolicy(default=0, min=0, step=1)),
    }
    if clients is not None:
        caps["clients"] = Capacity(clients, RequestPolicy(default=1, min=1, step=1))
    return caps
