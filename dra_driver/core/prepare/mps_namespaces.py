"""A claim's MPS namespaces at the mps-agent, from its planned devices (pure).

All of a claim's MPS shares of one GPU are one namespace at the GPU's daemon (a
container sees one pipe directory), with the sum of their memory limits and of
their SM caps (none if any share has none). Shares inside one MIG instance are
one namespace at the daemon for that instance, named by the instance's MIG
UUID. A namespace's key is its lowest share key (the shareID, or the grant's
for shares known by their grant; :attr:`MpsShare.share_key`).

The engine computes these when it applies a plan and again, from the devices
the checkpoint records, when it releases one; both give the same namespaces,
so the checkpoint records none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dra_driver.base.ids import DeviceName, GpuUUID
from dra_driver.core.prepare.devices import (
    MpsDevice,
    MpsInMig,
    MpsShare,
    PlannedDevice,
    shares_memory,
)


@dataclass(frozen=True)
class MpsNamespace:
    """One namespace a claim holds at an MPS daemon: its shares of one GPU or MIG instance."""

    gpu_uuid: GpuUUID
    """The GPU the shares are on."""
    device_name: DeviceName
    """The first of the shares' devices (what messages name)."""
    key: str | None
    """The agent's key for the namespace; None: no share has one (a stale allocation)."""
    memory_limit_bytes: int
    active_thread_percentage: int
    """The SM cap: the shares' caps summed (at most 100), 100 if one share has none."""
    mig_device: DeviceName | None = None
    """Shares inside a MIG instance: the instance's device; None: shares of a whole GPU."""
    mig_uuid: str | None = None
    """Shares inside a MIG instance: its UUID, None until the engine made the instance."""

    @property
    def daemon_uuid(self) -> str | None:
        """What names the daemon: the GPU's UUID, or the MIG instance's (None: not made yet)."""
        return self.gpu_uuid if self.mig_device is None else self.mig_uuid


def _namespace(group: Sequence[MpsDevice], mig_device: DeviceName | None) -> MpsNamespace:
    first = group[0]
    percents = [d.limits.compute_percent for d in group]
    return MpsNamespace(
        gpu_uuid=first.gpu_uuid,
        device_name=first.device_name,
        key=min((k for d in group if (k := d.share_key)), default=None),
        memory_limit_bytes=shares_memory(group),
        active_thread_percentage=100 if 0 in percents else min(100, sum(percents)),
        mig_device=mig_device,
        mig_uuid=first.mig.mig_uuid if isinstance(first, MpsInMig) else None,
    )


def mps_namespaces(devices: Sequence[PlannedDevice]) -> tuple[MpsNamespace, ...]:
    """The namespaces ``devices`` (one claim's) hold: per GPU in UUID order, then per
    MIG instance in device-name order."""
    gpus: dict[GpuUUID, list[MpsDevice]] = {}
    instances: dict[DeviceName, list[MpsDevice]] = {}
    for d in devices:
        match d:
            case MpsShare():
                gpus.setdefault(d.gpu_uuid, []).append(d)
            case MpsInMig():
                instances.setdefault(d.device_name, []).append(d)
            case _:
                pass
    return (
        *(_namespace(gpus[uuid], None) for uuid in sorted(gpus)),
        *(_namespace(instances[name], name) for name in sorted(instances)),
    )


def mps_daemon_conflict(namespaces: Sequence[MpsNamespace]) -> str | None:
    """Why a claim's MPS shares cannot be served, or None: they are on several daemons.

    Each GPU and each MIG instance has its own MPS daemon and pipe directory, and a
    CUDA client has one ``CUDA_MPS_PIPE_DIRECTORY`` (NVIDIA MPS docs, "Appendix:
    Environment Variables"), so it reaches one daemon: a container given the
    claim's devices could use one GPU's share and would silently run without MPS
    limits, or not at all, on the others. Refused at prepare, before any side
    effect. (Shares of two GPUs in two claims of one container are not visible
    to a prepare, which sees one claim.)
    """
    if len(namespaces) < 2:
        return None
    names = ", ".join(sorted(ns.mig_device or ns.device_name for ns in namespaces))
    return (
        f"its MPS shares are on {len(namespaces)} GPUs or MIG instances ({names}), each "
        "with its own MPS daemon and pipe directory, and a CUDA client has one "
        "CUDA_MPS_PIPE_DIRECTORY, so a container could reach only one of them; ask for "
        "MPS shares of one GPU (or one MIG instance) per claim, one claim per GPU"
    )


def namespace_of(namespaces: Sequence[MpsNamespace], device: MpsDevice) -> MpsNamespace:
    """The namespace of ``namespaces`` that MPS share ``device`` is part of.

    Raises ValueError when there is none (``device`` is not one of the shares
    ``namespaces`` were computed from).
    """
    for ns in namespaces:
        match device:
            case MpsShare() if ns.mig_device is None and ns.gpu_uuid == device.gpu_uuid:
                return ns
            case MpsInMig() if ns.mig_device == device.device_name:
                return ns
            case _:
                pass
    raise ValueError(f"{device.device_name} is in none of the claim's MPS namespaces")


def owned_shares(devices: Sequence[PlannedDevice]) -> list[tuple[str, str]]:
    """(daemon UUID, key) of every namespace ``devices`` hold at the agent: a GPU's
    UUID, or a MIG instance's (an instance not made yet holds none)."""
    return [
        (daemon, ns.key)
        for ns in mps_namespaces(devices)
        if (daemon := ns.daemon_uuid) is not None and ns.key is not None
    ]
