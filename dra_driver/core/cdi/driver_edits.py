"""What CUDA needs in a container besides its GPU node, as CDI container edits. Pure.

A CUDA program needs more than ``/dev/nvidia<N>``: the control node
``/dev/nvidiactl``, the unified-memory nodes ``/dev/nvidia-uvm`` and
``/dev/nvidia-uvm-tools``, the host driver's user-space libraries (``libcuda``,
``libnvidia-ml``, ... of exactly the kernel module's version), GSP firmware, the
driver's tools (``nvidia-smi``, the MPS control daemon), and a linker cache that
knows the mounted libraries (the ``update-ldcache`` hook). Three sources:

* **The NVIDIA Container Toolkit's CDI spec** (``nvidia-ctk cdi generate``, kind
  ``nvidia.com/gpu``, usually ``/etc/cdi/nvidia.yaml`` or ``/var/run/cdi``), when
  the node has one: :func:`edits_from_toolkit_spec` takes its spec-level edits as
  our common edits and keeps each of its devices' edits (devices are named by
  index, by UUID, and ``all``). The toolkit knows driver layouts best, so it is
  preferred.
* **Our own discovery** under ``--driver-root`` otherwise
  (``dra_driver.gpu.driver_files`` finds the files; :func:`edits_from_driver_files`
  turns them into read-only bind mounts, device nodes and the ldcache hook).
* **Fake stand-ins** for ``--backend fake`` (:func:`fake_device_node`), so that
  containers start on a kind node or a real node without GPUs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.base.errors import InventoryError
from dra_driver.core.cdi.rules import cdi_spec_problems
from dra_driver.core.cdi.spec import ContainerEdits, DeviceNode, Hook, Mount

# docs/nvidia-interfaces.md: cdi-toolkit-spec
TOOLKIT_KIND = "nvidia.com/gpu"
"""The kind of the toolkit's generated spec."""

DEFAULT_HOOK_PATH = "/usr/bin/nvidia-cdi-hook"
"""Where the toolkit installs ``nvidia-cdi-hook`` on the host. The runtime runs
hooks on the host, so the path must exist *there*; a node without the toolkit
needs the binary installed (e.g. copied out of our image by the DaemonSet) and
``hook_path`` pointed at it."""

MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")
"""Options of every driver file mount: read-only bind, as the toolkit mounts them."""

# docs/nvidia-interfaces.md: cdi-control-nodes (gpu-unverified: from the toolkit's generated specs)
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
"""Device nodes every CUDA container needs besides its GPU's node."""

NULL_MAJOR, NULL_MINOR = 1, 3
"""``/dev/null``'s numbers (Linux ``Documentation/admin-guide/devices.txt``)."""


@dataclass(frozen=True)
class DriverFile:
    """A driver file: ``host_path`` as the runtime sees it on the host,
    ``container_path`` where the container gets it (the driver root stripped)."""

    host_path: str
    container_path: str


@dataclass(frozen=True)
class FoundNode:
    """A device node found on the host; numbers when it is a character device."""

    path: str
    major: int | None = None
    minor: int | None = None


@dataclass(frozen=True)
class DriverFiles:
    """The result of driver discovery (``dra_driver.gpu.driver_files``)."""

    driver_root: str
    driver_version: str
    libraries: tuple[DriverFile, ...]
    firmware: tuple[DriverFile, ...] = ()
    binaries: tuple[DriverFile, ...] = ()
    device_nodes: tuple[FoundNode, ...] = ()
    notes: tuple[str, ...] = ()
    """Optional things not found, for the log."""


@dataclass(frozen=True)
class ToolkitEdits:
    """The toolkit spec in our types: spec-level edits and each device's edits."""

    common: ContainerEdits
    per_device: dict[str, ContainerEdits] = field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    """Parts of the spec we do not carry over, each with the reason."""

    def for_gpu(self, uuid: str, index: int | None = None) -> ContainerEdits:
        """The toolkit's edits for one GPU, looked up by UUID, then by index."""
        if uuid in self.per_device:
            return self.per_device[uuid]
        if index is not None and str(index) in self.per_device:
            return self.per_device[str(index)]
        raise InventoryError(
            f"the NVIDIA Container Toolkit's CDI spec has no device {uuid!r}"
            + (f" or {index}" if index is not None else "")
            + f" (it has {sorted(self.per_device)}); regenerate it after driver or GPU "
            "changes: nvidia-ctk cdi generate"
        )


# --- the toolkit's spec --------------------------------------------------------------------


def edits_from_toolkit_spec(doc: Mapping[str, Any], source: str = "toolkit spec") -> ToolkitEdits:
    """Parse the toolkit's generated spec (already loaded from YAML/JSON).

    The spec must be valid CDI of kind ``nvidia.com/gpu`` (else
    :class:`InventoryError` listing every problem). ``intelRdt`` and
    ``netDevices`` are not carried over (named in ``skipped``): the toolkit does
    not generate them and they are not ours to compose.
    """
    if not isinstance(doc, Mapping):
        raise InventoryError(f"{source}: not a CDI spec (a {type(doc).__name__}, not a mapping)")
    if doc.get("kind") != TOOLKIT_KIND:
        raise InventoryError(
            f"{source}: kind {doc.get('kind')!r} is not the NVIDIA Container Toolkit's "
            f"{TOOLKIT_KIND!r}"
        )
    problems = cdi_spec_problems(doc)
    if problems:
        raise InventoryError(
            f"{source} is not valid CDI; regenerate it (nvidia-ctk cdi generate):\n  "
            + "\n  ".join(problems)
        )
    skipped: list[str] = []
    common = _edits(doc.get("containerEdits") or {}, "containerEdits", skipped)
    per_device = {
        str(device["name"]): _edits(
            device["containerEdits"], f"devices[{i}].containerEdits", skipped
        )
        for i, device in enumerate(doc["devices"])
    }
    return ToolkitEdits(common=common, per_device=per_device, skipped=tuple(skipped))


WITHHELD_BINARIES = ("nvidia-cuda-mps-control",)
"""Binaries of the toolkit's spec a claim's container never gets: no CUDA client runs
the MPS control tool, and beside a legacy daemon's pipe directory it could stop the
daemon or change other tenants' limits (issue 33)."""


def _withheld(mount: Mapping[str, Any]) -> bool:
    return str(mount.get("containerPath", "")).rsplit("/", 1)[-1] in WITHHELD_BINARIES


def _edits(raw: Mapping[str, Any], where: str, skipped: list[str]) -> ContainerEdits:
    for key in ("intelRdt", "netDevices"):
        if key in raw:
            skipped.append(f"{where}.{key}: not a GPU edit; left out")
    for m in raw.get("mounts", ()):
        if _withheld(m):
            skipped.append(f"{where}.mounts {m['containerPath']}: the MPS control tool; left out")
    return ContainerEdits(
        device_nodes=tuple(_node(n) for n in raw.get("deviceNodes", ())),
        env=tuple(raw.get("env", ())),
        mounts=tuple(
            Mount(
                host_path=m["hostPath"],
                container_path=m["containerPath"],
                options=tuple(m.get("options", ())),
                type=m.get("type") or None,
            )
            for m in raw.get("mounts", ())
            if not _withheld(m)
        ),
        hooks=tuple(
            Hook(
                hook_name=h["hookName"],
                path=h["path"],
                args=tuple(h.get("args", ())),
                env=tuple(h.get("env", ())),
                timeout=h.get("timeout"),
            )
            for h in raw.get("hooks", ())
        ),
        additional_gids=tuple(raw.get("additionalGids", ())),
    )


def _node(raw: Mapping[str, Any]) -> DeviceNode:
    # The toolkit usually gives the path only: keep "type" empty so the runtime
    # stats the host node, exactly as it would for the toolkit's own spec.
    return DeviceNode(
        path=raw["path"],
        type=raw.get("type", ""),
        major=raw.get("major"),
        minor=raw.get("minor"),
        host_path=raw.get("hostPath") or None,
        permissions=raw.get("permissions") or None,
        file_mode=raw.get("fileMode"),
        uid=raw.get("uid"),
        gid=raw.get("gid"),
    )


# --- our own discovery ---------------------------------------------------------------------


# docs/nvidia-interfaces.md: cdi-driver-files (gpu-unverified: the toolkit's layout)
def edits_from_driver_files(
    files: DriverFiles, hook_path: str | None = DEFAULT_HOOK_PATH
) -> ContainerEdits:
    """Common edits from discovered driver files.

    Libraries, firmware and binaries become read-only bind mounts
    (:data:`MOUNT_OPTIONS`); found control nodes become device nodes (with their
    numbers when known, else the runtime stats the host node); and, unless
    ``hook_path`` is None, a ``createContainer`` hook runs
    ``nvidia-cdi-hook update-ldcache --folder <dir>...`` over the library
    directories, which refreshes the container's ``ld.so.cache`` and creates the
    ``.so.1`` SONAME links a CUDA program loads (``libcuda.so.1``).
    """
    mounts = tuple(
        Mount(f.host_path, f.container_path, MOUNT_OPTIONS)
        for f in (*files.libraries, *files.firmware, *files.binaries)
    )
    nodes = tuple(
        DeviceNode(n.path, major=n.major, minor=n.minor)
        if n.major is not None
        else DeviceNode(n.path, type="")
        for n in files.device_nodes
    )
    hooks: tuple[Hook, ...] = ()
    if hook_path is not None and files.libraries:
        hooks = (ldcache_hook(hook_path, [f.container_path for f in files.libraries]),)
    return ContainerEdits(device_nodes=nodes, mounts=mounts, hooks=hooks)


# docs/nvidia-interfaces.md: cdi-ldcache-hook (gpu-unverified: the toolkit's hook)
def ldcache_hook(hook_path: str, library_paths: Sequence[str]) -> Hook:
    """The ``update-ldcache`` hook over the directories of ``library_paths``
    (container paths), each directory once, in first-seen order."""
    folders = list(dict.fromkeys(posixpath.dirname(p) for p in library_paths))
    args = ["nvidia-cdi-hook", "update-ldcache"]
    for folder in folders:
        args += ["--folder", folder]
    return Hook("createContainer", hook_path, tuple(args))


# --- fake stand-ins ------------------------------------------------------------------------


def fake_device_node(path: str) -> DeviceNode:
    """A stand-in for a GPU or control node with the fake backend.

    The container gets a character device at ``path`` (e.g. ``/dev/nvidia0``)
    with ``/dev/null``'s numbers 1:3, given explicitly with ``type: c``, so the
    runtime creates it without looking for ``path`` on the host (a node without
    GPUs has none). Harmless: every container already has ``/dev/null`` and the
    right to use it (runc's default device rules), so the device cgroup grants
    nothing new, while 195:N could reach a real GPU on a node that has one.
    What the container gets: the path exists, opens, reads EOF and discards
    writes, so start-up checks for the node pass; CUDA itself of course fails.
    """
    return DeviceNode(path, type="c", major=NULL_MAJOR, minor=NULL_MINOR)


def fake_common_edits() -> ContainerEdits:
    """Stand-ins for the control nodes (:data:`CONTROL_NODES`); no libraries."""
    return ContainerEdits(device_nodes=tuple(fake_device_node(p) for p in CONTROL_NODES))
