"""What a claim holds on a device: the planned device, one variant per mode (pure).

A planned device is one of six frozen records, each with only the fields its
mode has, and code that depends on the mode dispatches with ``match``:

- :class:`Exclusive`: the whole GPU, held by this claim alone;
- :class:`TimeSliced`: a time-sliced share of a GPU (its nodes, no limits);
- :class:`MpsShare`: an MPS share of a GPU, with the limits its daemon holds;
- :class:`MigInstance`: a MIG device, held by this claim alone;
- :class:`MpsInMig`: an MPS share of a MIG instance (a client of the instance's daemon);
- :class:`Admin`: adminAccess, monitoring access that holds nothing.

:class:`Mode` is each variant's public name, as the claim's ``status.devices``
data and the logs spell it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from dra_driver.base.ids import ClaimUID, DeviceName, GpuUUID, PoolName
from dra_driver.core.cdi import CdiSpec


class Mode(enum.StrEnum):
    """A planned device's mode as users read it (claim status ``data.mode``, logs).

    The values are an API (a claim's status shows them), so they stay as they
    were when the device model was one record: a time-sliced share is "shared",
    and an MPS share inside a MIG instance is "mps" (its ``mig`` says where).
    """

    EXCLUSIVE = "exclusive"
    TIME_SLICED = "shared"
    MPS = "mps"
    MIG = "mig"
    ADMIN = "admin"


@dataclass(frozen=True)
class MpsLimits:
    """The limits an MPS daemon holds for one share."""

    memory_bytes: int
    compute_percent: int
    """0: no SM cap."""


@dataclass(frozen=True)
class MigInstanceIds:
    """What names a MIG instance that exists: its UUID and its GPU and compute instance ids."""

    uuid: str
    gi_id: int
    ci_id: int


@dataclass(frozen=True)
class MigPlan:
    """The MIG instance a device is: its profile and placement, and the instance once it exists."""

    profile_id: int
    profile_name: str
    placement_start: int
    placement_size: int
    instance: MigInstanceIds | None = None
    """Set when the instance exists; None: the engine creates it at prepare."""
    created: bool = False
    """We created the instance at prepare (and destroy it at unprepare)."""

    @property
    def mig_uuid(self) -> str | None:
        return self.instance.uuid if self.instance is not None else None


@dataclass(frozen=True)
class _Planned:
    """What every planned device has: where it is and how containers reach it."""

    mode: ClassVar[Mode]
    request_names: tuple[str, ...]
    pool_name: PoolName
    device_name: DeviceName
    share_id: str | None
    """The allocation's shareID (part of the device's identity and of its CDI name)."""
    gpu_uuid: GpuUUID
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Exclusive(_Planned):
    """The whole GPU, held by this claim alone."""

    mode: ClassVar[Mode] = Mode.EXCLUSIVE


@dataclass(frozen=True)
class TimeSliced(_Planned):
    """A time-sliced share of a GPU: the GPU's nodes, no limits."""

    mode: ClassVar[Mode] = Mode.TIME_SLICED
    grant_share_id: str | None = None
    """A share without ``shareID`` (1.34/1.35 API servers drop it): the shareID of
    the controller's ``GpuShareGrant`` for it, its stable identity on the node."""


@dataclass(frozen=True)
class MpsShare(_Planned):
    """An MPS share of a GPU: memory and SM limits held by the GPU's MPS daemon."""

    mode: ClassVar[Mode] = Mode.MPS
    limits: MpsLimits
    grant_share_id: str | None = None
    """As :attr:`TimeSliced.grant_share_id`."""

    @property
    def share_key(self) -> str | None:
        """What names this share on the node (its MPS namespace at the mps-agent):
        the shareID, else the grant's."""
        return self.share_id or self.grant_share_id


@dataclass(frozen=True)
class MigInstance(_Planned):
    """A MIG device: hardware isolation, held by this claim alone."""

    mode: ClassVar[Mode] = Mode.MIG
    mig: MigPlan


@dataclass(frozen=True)
class MpsInMig(_Planned):
    """An MPS share of a MIG instance: a client of the daemon for that instance."""

    mode: ClassVar[Mode] = Mode.MPS
    limits: MpsLimits
    mig: MigPlan

    @property
    def share_key(self) -> str | None:
        """As :attr:`MpsShare.share_key` (a share of a MIG instance always has a shareID)."""
        return self.share_id


@dataclass(frozen=True)
class Admin(_Planned):
    """adminAccess: monitoring access that holds nothing."""

    mode: ClassVar[Mode] = Mode.ADMIN
    mig: MigPlan | None = None
    """The MIG device it watches; None: a whole GPU."""


CommonFields = tuple[tuple[str, ...], PoolName, DeviceName, str | None, GpuUUID, tuple[str, ...]]
"""Every variant's first fields, in order (requests, pool, device, shareID, GPU, CDI ids):
a builder that knows them before it knows the mode writes ``Variant(*common, ...)``."""

PlannedDevice = Exclusive | TimeSliced | MpsShare | MigInstance | MpsInMig | Admin
"""One device of a claim's plan (and of its checkpoint entry)."""

MpsDevice = MpsShare | MpsInMig
"""The MPS shares: what the mps-agent serves."""


@dataclass(frozen=True)
class PreparePlan:
    claim_uid: ClaimUID
    devices: tuple[PlannedDevice, ...]
    cdi_spec: CdiSpec


@dataclass(frozen=True)
class HeldDevice:
    """A device held by an already-prepared claim (from the checkpoint), for the plan's guards."""

    claim_uid: ClaimUID
    device: PlannedDevice


def mig_of(device: PlannedDevice) -> MigPlan | None:
    """The MIG instance ``device`` is, or is a share of, or watches; None: a whole GPU."""
    match device:
        case MigInstance(mig=mig) | MpsInMig(mig=mig):
            return mig
        case Admin(mig=mig):
            return mig
        case _:
            return None


def limits_of(device: PlannedDevice) -> MpsLimits | None:
    """An MPS share's limits; None for every other mode."""
    match device:
        case MpsShare(limits=limits) | MpsInMig(limits=limits):
            return limits
        case _:
            return None


def shares_memory(shares: Iterable[MpsDevice]) -> int:
    """The memory of MPS shares that are one namespace: the sum of their limits.

    All of a claim's shares of one GPU (or one MIG instance) are one MPS
    namespace at the agent, and the claim's containers get this sum as their
    dmem limit.
    """
    return sum(share.limits.memory_bytes for share in shares)
