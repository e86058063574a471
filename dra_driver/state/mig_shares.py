"""Who destroys a MIG instance that MPS shares use: the last claim to leave it (pure).

Several claims can be MPS clients of one MIG instance. The first prepare of a
share of a free placement creates the instance (its checkpoint entry records
``mig.created``); later shares join it (:func:`~dra_driver.core.prepare.plan_prepare`
takes the instance from the checkpoint, ``created`` false). The instance must
outlive every share, so ownership moves with the shares: when a claim leaves
(unprepare, or a half-done prepare rolled back at start-up) while other claims
still hold shares of the same instance, :func:`hand_over` moves its ``created``
to them and strips it from the leaving entry, which then releases only its MPS
share. The claim that leaves last still has ``created`` and destroys the
instance. An instance that existed before (nobody's ``created``) is never
destroyed.

The refcount is the checkpoint itself, so it is crash-safe with the two-phase
checkpoint: the engine writes the handed-over entries in the same atomic save
that drops the leaving claim, before any side effect runs. A claim whose side
effects are still running when an instance is handed to it records its
completion later from what it knew before; :func:`keep_handed_over` keeps the
``created`` it got meanwhile.
"""

from __future__ import annotations

import dataclasses

from dra_driver.base.ids import DeviceName, GpuUUID
from dra_driver.core.prepare import MigPlan, MpsInMig, PlannedDevice
from dra_driver.state.checkpoint import Checkpoint, CheckpointClaim


def _instance_key(device: PlannedDevice) -> tuple[GpuUUID, DeviceName] | None:
    """(GPU, MIG device name) of an MPS share inside a MIG instance; None otherwise."""
    match device:
        case MpsInMig():
            return device.gpu_uuid, device.device_name
        case _:
            return None


def hand_over(leaving: CheckpointClaim, rest: Checkpoint) -> tuple[CheckpointClaim, Checkpoint]:
    """``leaving`` as it must be released, and ``rest`` with the instances it hands over.

    ``rest`` is the checkpoint without ``leaving``. For each of ``leaving``'s MPS
    shares inside a MIG instance that a claim in ``rest`` also uses: the leaving
    share keeps no ``created`` (and takes the instance's identity from the others
    when it never learnt it), and if it had ``created`` every remaining share of
    the instance gets it. Nothing else changes.
    """
    devices = list(leaving.devices)
    claims = dict(rest.claims)
    for i, device in enumerate(devices):
        if not isinstance(device, MpsInMig):
            continue
        key = _instance_key(device)
        holders = [
            (uid, j, other)
            for uid, claim in sorted(claims.items())
            for j, other in enumerate(claim.devices)
            if isinstance(other, MpsInMig) and _instance_key(other) == key
        ]
        if not holders:
            continue  # the last one: it destroys the instance if it (or a predecessor) made it
        known = next((o.mig for _, _, o in holders if o.mig.instance is not None), None)
        if device.mig.created:
            for uid, j, other in holders:
                inherited = dataclasses.replace(other, mig=_inherit(other, device))
                claims[uid] = _with_device(claims[uid], j, inherited)
        mine = device.mig
        if mine.instance is None and known is not None:
            mine = dataclasses.replace(known, created=False)
        devices[i] = dataclasses.replace(device, mig=dataclasses.replace(mine, created=False))
    handed = dataclasses.replace(leaving, devices=tuple(devices))
    return handed, dataclasses.replace(rest, claims=claims)


def _inherit(holder: MpsInMig, leaving: MpsInMig) -> MigPlan:
    """The holder's instance, now marked as ours to destroy."""
    mig = holder.mig if holder.mig.instance is not None else leaving.mig
    return dataclasses.replace(mig, created=True)


def _with_device(claim: CheckpointClaim, index: int, device: PlannedDevice) -> CheckpointClaim:
    devices = list(claim.devices)
    devices[index] = device
    return dataclasses.replace(claim, devices=tuple(devices))


def keep_handed_over(new: CheckpointClaim, current: CheckpointClaim | None) -> CheckpointClaim:
    """``new`` (a claim's entry about to be recorded) with the ``created`` that
    ``current`` (its entry in the checkpoint now) got from :func:`hand_over` meanwhile."""
    if current is None:
        return new
    inherited = {
        (d.device_name, d.share_id)
        for d in current.devices
        if isinstance(d, MpsInMig) and d.mig.created
    }
    if not inherited:
        return new
    devices = tuple(
        dataclasses.replace(d, mig=dataclasses.replace(d.mig, created=True))
        if isinstance(d, MpsInMig) and (d.device_name, d.share_id) in inherited
        else d
        for d in new.devices
    )
    return dataclasses.replace(new, devices=devices)
