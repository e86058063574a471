"""A planned device in the checkpoint: the encoding of format version 2, and the
reading of version 1's.

Version 2 names the variant in ``mode`` and writes only the fields it has::

    {"mode": "mpsShare", "requestNames": [...], "poolName": ..., "deviceName": ...,
     "shareID": ..., "gpuUUID": ..., "cdiDeviceIDs": [...],
     "limits": {"memoryBytes": ..., "computePercent": ...},    # mpsShare, mpsInMig
     "grantShareID": ...,                                      # timeSliced, mpsShare; when set
     "mig": {"profileID": ..., "profileName": ..., "placementStart": ...,
             "placementSize": ..., "created": ...,             # migInstance, mpsInMig,
             "instance": {"uuid": ..., "giID": ..., "ciID": ...}}}  # admin; instance when made

Version 1 had one record for every mode: ``mode`` one of exclusive, shared
(time-sliced), mps (a share of a MIG instance when ``mig`` is set), mig, admin;
``limits``, ``mig`` and ``grantShareID`` null or absent where unused; a MIG
instance's ``migUUID``, ``giID`` and ``ciID`` flat in ``mig``, null until made.

Readers raise KeyError, TypeError or ValueError on a malformed device; the
checkpoint's decoder reports them as a malformed entry of the file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dra_driver.base.ids import DeviceName, GpuUUID, PoolName
from dra_driver.core.prepare import (
    Admin,
    CommonFields,
    Exclusive,
    MigInstance,
    MigInstanceIds,
    MigPlan,
    MpsInMig,
    MpsLimits,
    MpsShare,
    PlannedDevice,
    TimeSliced,
)

MODE_NAMES: Mapping[type[PlannedDevice], str] = {
    Exclusive: "exclusive",
    TimeSliced: "timeSliced",
    MpsShare: "mpsShare",
    MigInstance: "migInstance",
    MpsInMig: "mpsInMig",
    Admin: "admin",
}
"""Each variant's ``mode`` in format version 2."""


# --- version 2 --------------------------------------------------------------------


def device_to_json(d: PlannedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {
        "mode": MODE_NAMES[type(d)],
        "requestNames": list(d.request_names),
        "poolName": d.pool_name,
        "deviceName": d.device_name,
        "shareID": d.share_id,
        "gpuUUID": d.gpu_uuid,
        "cdiDeviceIDs": list(d.cdi_device_ids),
    }
    match d:
        case TimeSliced(grant_share_id=grant) if grant:
            out["grantShareID"] = grant
        case MpsShare(limits=limits, grant_share_id=grant):
            out["limits"] = _limits_to_json(limits)
            if grant:
                out["grantShareID"] = grant
        case MpsInMig(limits=limits, mig=mig):
            out["limits"] = _limits_to_json(limits)
            out["mig"] = _mig_to_json(mig)
        case MigInstance(mig=mig) | Admin(mig=MigPlan() as mig):
            out["mig"] = _mig_to_json(mig)
        case _:
            pass
    return out


def _limits_to_json(limits: MpsLimits) -> dict[str, Any]:
    return {"memoryBytes": limits.memory_bytes, "computePercent": limits.compute_percent}


def _mig_to_json(m: MigPlan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "profileID": m.profile_id,
        "profileName": m.profile_name,
        "placementStart": m.placement_start,
        "placementSize": m.placement_size,
        "created": m.created,
    }
    if m.instance is not None:
        out["instance"] = {
            "uuid": m.instance.uuid,
            "giID": m.instance.gi_id,
            "ciID": m.instance.ci_id,
        }
    return out


def device_from_json(raw: Mapping[str, Any]) -> PlannedDevice:
    at = _where(raw)
    match raw["mode"]:
        case "exclusive":
            return Exclusive(*at)
        case "timeSliced":
            return TimeSliced(*at, grant_share_id=raw.get("grantShareID"))
        case "mpsShare":
            limits = _limits_from_json(raw["limits"])
            return MpsShare(*at, limits=limits, grant_share_id=raw.get("grantShareID"))
        case "migInstance":
            return MigInstance(*at, mig=_mig_from_json(raw["mig"], _instance_v2))
        case "mpsInMig":
            limits = _limits_from_json(raw["limits"])
            return MpsInMig(*at, limits=limits, mig=_mig_from_json(raw["mig"], _instance_v2))
        case "admin":
            mig = raw.get("mig")
            return Admin(*at, mig=_mig_from_json(mig, _instance_v2) if mig else None)
        case mode:
            raise ValueError(f"device {raw.get('deviceName')!r} has an unknown mode {mode!r}")


def _instance_v2(raw: Mapping[str, Any]) -> MigInstanceIds | None:
    ids = raw.get("instance")
    if ids is None:
        return None
    return MigInstanceIds(str(ids["uuid"]), int(ids["giID"]), int(ids["ciID"]))


# --- version 1 --------------------------------------------------------------------


def device_from_v1(raw: Mapping[str, Any]) -> PlannedDevice:
    """A device as format version 1 recorded it, as the variant its fields say it is."""
    at = _where(raw)
    mig = _mig_from_json(m, _instance_v1) if (m := raw.get("mig")) else None
    limits = _limits_from_json(lim) if (lim := raw.get("limits")) else None
    grant = raw.get("grantShareID")
    match raw.get("mode", "exclusive"), mig, limits:
        case "exclusive", _, _:
            return Exclusive(*at)
        case "shared", _, _:
            return TimeSliced(*at, grant_share_id=grant)
        case "mps", None, MpsLimits() as share:
            return MpsShare(*at, limits=share, grant_share_id=grant)
        case "mps", MigPlan() as instance, MpsLimits() as share:
            return MpsInMig(*at, limits=share, mig=instance)
        case "mig", MigPlan() as instance, _:
            return MigInstance(*at, mig=instance)
        case "admin", _, _:
            return Admin(*at, mig=mig)
        case mode, _, _:
            raise ValueError(
                f"device {raw.get('deviceName')!r}: mode {mode!r} with "
                f"{'no ' if mig is None else ''}mig and {'no ' if limits is None else ''}limits"
            )


def _instance_v1(raw: Mapping[str, Any]) -> MigInstanceIds | None:
    uuid, gi_id, ci_id = raw.get("migUUID"), raw.get("giID"), raw.get("ciID")
    if uuid is None and gi_id is None and ci_id is None:
        return None
    if uuid is None or gi_id is None or ci_id is None:
        raise ValueError(f"a MIG instance with only some of its ids ({uuid}, {gi_id}, {ci_id})")
    return MigInstanceIds(str(uuid), int(gi_id), int(ci_id))


# --- both ---------------------------------------------------------------------------


def _where(raw: Mapping[str, Any]) -> CommonFields:
    return (
        tuple(raw.get("requestNames") or ()),
        PoolName(raw["poolName"]),
        DeviceName(raw["deviceName"]),
        raw.get("shareID"),
        GpuUUID(raw.get("gpuUUID") or ""),
        tuple(raw.get("cdiDeviceIDs") or ()),
    )


def _limits_from_json(raw: Mapping[str, Any]) -> MpsLimits:
    return MpsLimits(int(raw["memoryBytes"]), int(raw["computePercent"]))


def _mig_from_json(
    raw: Mapping[str, Any], instance: Callable[[Mapping[str, Any]], MigInstanceIds | None]
) -> MigPlan:
    return MigPlan(
        profile_id=int(raw["profileID"]),
        profile_name=str(raw["profileName"]),
        placement_start=int(raw["placementStart"]),
        placement_size=int(raw["placementSize"]),
        instance=instance(raw),
        created=bool(raw.get("created", False)),
    )
