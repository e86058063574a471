"""CDI (Container Device Interface) spec rendering: pure, no file I/O.

Each prepared claim gets one *transient* spec whose devices are named after
the claim UID, so a runtime never serves a stale cached device for a new claim.
The spec declares the lowest CDI version that covers the features it uses:
runtimes refuse specs with a version newer than their CDI library knows.

Besides device nodes, container edits carry what CUDA needs in the container:
bind mounts of the host driver's user-space libraries, firmware and tools, and
OCI hooks (the NVIDIA ``update-ldcache`` hook). :func:`merge_edits` composes
edits from several sources (the NVIDIA Container Toolkit's spec, our own
discovery, the plan) without duplicates. ``dra_driver.core.cdi.rules`` checks a
rendered document against the CDI rules independently of this module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.base.errors import ConfigError

CDI_CLASS = "claim"

# Vendor and class: start with a letter, end with a letter or digit; letters,
# digits, '_', '-', '.' between.
_KIND_PART = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
# Device name: letters, digits, '-', '_', '.', ':'; must start and end alphanumeric.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")

# Version gates we may hit (CDI SPEC.md "Version" table).
_V030 = (0, 3, 0)
_V040 = (0, 4, 0)  # ``type`` on mounts
_V050 = (0, 5, 0)  # device names starting with a digit; hostPath on device nodes
_V060 = (0, 6, 0)  # annotations; dots in the class
_V070 = (0, 7, 0)  # additionalGids

HOOK_NAMES = frozenset(
    {"createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
"""The OCI hook points a CDI hook may name (``hookName``)."""


@dataclass(frozen=True)
class DeviceNode:
    """One ``containerEdits.deviceNodes`` entry.

    ``type`` may be ``""`` (not given): the runtime then stats ``hostPath`` (or
    ``path``) on the host for the type and numbers, as it also does when
    ``major`` is missing. With a type and a non-zero major it uses them as given
    and never looks at the host.
    """

    path: str
    type: str = "c"
    major: int | None = None
    minor: int | None = None
    host_path: str | None = None
    permissions: str | None = None
    file_mode: int | None = None
    uid: int | None = None
    gid: int | None = None

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
        if self.file_mode is not None:
            out["fileMode"] = self.file_mode
        if self.permissions is not None:
            out["permissions"] = self.permissions
        if self.uid is not None:
            out["uid"] = self.uid
        if self.gid is not None:
            out["gid"] = self.gid
        return out


@dataclass(frozen=True)
class Mount:
    """One ``containerEdits.mounts`` entry: ``host_path`` is the path on the host
    (where the runtime runs), ``container_path`` where it appears in the container."""

    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None
    """Mount type (e.g. ``bind``, ``tmpfs``); needs CDI 0.4.0. Left out, the runtime
    makes a bind mount when ``options`` say ``bind``."""

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type is not None:
            out["type"] = self.type
        return out


@dataclass(frozen=True)
class Hook:
    """One ``containerEdits.hooks`` entry: an OCI hook the runtime runs *on the host*
    at ``hook_name`` (one of :data:`HOOK_NAMES`). ``args`` is the full argv,
    ``args[0]`` included, as in the OCI runtime spec."""

    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def __post_init__(self) -> None:
        if self.hook_name not in HOOK_NAMES:
            raise ValueError(
                f"invalid CDI hook name {self.hook_name!r}; valid: {sorted(HOOK_NAMES)}"
            )

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


@dataclass(frozen=True)
class ContainerEdits:
    device_nodes: tuple[DeviceNode, ...] = ()
    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()
    """Needs CDI 0.7.0."""

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [node.render() for node in self.device_nodes]
        if self.mounts:
            out["mounts"] = [mount.render() for mount in self.mounts]
        if self.hooks:
            out["hooks"] = [hook.render() for hook in self.hooks]
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        return out

    def is_empty(self) -> bool:
        return not (
            self.device_nodes or self.env or self.mounts or self.hooks or self.additional_gids
        )


def merge_edits(*edits: ContainerEdits) -> ContainerEdits:
    """Combine ``edits`` in order, each thing once; earlier arguments win.

    Identity: a device node by ``path``, a mount by ``containerPath``, an env
    entry by its variable name, a hook and a group id by their whole value. When
    two sources name the same path or variable differently the first one is
    kept, so pass the most specific edits first (e.g. a plan's
    ``/dev/nvidiactl`` with explicit numbers before the toolkit's bare one; both
    name the same host node). Order of first appearance is kept, since the
    runtime applies mounts and hooks in list order.
    """
    nodes: dict[str, DeviceNode] = {}
    env: dict[str, str] = {}
    mounts: dict[str, Mount] = {}
    hooks: dict[Hook, None] = {}
    gids: dict[int, None] = {}
    for edit in edits:
        for node in edit.device_nodes:
            nodes.setdefault(node.path, node)
        for entry in edit.env:
            env.setdefault(entry.partition("=")[0], entry)
        for mount in edit.mounts:
            mounts.setdefault(mount.container_path, mount)
        for hook in edit.hooks:
            hooks.setdefault(hook, None)
        for gid in edit.additional_gids:
            gids.setdefault(gid, None)
    return ContainerEdits(
        device_nodes=tuple(nodes.values()),
        env=tuple(env.values()),
        mounts=tuple(mounts.values()),
        hooks=tuple(hooks),
        additional_gids=tuple(gids),
    )


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
    edits: list[ContainerEdits] = [spec.common_edits]
    for device in spec.devices:
        if device.name[:1].isdigit():
            need = max(need, _V050)
        edits.append(device.edits)
    if any(node.host_path is not None for edit in edits for node in edit.device_nodes):
        need = max(need, _V050)
    if any(mount.type is not None for edit in edits for mount in edit.mounts):
        need = max(need, _V040)
    if any(edit.additional_gids for edit in edits):
        need = max(need, _V070)
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
