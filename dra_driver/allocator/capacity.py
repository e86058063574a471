"""Consumable capacity exactly as the scheduler computes it (dra-facts 6).

``consumed_capacity`` is ``calculateConsumedCapacity``, ``violates_policy`` is
``violatesPolicy`` and ``fits`` is ``CmpRequestOverCapacity``. Where the API server
dropped consumable capacity (before 1.36), the request policy comes from the int
attributes the slice builder publishes instead (``memoryUsable``, ``memoryMin``,
``memoryStep``, ``memoryDefault``, ``clientsMax``): see :func:`effective_capacity`.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from dra_driver.allocator.model import Capacity, Device, RequestPolicy


def _ceil_div(a: Fraction, b: Fraction) -> int:
    return -((-a) // b)


def consume_one(requested: Fraction | None, capacity: Capacity) -> Fraction:  # noqa: PLR0911
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
    requests: Mapping[str, Fraction], capacity: Mapping[str, Capacity]
) -> dict[str, Fraction]:
    """What one allocation consumes of every capacity key of the device."""
    return {key: consume_one(requests.get(key), cap) for key, cap in capacity.items()}


def violates_policy(value: Fraction, policy: RequestPolicy | None) -> bool:  # noqa: PLR0911
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
    requests: Mapping[str, Fraction],
    capacity: Mapping[str, Capacity],
    used: Mapping[str, Fraction],
) -> dict[str, Fraction] | str:
    """The consumption if it fits beside ``used`` (all shares so far), else the reason."""
    for key in requests:
        if key not in capacity:
            return f"no capacity {key!r}"
    consumed = consumed_capacity(requests, capacity)
    for key, amount in consumed.items():
        cap = capacity[key]
        if key in requests and violates_policy(amount, cap.policy):
            return f"{key} {amount} violates the request policy"
        if used.get(key, Fraction(0)) + amount > cap.value:
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

    def attr(name: str) -> Fraction | None:
        value = attrs.get(name)
        return Fraction(value) if isinstance(value, int) and not isinstance(value, bool) else None

    one, zero = Fraction(1), Fraction(0)
    caps = {
        "memory": Capacity(
            Fraction(usable),
            RequestPolicy(
                default=attr("memoryDefault"), min=attr("memoryMin"), step=attr("memoryStep")
            ),
        ),
        "computePercent": Capacity(Fraction(100), RequestPolicy(default=zero, min=zero, step=one)),
    }
    clients = attr("clientsMax")
    if clients is not None:
        caps["clients"] = Capacity(clients, RequestPolicy(default=one, min=one, step=one))
    return True, caps
