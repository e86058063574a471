"""CDI spec validation: the rules a container runtime applies when it loads a spec.

Written from the CDI rules (dra-facts.md §9; CDI ``specs-go/config.go``,
``specs-go/version.go``, ``pkg/parser``), independently of the renderer in
``dra_driver.core.cdi.spec`` (its regexes are not reused), so that a mistake in one
does not hide in the other. It works on the loaded document (``dict`` from JSON
or YAML), which lets it check both our rendered specs and the NVIDIA Container
Toolkit's spec we compose with.

Every problem is reported, each with its location in the document
(``devices[0].containerEdits.deviceNodes[1].path: ...``), not just the first.

Deliberately stricter than a runtime in two places, because both are mistakes in
practice: device node paths must be absolute (the OCI spec needs it), and
mount paths must be absolute (except the source of a non-bind mount with an
explicit ``type``, such as ``tmpfs``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

KNOWN_VERSIONS = (
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
)  # fmt: skip
"""Versions a current CDI library knows. 0.1.0 and 0.2.0 are known but below the
earliest it loads (0.3.0), so a spec declaring them is refused all the same."""

HOOK_NAMES = ("createRuntime", "createContainer", "startContainer", "poststart", "poststop")
DEVICE_TYPES = ("b", "c", "u", "p")

SPEC_FIELDS = frozenset({"cdiVersion", "kind", "annotations", "devices", "containerEdits"})
DEVICE_FIELDS = frozenset({"name", "annotations", "containerEdits"})
EDITS_FIELDS = frozenset(
    {"env", "deviceNodes", "hooks", "mounts", "additionalGids", "intelRdt", "netDevices"}
)
NODE_FIELDS = frozenset(
    {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"}
)
MOUNT_FIELDS = frozenset({"hostPath", "containerPath", "options", "type"})
HOOK_FIELDS = frozenset({"hookName", "path", "args", "env", "timeout"})
# intelRdt: closID..enableMBM since 0.7.0; schemata and enableMonitoring since 1.1.0.
INTEL_RDT_FIELDS = frozenset(
    {"closID", "l3CacheSchema", "memBwSchema", "enableCMT", "enableMBM", "schemata",
     "enableMonitoring"}
)  # fmt: skip
NET_DEVICE_FIELDS = frozenset({"hostInterfaceName", "name"})

# Vendor and class: a letter first, a letter or digit last, letters, digits and
# "_-." between. Device names: a letter or digit at both ends, "_-.:" between.
_NAME_PART = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?\Z")
_DEVICE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:\-]*[A-Za-z0-9])?\Z")
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)\Z")

Version = tuple[int, int, int]


def cdi_spec_problems(doc: Mapping[str, Any]) -> list[str]:
    """Everything a CDI runtime would refuse in ``doc``; empty when it is valid."""
    if not isinstance(doc, Mapping):
        return [f"<spec>: must be a mapping, got {type(doc).__name__}"]
    problems: list[str] = []
    problems += _unknown(doc, SPEC_FIELDS, "<spec>")
    version = _check_version(doc.get("cdiVersion"), problems)
    kind = doc.get("kind")
    if not isinstance(kind, str) or not _kind_ok(kind):
        problems.append(
            f"kind: {kind!r} is not <vendor>/<class> (each a letter first, a letter or "
            "digit last, letters, digits, '_', '-', '.' between)"
        )
    _check_annotations(doc, "annotations", problems)

    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        problems.append("devices: a spec needs a non-empty list of devices")
        devices = []
    seen: dict[str, int] = {}
    for i, device in enumerate(devices):
        _check_device(device, f"devices[{i}]", seen, i, problems)
    if "containerEdits" in doc:
        edits = doc["containerEdits"]
        if isinstance(edits, Mapping):
            _check_edits(edits, "containerEdits", problems)
        else:
            problems.append("containerEdits: must be a mapping")

    if version is not None:
        need, why = required_version(doc)
        if need > version:
            problems.append(
                f"cdiVersion: {doc['cdiVersion']} is below {_fmt(need)}, the lowest version "
                f"with {why}"
            )
    return problems


def required_version(doc: Mapping[str, Any]) -> tuple[Version, str]:
    """The lowest CDI version covering the features ``doc`` uses, and the feature."""
    need: Version = (0, 3, 0)
    why = "any feature (the earliest version CDI loads)"

    def bump(version: Version, feature: str) -> None:
        nonlocal need, why
        if version > need:
            need, why = version, feature

    devices = [d for d in _list(doc.get("devices")) if isinstance(d, Mapping)]
    candidates = [doc.get("containerEdits"), *(d.get("containerEdits") for d in devices)]
    all_edits = [e for e in candidates if isinstance(e, Mapping)]
    for edits in all_edits:
        if any(isinstance(m, Mapping) and m.get("type") for m in _list(edits.get("mounts"))):
            bump((0, 4, 0), "a mount 'type'")
        if any(
            isinstance(n, Mapping) and n.get("hostPath") for n in _list(edits.get("deviceNodes"))
        ):
            bump((0, 5, 0), "'hostPath' on a device node")
        if edits.get("additionalGids"):
            bump((0, 7, 0), "'additionalGids'")
        rdt = edits.get("intelRdt")
        if rdt is not None:
            bump((0, 7, 0), "'intelRdt'")
            newer = isinstance(rdt, Mapping) and (
                rdt.get("schemata") is not None or bool(rdt.get("enableMonitoring"))
            )
            if newer:
                bump((1, 1, 0), "'intelRdt.schemata' or 'intelRdt.enableMonitoring'")
        if edits.get("netDevices"):
            bump((1, 1, 0), "'netDevices'")
    for device in devices:
        name = device.get("name")
        if isinstance(name, str) and name and not name[0].isalpha():
            bump((0, 5, 0), "a device name not starting with a letter")
        if device.get("annotations"):
            bump((0, 6, 0), "device annotations")
    if doc.get("annotations"):
        bump((0, 6, 0), "spec annotations")
    kind = doc.get("kind")
    if isinstance(kind, str) and "." in kind.partition("/")[2]:
        bump((0, 6, 0), "a '.' in the kind's class")
    return need, why


# --- pieces ------------------------------------------------------------------------------


def _fmt(version: Version) -> str:
    return ".".join(str(p) for p in version)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _kind_ok(kind: str) -> bool:
    vendor, sep, cls = kind.partition("/")
    return bool(sep) and bool(_NAME_PART.match(vendor)) and bool(_NAME_PART.match(cls))


def _unknown(obj: Mapping[str, Any], known: frozenset[str], where: str) -> list[str]:
    return [
        f"{where}.{key}: unknown field (known: {', '.join(sorted(known))})"
        for key in obj
        if key not in known
    ]


def _check_version(value: Any, problems: list[str]) -> Version | None:
    match = _VERSION.match(value) if isinstance(value, str) else None
    if match is None or f"{match[1]}.{match[2]}.{match[3]}" not in KNOWN_VERSIONS:
        problems.append(
            f"cdiVersion: {value!r} is not a known version ({', '.join(KNOWN_VERSIONS)})"
        )
        return None
    return int(match[1]), int(match[2]), int(match[3])


def _check_annotations(obj: Mapping[str, Any], where: str, problems: list[str]) -> None:
    key = where.rpartition(".")[2]
    if key not in obj:
        return
    value = obj[key]
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        problems.append(f"{where}: must map non-empty strings to strings")


def _is_int(value: Any, minimum: int | None = None) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (minimum is None or value >= minimum)


def _absolute(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_device(
    device: Any, where: str, seen: dict[str, int], index: int, problems: list[str]
) -> None:
    if not isinstance(device, Mapping):
        problems.append(f"{where}: must be a mapping")
        return
    problems += _unknown(device, DEVICE_FIELDS, where)
    name = device.get("name")
    if not isinstance(name, str) or not _DEVICE.match(name):
        problems.append(
            f"{where}.name: {name!r} is not a device name (a letter or digit at both "
            "ends; letters, digits, '_', '-', '.', ':' between)"
        )
    elif name in seen:
        problems.append(f"{where}.name: {name!r} repeats devices[{seen[name]}]")
    else:
        seen[name] = index
    _check_annotations(device, f"{where}.annotations", problems)
    edits = device.get("containerEdits")
    if not isinstance(edits, Mapping) or not any(edits.get(k) for k in EDITS_FIELDS):
        problems.append(f"{where}.containerEdits: a device needs non-empty container edits")
    if isinstance(edits, Mapping):
        _check_edits(edits, f"{where}.containerEdits", problems)


def _check_env(value: Any, where: str, problems: list[str]) -> None:
    if not isinstance(value, list):
        problems.append(f"{where}: must be a list of 'NAME=value' strings")
        return
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not entry.partition("=")[0] or "=" not in entry:
            problems.append(f"{where}[{i}]: {entry!r} is not 'NAME=value'")


def _check_items(
    edits: Mapping[str, Any],
    key: str,
    where: str,
    problems: list[str],
    *,
    fields: frozenset[str],
    check: Callable[[Mapping[str, Any], str, list[str]], None],
) -> None:
    if key not in edits:
        return
    items = edits[key]
    if not isinstance(items, list):
        problems.append(f"{where}.{key}: must be a list")
        return
    for i, item in enumerate(items):
        at = f"{where}.{key}[{i}]"
        if not isinstance(item, Mapping):
            problems.append(f"{at}: must be a mapping")
            continue
        problems += _unknown(item, fields, at)
        check(item, at, problems)


def _check_node(node: Mapping[str, Any], at: str, problems: list[str]) -> None:
    if not _absolute(node.get("path")):
        problems.append(f"{at}.path: {node.get('path')!r} is not an absolute path")
    if "hostPath" in node and not _absolute(node["hostPath"]):
        problems.append(f"{at}.hostPath: {node['hostPath']!r} is not an absolute path")
    if "type" in node and node["type"] not in ("", *DEVICE_TYPES):
        problems.append(f"{at}.type: {node['type']!r} is not one of {', '.join(DEVICE_TYPES)}")
    for number in ("major", "minor", "fileMode", "uid", "gid"):
        if number in node and not _is_int(node[number], 0):
            problems.append(f"{at}.{number}: {node[number]!r} is not a non-negative integer")
    if "permissions" in node:
        perms = node["permissions"]
        if not isinstance(perms, str) or set(perms) - set("rwm"):
            problems.append(f"{at}.permissions: {perms!r} is not made of r, w and m")


def _check_mount(mount: Mapping[str, Any], at: str, problems: list[str]) -> None:
    mount_type = mount.get("type")
    host = mount.get("hostPath")
    if mount_type in (None, "", "bind", "rbind"):
        if not _absolute(host):
            problems.append(f"{at}.hostPath: {host!r} is not an absolute path")
    elif not isinstance(host, str) or not host:
        problems.append(f"{at}.hostPath: a {mount_type} mount needs a source")
    if not _absolute(mount.get("containerPath")):
        problems.append(
            f"{at}.containerPath: {mount.get('containerPath')!r} is not an absolute path"
        )
    if "options" in mount and not _strings(mount["options"]):
        problems.append(f"{at}.options: must be a list of strings")
    if mount_type is not None and not isinstance(mount_type, str):
        problems.append(f"{at}.type: must be a string")


def _check_hook(hook: Mapping[str, Any], at: str, problems: list[str]) -> None:
    if hook.get("hookName") not in HOOK_NAMES:
        problems.append(
            f"{at}.hookName: {hook.get('hookName')!r} is not one of {', '.join(HOOK_NAMES)}"
        )
    if not _absolute(hook.get("path")):
        problems.append(f"{at}.path: {hook.get('path')!r} is not an absolute path")
    if "args" in hook and not _strings(hook["args"]):
        problems.append(f"{at}.args: must be a list of strings")
    if "env" in hook:
        _check_env(hook["env"], f"{at}.env", problems)
    if "timeout" in hook and not _is_int(hook["timeout"], 1):
        problems.append(f"{at}.timeout: {hook['timeout']!r} is not a positive integer (seconds)")


def _check_net_device(dev: Mapping[str, Any], at: str, problems: list[str]) -> None:
    for key in ("hostInterfaceName", "name"):
        if not isinstance(dev.get(key), str) or not dev.get(key):
            problems.append(f"{at}.{key}: must be a non-empty string")


def _check_edits(edits: Mapping[str, Any], where: str, problems: list[str]) -> None:
    problems += _unknown(edits, EDITS_FIELDS, where)
    if "env" in edits:
        _check_env(edits["env"], f"{where}.env", problems)
    _check_items(edits, "deviceNodes", where, problems, fields=NODE_FIELDS, check=_check_node)
    _check_items(edits, "mounts", where, problems, fields=MOUNT_FIELDS, check=_check_mount)
    _check_items(edits, "hooks", where, problems, fields=HOOK_FIELDS, check=_check_hook)
    _check_items(
        edits, "netDevices", where, problems, fields=NET_DEVICE_FIELDS, check=_check_net_device
    )
    if "additionalGids" in edits:
        gids = edits["additionalGids"]
        if not isinstance(gids, list) or not all(_is_int(g, 0) for g in gids):
            problems.append(f"{where}.additionalGids: must be a list of non-negative integers")
    if "intelRdt" in edits:
        rdt = edits["intelRdt"]
        if isinstance(rdt, Mapping):
            problems += _unknown(rdt, INTEL_RDT_FIELDS, f"{where}.intelRdt")
        else:
            problems.append(f"{where}.intelRdt: must be a mapping")
