"""Server-side apply for the fake API server: ResourceClaim ``status.devices`` only (pure).

What a DRA driver's kubelet plugin sends: ``PATCH .../resourceclaims/<name>/status``
with ``Content-Type: application/apply-patch+yaml``, ``fieldManager=<manager>``
and usually ``force=true``, the body holding ``status.devices`` entries of its
own driver. Emulated, as the API server does it for this field:

* ``status.devices`` is a list map keyed by ``driver``, ``pool``, ``device``
  and ``shareID`` (``shareID`` optional): applied entries replace the stored
  entries with the same key, new keys are appended, other entries keep their
  place;
* ownership per field manager: an entry a manager applied before and leaves
  out now is removed, unless another manager also applied it; an empty list
  removes all of the manager's entries;
* an entry owned by another manager with a different value is a 409 conflict
  unless ``force`` is true, which moves ownership to the applier;
* ``fieldManager`` is required (400); ``apiVersion`` and ``kind`` are required
  (400); a ``metadata.uid`` that differs from the stored object's is 422 (the
  uid is immutable);
* validation (422): each entry names ``driver``, ``pool`` and ``device``, keys
  are unique, at most 8 conditions, ``data`` at most 10 KiB (as JSON), and the
  key matches a result of ``status.allocation`` (the API server's "must be an
  allocated device" rule).

NOT emulated: any other field (anything in the body besides ``apiVersion``,
``kind``, ``metadata.name/namespace/uid`` and ``status.devices`` is a 422 from
the fake, never silently accepted); field-level merging inside one entry (an
applied entry replaces the stored one whole); ``managedFields`` in the stored
object (ownership lives beside the store, keyed by object and uid); apply to
the main resource or to other kinds (415 as before); YAML bodies (the body
must be JSON, which every client sends as valid YAML); ``force`` values other
than ``true``/``false``; conflicts with non-apply writers (merge patches and
PUTs neither take nor check ownership).
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.fakekube_raw import copy_json
from tests.support.fakekube_types import FakeApiError, JsonObj, bad_request

APPLY_MEDIA_TYPE = "application/apply-patch+yaml"

DeviceKey = tuple[str, str, str, str]
"""(driver, pool, device, shareID or "")"""

Owners = dict[str, set[DeviceKey]]
"""Field manager -> the ``status.devices`` keys it applied last."""

_MAX_CONDITIONS = 8
_MAX_DATA_BYTES = 10 * 1024


def device_key(entry: Any) -> DeviceKey:
    if not isinstance(entry, dict):
        raise FakeApiError(422, f"status.devices: entry {entry!r} is not an object")
    missing = [k for k in ("driver", "pool", "device") if not entry.get(k)]
    if missing:
        raise FakeApiError(422, f"status.devices: entry {entry!r}: Required value: {missing}")
    return (
        str(entry["driver"]),
        str(entry["pool"]),
        str(entry["device"]),
        str(entry.get("shareID") or ""),
    )


def _allocated_keys(current: JsonObj) -> set[DeviceKey]:
    results = (((current.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or []
    return {
        (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")),
         str(r.get("shareID") or ""))
        for r in results
        if isinstance(r, dict)
    }  # fmt: skip


def _applied_entries(current: JsonObj, body: Any) -> list[JsonObj]:
    """The body's ``status.devices``, after the checks the fake makes on an apply body."""
    if not isinstance(body, dict):
        raise bad_request("an apply patch must be an object")
    for field in ("apiVersion", "kind"):
        if not body.get(field):
            raise bad_request(f"{field} must be set in an apply patch")
    extra = set(body) - {"apiVersion", "kind", "metadata", "status"}
    meta = body.get("metadata") or {}
    extra |= {f"metadata.{k}" for k in meta if k not in ("name", "namespace", "uid")}
    status = body.get("status") or {}
    extra |= {f"status.{k}" for k in status if k != "devices"}
    if extra:
        raise FakeApiError(
            422, f"fake API server: apply of {sorted(extra)} is not emulated (only status.devices)"
        )
    uid = meta.get("uid")
    if uid and uid != (current.get("metadata") or {}).get("uid"):
        raise FakeApiError(
            422,
            f"metadata.uid: Invalid value: {uid!r}: field is immutable "
            f"(the stored object's uid is {(current.get('metadata') or {}).get('uid')!r})",
        )
    devices = status.get("devices") or []
    if not isinstance(devices, list):
        raise FakeApiError(422, "status.devices: must be a list")
    return [copy_json(e) for e in devices]


def _validate(entries: list[JsonObj], allocated: set[DeviceKey]) -> list[DeviceKey]:
    keys: list[DeviceKey] = []
    for index, entry in enumerate(entries):
        key = device_key(entry)
        where = f"status.devices[{index}]"
        if key in keys:
            raise FakeApiError(422, f"{where}: Duplicate value: {key}")
        if key not in allocated:
            raise FakeApiError(
                422, f"{where}: Invalid value: {key}: must be an allocated device in the claim"
            )
        if len(entry.get("conditions") or []) > _MAX_CONDITIONS:
            raise FakeApiError(422, f"{where}.conditions: Too many: must have at most 8 items")
        if "data" in entry and len(json.dumps(entry["data"])) > _MAX_DATA_BYTES:
            raise FakeApiError(422, f"{where}.data: Too long: must have at most 10240 bytes")
        keys.append(key)
    return keys


def apply_claim_devices(
    current: JsonObj, body: Any, manager: str, owners: Owners, *, force: bool
) -> tuple[JsonObj, Owners]:
    """Apply ``body`` by ``manager`` to the stored claim ``current``.

    Returns the new object and the new ownership; neither argument is modified.
    """
    if not manager:
        raise bad_request("PATCH: fieldManager is required for apply requests")
    applied = _applied_entries(current, body)
    keys = _validate(applied, _allocated_keys(current))
    new = copy_json(current)
    status = new.setdefault("status", {})
    stored: list[JsonObj] = list(status.get("devices") or [])
    by_key = {device_key(e): e for e in stored}
    new_owners = {m: set(k) for m, k in owners.items()}
    mine = new_owners.setdefault(manager, set())
    conflicts = []
    for key, entry in zip(keys, applied, strict=True):
        others = [m for m, owned in new_owners.items() if m != manager and key in owned]
        if others and by_key.get(key) != entry:
            if not force:
                conflicts.append(f'conflict with "{others[0]}": .status.devices[{key}]')
                continue
            for other in others:
                new_owners[other].discard(key)
    if conflicts:
        raise FakeApiError(
            409, f"Apply failed with {len(conflicts)} conflict(s): {'; '.join(conflicts)}"
        )
    shared = set().union(*(k for m, k in new_owners.items() if m != manager))
    dropped = {k for k in mine - set(keys) if k not in shared}
    result: list[JsonObj] = []
    for entry in stored:
        key = device_key(entry)
        if key in dropped:
            continue
        result.append(applied[keys.index(key)] if key in keys else entry)
    result.extend(e for k, e in zip(keys, applied, strict=True) if k not in by_key)
    new_owners[manager] = set(keys)
    if result:
        status["devices"] = result
    else:
        status.pop("devices", None)
    return new, new_owners
