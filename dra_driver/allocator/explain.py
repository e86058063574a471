"""Why a claim fits nowhere, in words a user can act on (pure).

The search only says "no placement"; this looks again at the candidates and
names the first thing that stops the claim, from the outside in: no device of
ours is published for the controller at all (the fix is a setting), none is on
a node the pod may use, none matches the request's class and selectors, or the
matching ones are full, and then on the best candidate what is full (memory,
computePercent, clients, or the device held whole).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from dra_driver.allocator.capacity import consumed_capacity, effective_capacity
from dra_driver.allocator.ledger import Ledger
from dra_driver.allocator.model import Claim, Device
from dra_driver.base.quantity import Amount, format_bytes

NO_CONTROLLER_DEVICES = (
    "no GPU of driver {driver} is published for the controller: every node's GPUs "
    "are allocated by the kube-scheduler (the kubelet plugin's allocator setting). "
    "Give GPUs to the controller with the Helm value nodeSettings.defaults.allocator="
    "controller (or per node or GPU under nodeSettings.perNode; kubelet plugin flag "
    "--allocator controller), or on Kubernetes 1.36+ ask the class {driver} instead, "
    "which the scheduler allocates and shares natively"
)


def unfit_reason(
    claim: Claim,
    *,
    driver: str,
    devices: Sequence[Device],
    ledger: Ledger,
    usable: Callable[[Device], bool],
    matching: Sequence[int],
    requested: Mapping[str, Amount] | None,
) -> str:
    """The reason for a claim that found no placement.

    ``matching``: positions in ``devices`` that match a request's class and
    selectors (and tolerate their taints); ``requested``: the capacity a claim
    of one request asks (None for other claims, whose devices must fit together).
    """
    where = f"claim {claim.namespace}/{claim.name}"
    if not devices:
        return f"cannot allocate {where}: " + NO_CONTROLLER_DEVICES.format(driver=driver)
    reachable = sum(1 for d in devices if usable(d))
    if not reachable:
        nodes = sorted({d.node_name or "-" for d in devices})
        return (
            f"cannot allocate {where}: none of the {len(devices)} controller-managed GPU(s) "
            f"is on a node the claim's pods may use (nodes with such GPUs: {', '.join(nodes)})"
        )
    candidates = [i for i in matching if usable(devices[i])]
    if not candidates:
        return (
            f"cannot allocate {where}: none of the {reachable} controller-managed "
            "GPU(s) on the nodes its pods may use matches the request's device class and "
            "selectors (or tolerates their taints)"
        )
    if requested is None:
        return (
            f"cannot allocate {where}: no node has controller-managed devices that match "
            f"and fit every request together ({len(candidates)} matching GPU(s) checked)"
        )
    best = max(candidates, key=lambda i: _free_memory(devices[i], ledger))
    return (
        f"cannot allocate {where}: {len(candidates)} matching GPU(s) are full; best "
        f"candidate {describe_use(devices[best], ledger, requested)}"
    )


def _free_memory(device: Device, ledger: Ledger) -> Amount:
    """The device's memory less its shares' (-1: no memory, or held whole). Read for
    every matching device of a claim that fits nowhere: no object made per device."""
    memory = effective_capacity(device)[1].get("memory")
    if memory is None:
        return -1
    use = ledger.devices.get(device.key)
    if use is None:
        return memory.value
    if use.exclusive:
        return -1
    return memory.value - use.consumed.get("memory", 0)


def describe_use(device: Device, ledger: Ledger, requested: Mapping[str, Amount]) -> str:
    """``node/device``: what is free of each capacity and why the request does not fit."""
    name = f"{device.node_name or '-'}/{device.name}"
    use = ledger.use(device.key)
    shareable, caps = effective_capacity(device)
    if use.exclusive:
        return f"{name} is held whole by another claim"
    if not shareable:
        return f"{name} is not shareable and already in use"
    parts = []
    for key in sorted(caps):
        total, used = caps[key].value, use.consumed.get(key, 0)
        parts.append(f"{key} {_amount(key, total - used)} of {_amount(key, total)} free")
    missing = sorted(k for k in requested if k not in caps)
    if missing:
        return f"{name} has no capacity {', '.join(missing)}"
    wanted = consumed_capacity(requested, caps)
    short = [k for k, v in sorted(wanted.items()) if use.consumed.get(k, 0) + v > caps[k].value]
    asked = ", ".join(f"{k} {_amount(k, v)}" for k, v in sorted(wanted.items()) if v)
    why = f"; not enough {' and '.join(short)}" if short else ""
    return f"{name}: {', '.join(parts)} (the claim takes {asked or 'nothing'}){why}"


def _amount(key: str, value: Amount) -> str:
    whole = int(value)
    return format_bytes(whole) if key == "memory" else str(whole)
