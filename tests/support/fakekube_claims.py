"""What the API server checks of a ResourceClaim's ``status.reservedFor`` on a
``/status`` write (kubernetes ``pkg/apis/resource/validation``:
``validateResourceClaimConsumers`` and ``ValidateResourceClaimStatusUpdate``), pure:

* each entry needs ``resource``, ``name`` and ``uid`` (Required);
* no two entries with one ``uid`` (Duplicate);
* at most 256 entries (``ResourceClaimReservedForMaxSize``);
* no entries without ``status.allocation`` (Forbidden);
* no new entries once the claim is being deleted (Forbidden).

The status strategy resets a ``/status`` write's metadata to the stored one (the store
keeps the stored metadata), so a finalizer sent there is ignored, not refused.
"""

from __future__ import annotations

from typing import Any

from tests.support.fakekube_types import FakeApiError, ResourceKind

JsonObj = dict[str, Any]

RESERVED_FOR_MAX = 256


def reserved_for_errors(old: JsonObj, new: JsonObj) -> list[str]:
    """The field errors of ``new``'s ``status.reservedFor`` (``old``: the stored claim)."""
    status = new.get("status") or {}
    entries = status.get("reservedFor") or []
    errors: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        path = f"status.reservedFor[{i}]"
        uid = str(entry.get("uid") or "")
        if uid and uid in seen:
            errors.append(f'{path}.uid: Duplicate value: "{uid}"')
            continue
        seen.add(uid)
        errors += [
            f"{path}.{key}: Required value"
            for key in ("resource", "name", "uid")
            if not entry.get(key)
        ]
    if len(entries) > RESERVED_FOR_MAX:
        errors.append(f"status.reservedFor: Too long: must have at most {RESERVED_FOR_MAX} items")
    if entries and not status.get("allocation"):
        errors.append(
            "status.reservedFor: Forbidden: may not be specified when `allocated` is not set"
        )
    elif entries and (new.get("metadata") or {}).get("deletionTimestamp"):
        before = {str(e.get("uid")) for e in (old.get("status") or {}).get("reservedFor") or []}
        if any(str(e.get("uid")) not in before for e in entries):
            errors.append(
                "status.reservedFor: Forbidden: new entries may not be added while"
                " `deallocationRequested` or `deletionTimestamp` are set"
            )
    return errors


def check_claim_status(kind: ResourceKind, name: str, old: JsonObj, new: JsonObj) -> None:
    """422 Invalid, as the API server answers, when ``new``'s ``reservedFor`` breaks a rule."""
    if kind.kind != "ResourceClaim":
        return
    errors = reserved_for_errors(old, new)
    if errors:
        raise FakeApiError(
            422,
            f'{kind.kind}.{kind.group} "{name}" is invalid: ' + ", ".join(errors),
            kind=kind,
            name=name,
        )
