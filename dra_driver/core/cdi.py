"""CDI (Container Device Interface) spec rendering: pure, no file I/O.

Each prepared claim gets one *transient* spec whose devices are named after
the claim UID, so a runtime never serves a stale cached device for a new claim.
The spec declares the lowest CDI version that covers the features it uses:
runtimes refuse specs with a version newer than their CDI library knows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.core.errors import ConfigError

CDI_CLASS = "claim"

# Vendor and class: start with a letter, end with a letter or digit; letters,
# digits, '_', '-', '.' between.
_KIND_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
# Device name: letters, digits, '-', '_', '.', ':'; must start and end alphanumeric.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

# Version gates we may hit (CDI SPEC.md "Version" table).
_V030 = (0, 3, 0)
_V050 = (0, 5, 0)  # device names starting with a digit; hostPath on device nodes
_V060 = (0, 6, 0)  # annotations; dots in the class


@dataclass(frozen=True)
class DeviceNode:
    """One ``containerEdits.deviceNodes`` entry."""

    path: str
    type: str = "c"
    major: int | None = None
    minor: int | None = None
    host_path: str | None = None
    permissions: str | None = None

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path is not None:
            out["hostPath"] = self.host_path
        if self.type:
            out["type"] = self.type
        if self.major is not None:
            out["major"] = self.major
        if self.minor is not None:
            out["minor"] = self.minor
        if self.permissions is not None:
            out["permissions"] = self.permissions
        return out


@dataclass(frozen=True)
class ContainerEdits:
    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[str, ...] = ()

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [node.render() for node in self.device_nodes]
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: ContainerEdits


@dataclass(frozen=True)
class CdiSpec:
    kind: str
    """``<vendor>/<class>``, e.g. ``k8s.gpu.fractional.dev/claim``."""
    devices: tuple[CdiDevice, ...]
    common_edits: ContainerEdits = field(default_factory=ContainerEdits)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def qualified_name(self, device: CdiDevice) -> str:
        return qualified_device_name(self.kind, device.name)


def cdi_kind_for_driver(driver_name: str) -> str:
    """The CDI kind of our claim specs: vendor ``k8s.<driver>``, class ``claim``."""
    kind = f"k8s.{driver_name}/{CDI_CLASS}"
    validate_kind(kind)
    return kind


def validate_kind(kind: str) -> None:
    vendor, sep, cls = kind.partition("/")
    if not sep or not _KIND_PART.match(vendor) or not _KIND_PART.match(cls):
        raise ConfigError(
            f"invalid CDI kind {kind!r}: expected <vendor>/<class>, each starting with a "
            "letter, ending with a letter or digit, and made of letters, digits, '_', '-' "
            "and '.'; the vendor is k8s.<driver name>, so check --driver-name"
        )


def qualified_device_name(kind: str, name: str) -> str:
    if not _DEVICE_NAME.match(name):
        raise ValueError(f"invalid CDI device name {name!r}")
    return f"{kind}={name}"


def transient_spec_filename(kind: str, claim_uid: str) -> str:
    """``<vendor>-<class>_<uid>.json``: the transient-spec naming runtimes expect."""
    vendor, _, cls = kind.partition("/")
    return f"{vendor}-{cls}_{claim_uid.replace('/', '_')}.json"


def transient_spec_prefix(kind: str) -> str:
    """File-name prefix shared by all of our transient specs (for orphan cleanup)."""
    vendor, _, cls = kind.partition("/")
    return f"{vendor}-{cls}_"


def _fmt(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def minimum_version(spec: CdiSpec) -> str:
    """The lowest CDI spec version whose features cover ``spec``."""
    need = _V030
    _, _, cls = spec.kind.partition("/")
    if spec.annotations or "." in cls:
        need = max(need, _V060)
    nodes: list[DeviceNode] = list(spec.common_edits.device_nodes)
    for device in spec.devices:
        if device.name[:1].isdigit():
            need = max(need, _V050)
        nodes.extend(device.edits.device_nodes)
    if any(node.host_path is not None for node in nodes):
        need = max(need, _V050)
    return _fmt(need)


def render_spec(spec: CdiSpec) -> dict[str, Any]:
    """The spec as the JSON document a runtime loads."""
    doc: dict[str, Any] = {"cdiVersion": minimum_version(spec), "kind": spec.kind}
    if spec.annotations:
        doc["annotations"] = dict(spec.annotations)
    doc["devices"] = [
        {"name": device.name, "containerEdits": device.edits.render()} for device in spec.devices
    ]
    common = spec.common_edits.render()
    if common:
        doc["containerEdits"] = common
    return doc
