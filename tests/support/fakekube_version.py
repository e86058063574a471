"""Which Kubernetes release the fake API server plays: ``/version`` and gated DRA fields.

A real kube-apiserver drops the fields of disabled feature gates from new
objects before it validates and stores them, without an error (the Go slice
controller reports them as "dropped fields"). :class:`ServerVersion` applies
the same to the fake's writes (create, update, patch, dry run included), for
the DRA gates that are beta (on) in 1.36 and alpha (off) in 1.34 and 1.35:
DRAConsumableCapacity, DRAPartitionableDevices, DRADeviceTaints,
DRADeviceBindingConditions and DRAExtendedResource (``dra-facts.md`` section 4).

Emulated for ``drop_gated_fields=True`` (the default below 1.36):

* ResourceSlice: ``spec.sharedCounters``, ``spec.perDeviceNodeSelection`` and,
  per device, ``allowMultipleAllocations``, ``capacity.*.requestPolicy``,
  ``consumesCounters``, ``taints``, ``nodeName``/``nodeSelector``/``allNodes``,
  ``bindsToNode``, ``bindingConditions``, ``bindingFailureConditions``;
* ResourceClaim: ``spec.devices.requests[].exactly.{capacity,tolerations}``,
  the same under ``firstAvailable[]``, ``spec.devices.constraints[].distinctAttribute``,
  ``status.allocation.devices.results[].{shareID,consumedCapacity,
  bindingConditions,bindingFailureConditions}`` and ``status.devices[].shareID``;
* DeviceClass: ``spec.extendedResourceName``.

Validated (422 Invalid) from 1.35 on, after dropping, as the real server
orders it: a ResourceSlice may not have both ``devices`` and ``sharedCounters``.

Defaulted, as the real server does on create and update: a ResourceSlice
device taint without ``timeAdded`` gets the current time (RFC 3339, seconds).

NOT emulated: the real rule that an update keeps a disabled field the stored
object already uses (here it is dropped on every write); any other field
validation (limits, name grammar, request-policy alignment, references from
``consumesCounters`` to counter sets); gates of other releases (1.37 alpha
fields are always kept); per-gate switches (all listed gates go together).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tests.support.fakekube_schema import check_schema
from tests.support.fakekube_types import FakeApiError, JsonObj, ResourceKind

_Path = tuple[str, ...]
"""Keys from the object root; ``[]`` steps into every list item, ``*`` into every map value."""

_DEVICE = ("spec", "devices", "[]")
_RESULT = ("status", "allocation", "devices", "results", "[]")
_REQUEST = ("spec", "devices", "requests", "[]")

GATED_FIELDS: dict[str, tuple[_Path, ...]] = {
    "ResourceSlice": (
        ("spec", "sharedCounters"),
        ("spec", "perDeviceNodeSelection"),
        (*_DEVICE, "allowMultipleAllocations"),
        (*_DEVICE, "capacity", "*", "requestPolicy"),
        (*_DEVICE, "consumesCounters"),
        (*_DEVICE, "taints"),
        (*_DEVICE, "nodeName"),
        (*_DEVICE, "nodeSelector"),
        (*_DEVICE, "allNodes"),
        (*_DEVICE, "bindsToNode"),
        (*_DEVICE, "bindingConditions"),
        (*_DEVICE, "bindingFailureConditions"),
    ),
    "ResourceClaim": (
        (*_REQUEST, "exactly", "capacity"),
        (*_REQUEST, "exactly", "tolerations"),
        (*_REQUEST, "firstAvailable", "[]", "capacity"),
        (*_REQUEST, "firstAvailable", "[]", "tolerations"),
        ("spec", "devices", "constraints", "[]", "distinctAttribute"),
        (*_RESULT, "shareID"),
        (*_RESULT, "consumedCapacity"),
        (*_RESULT, "bindingConditions"),
        (*_RESULT, "bindingFailureConditions"),
        ("status", "devices", "[]", "shareID"),
    ),
    "DeviceClass": (("spec", "extendedResourceName"),),
}
"""Per Kind, the fields a 1.34/1.35 API server drops with its default gates."""


@dataclass(frozen=True)
class ServerVersion:
    """The release the fake plays; pure, so it is tested without a server."""

    minor: int = 36
    """Kubernetes ``1.<minor>``, served at ``/version``."""
    drop_gated_fields: bool | None = None
    """Drop the fields in :data:`GATED_FIELDS`; ``None``: below 1.36, as the default gates do."""
    binary_minor: int | None = None
    """A newer binary emulating 1.<minor> (``--emulated-version``): ``/version`` says
    ``minor`` of the binary and ``emulationMinor`` of ``minor``, as a real one does."""

    @property
    def drops_gated_fields(self) -> bool:
        if self.drop_gated_fields is None:
            return self.minor < 36
        return self.drop_gated_fields

    def version_info(self) -> JsonObj:
        """The ``/version`` body (``version.Info``)."""
        binary = self.binary_minor or self.minor
        emulation = (
            {"emulationMajor": "1", "emulationMinor": str(self.minor)}
            if self.binary_minor is not None
            else {}
        )
        return {
            **emulation,
            "major": "1",
            "minor": str(binary),
            "gitVersion": f"v1.{binary}.0",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.25.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    def prepare(self, kind: ResourceKind, obj: JsonObj) -> None:
        """Drop disabled fields from an object about to be stored, then validate it.

        Mutates ``obj``; raises :class:`FakeApiError` 422 for what this release rejects.
        """
        if self.drops_gated_fields:
            for path in GATED_FIELDS.get(kind.kind, ()):
                drop_path(obj, path)
        if kind.kind == "ResourceSlice":
            default_taint_times(obj)
        if kind.kind == "ResourceSlice" and self.minor >= 35:
            spec = obj.get("spec") or {}
            if spec.get("devices") and spec.get("sharedCounters"):
                name = (obj.get("metadata") or {}).get("name", "")
                raise FakeApiError(
                    422,
                    f'ResourceSlice.resource.k8s.io "{name}" is invalid: spec: Invalid value: '
                    '"devices and sharedCounters": only one of devices and sharedCounters '
                    "may be set",
                    reason="Invalid",
                    kind=kind,
                    name=name,
                )

    def validate(self, kind: ResourceKind, obj: JsonObj) -> None:
        """The official schema of this release (:mod:`tests.support.fakekube_schema`)."""
        check_schema(kind, obj, self.minor)


def default_taint_times(obj: JsonObj) -> None:
    """Set ``timeAdded`` (now) on every device taint of a ResourceSlice that lacks it."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for taint in _walk(obj, (*_DEVICE, "taints", "[]")):
        if isinstance(taint, dict) and not taint.get("timeAdded"):
            taint["timeAdded"] = now


def drop_path(obj: Any, path: _Path) -> None:
    """Remove the field at ``path`` wherever it occurs (see ``_Path``); missing parts are fine."""
    *parents, last = path
    for holder in _walk(obj, tuple(parents)):
        if isinstance(holder, dict):
            holder.pop(last, None)


def _walk(node: Any, path: _Path) -> Iterator[Any]:
    if not path:
        yield node
        return
    step, rest = path[0], path[1:]
    if step == "[]":
        children = node if isinstance(node, list) else []
    elif step == "*":
        children = list(node.values()) if isinstance(node, dict) else []
    else:
        children = [node[step]] if isinstance(node, dict) and step in node else []
    for child in children:
        yield from _walk(child, rest)
