"""The plan's guards of the node (pure): a device is never given out twice, and MPS
shares prepared on one device fit its memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dra_driver.base.errors import AllocationError, OvercommitError
from dra_driver.base.ids import DeviceName
from dra_driver.base.quantity import format_bytes
from dra_driver.core.model import DeviceResult, ResourceClaim
from dra_driver.core.prepare.devices import (
    Admin,
    Exclusive,
    HeldDevice,
    MigInstance,
    MpsInMig,
    MpsLimits,
    MpsShare,
    PlannedDevice,
    shares_memory,
)
from dra_driver.core.settings import NodeSettings


def _holds_alone(device: PlannedDevice) -> bool:
    return isinstance(device, Exclusive | MigInstance)


def check_conflicts(
    claim: ResourceClaim,
    device: PlannedDevice,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]],
) -> None:
    """The node is the last line of defence against a device given out twice."""
    if isinstance(device, Admin):
        return
    for held in in_use.get(device.device_name, ()):
        if held.claim_uid == claim.ref.uid or isinstance(held.device, Admin):
            continue
        if _holds_alone(device) or _holds_alone(held.device):
            raise AllocationError(
                claim.ref,
                f"device {device.device_name} is already prepared for claim {held.claim_uid} "
                f"({held.device.mode.value}); refusing to give it out twice",
            )


def check_own_results(
    claim: ResourceClaim, groups: Mapping[tuple[DeviceName, str | None], Sequence[DeviceResult]]
) -> None:
    """A device held exclusively cannot also be one of the claim's shares."""
    uses: dict[DeviceName, int] = {}
    exclusive: set[DeviceName] = set()
    for (device, _), group in groups.items():
        uses[device] = uses.get(device, 0) + 1
        if any(not r.share_id and not r.admin_access for r in group):
            exclusive.add(device)
    for device in sorted(exclusive):
        if uses[device] > 1:
            raise AllocationError(
                claim.ref,
                f"the allocation holds device {device} both exclusively and as a share; "
                "delete the claim so it is allocated again",
            )


def check_fits(
    claim: ResourceClaim,
    *,
    device: DeviceName,
    usable: int,
    limits: MpsLimits,
    settings: NodeSettings,
    in_use: Mapping[DeviceName, Sequence[HeldDevice]],
) -> None:
    """MPS shares prepared on one device (a GPU or a MIG instance) must fit its usable
    memory (overcommit guard)."""
    others = [
        held.device
        for held in in_use.get(device, ())
        if isinstance(held.device, MpsShare | MpsInMig) and held.claim_uid != claim.ref.uid
    ]
    overhead = settings.mps_context_overhead_bytes
    prepared = shares_memory(others) + overhead * len(others)
    if prepared + limits.memory_bytes + overhead > usable:
        raise OvercommitError(
            claim.ref,
            f"{device} cannot hold this share: {len(others)} share(s) already prepared there "
            f"hold {format_bytes(prepared)} (with {format_bytes(overhead)} overhead each), "
            f"this one asks {format_bytes(limits.memory_bytes)} + {format_bytes(overhead)}, "
            f"and {format_bytes(usable)} are usable; nothing was changed",
        )
