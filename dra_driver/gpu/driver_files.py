"""Finding the host driver's files and the NVIDIA Container Toolkit's CDI spec (I/O).

Discovery under a driver root (``--driver-root``: ``/`` for a driver installed
on the host, ``/run/nvidia/driver`` for the GPU operator's driver container):

* **Libraries** ``<name>.so.<driver version>``, searched in :data:`LIBRARY_DIRS`
  (in that order; the first directory holding a library wins). The set is
  :data:`REQUIRED_LIBRARIES` (discovery fails without them) and
  :data:`OPTIONAL_LIBRARIES` (mounted when present).
* **Firmware** ``<root>/lib/firmware/nvidia/<version>/gsp*.bin`` (GSP firmware,
  present with GSP-capable drivers; optional).
* **Binaries** :data:`BINARIES` under ``<root>/usr/bin`` (each optional).
* **Device nodes** :data:`dra_driver.core.cdi.driver_edits.CONTROL_NODES` under
  ``dev_root`` (``/dev``; a test points it elsewhere). ``/dev/nvidiactl`` is
  required (without it the kernel module is not loaded); the ``nvidia-uvm`` nodes
  appear only once the ``nvidia-uvm`` module is loaded (``nvidia-modprobe -u -c=0``)
  and are noted when missing.

Paths: we assume the driver root is mounted into the plugin's container at the
same path as on the host (the DaemonSet mounts host ``<root>`` at ``<root>``), so
the paths we see are the host paths the runtime needs (``hostPath``); the
container paths are the same with the driver root stripped. Paths are not
resolved through symlinks: inside a driver container's root they may be
absolute and would escape it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from dra_driver.base.errors import ConfigError, InventoryError
from dra_driver.core.cdi import (
    CONTROL_NODES,
    TOOLKIT_KIND,
    DriverFile,
    DriverFiles,
    FoundNode,
)

log = logging.getLogger(__name__)

LIBRARY_DIRS = (
    "usr/lib/x86_64-linux-gnu",  # Debian/Ubuntu x86_64
    "usr/lib64",  # RHEL/SUSE x86_64
    "lib/x86_64-linux-gnu",  # Debian/Ubuntu without merged /usr
    "usr/lib/aarch64-linux-gnu",  # Debian/Ubuntu arm64 (Grace Hopper)
)
"""Library directories, relative to the driver root, searched in this order."""

REQUIRED_LIBRARIES = ("libcuda", "libnvidia-ml")
"""CUDA's driver API and NVML (``nvidia-smi``, CUDA's device queries)."""

OPTIONAL_LIBRARIES = (
    "libnvidia-ptxjitcompiler",  # JIT of PTX (programs built for another GPU arch)
    "libnvidia-nvvm",  # JIT of NVVM IR (loaded by libcuda; e.g. Numba, LTO)
    "libnvidia-gpucomp",  # loaded by libcuda in recent drivers
    "libnvidia-allocator",  # GBM/EGL buffer allocation
    "libnvidia-cfg",  # used by nvidia-smi / NVML for some queries
    "libcudadebugger",  # cuda-gdb
    "libnvidia-opencl",  # OpenCL
    "libnvidia-pkcs11",  # confidential computing
    "libnvidia-pkcs11-openssl3",  # confidential computing (OpenSSL 3)
)
"""Mounted when present: a driver package without them still runs CUDA."""

BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-server",
)
"""Mounted when present. Not ``nvidia-cuda-mps-control``: a CUDA client never runs it
(it reaches its daemon through ``CUDA_MPS_PIPE_DIRECTORY``), and with a legacy
daemon's pipe directory it is a ready tool to quit the daemon or change other
tenants' limits (issue 33); the mps-agent gets its own from the toolkit."""

FIRMWARE_DIR = "lib/firmware/nvidia"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
"""The CDI spec directories, lowest priority first (CDI's default)."""

_LIBCUDA_VERSION = re.compile(r"libcuda\.so\.(\d+\.\d+(?:\.\d+)?)\Z")


def discover_driver_files(
    driver_root: str, driver_version: str | None = None, dev_root: str = "/dev"
) -> DriverFiles:
    """Find the driver's files under ``driver_root`` (see the module docstring).

    ``driver_version`` (e.g. ``580.65.06``, from NVML) picks the libraries; when
    None it is read from the one ``libcuda.so.<version>`` present.
    """
    root = os.path.normpath(driver_root)
    if not os.path.isabs(root) or not os.path.isdir(root):
        raise ConfigError(
            f"--driver-root {driver_root!r} is not an absolute path to a directory; give "
            "the driver's install root: / for a host install, /run/nvidia/driver for the "
            "GPU operator's driver container"
        )
    dirs = [os.path.join(root, d) for d in LIBRARY_DIRS]
    version = driver_version or _version_from_libcuda(root, dirs)
    notes: list[str] = []

    libraries: list[DriverFile] = []
    for name in (*REQUIRED_LIBRARIES, *OPTIONAL_LIBRARIES):
        found = _first_file(f"{name}.so.{version}", dirs)
        if found is not None:
            libraries.append(_driver_file(root, found))
        elif name in REQUIRED_LIBRARIES:
            raise InventoryError(
                f"no {name}.so.{version} under {root} (searched {', '.join(LIBRARY_DIRS)}): "
                "is --driver-root the driver's install root, and the driver version "
                f"{version} the loaded kernel module's?"
            )
        else:
            notes.append(f"optional library {name}.so.{version} not found")

    firmware_dir = os.path.join(root, FIRMWARE_DIR, version)
    firmware = [
        _driver_file(root, os.path.join(firmware_dir, entry))
        for entry in sorted(_listdir(firmware_dir))
        if entry.startswith("gsp") and entry.endswith(".bin")
    ]
    if not firmware:
        notes.append(f"no GSP firmware under {firmware_dir}")

    binaries: list[DriverFile] = []
    for name in BINARIES:
        path = os.path.join(root, "usr/bin", name)
        if os.path.isfile(path):
            binaries.append(_driver_file(root, path))
        else:
            notes.append(f"binary {name} not found under {root}/usr/bin")

    nodes = list(_device_nodes(dev_root, notes))
    return DriverFiles(
        driver_root=root,
        driver_version=version,
        libraries=tuple(libraries),
        firmware=tuple(firmware),
        binaries=tuple(binaries),
        device_nodes=tuple(nodes),
        notes=tuple(notes),
    )


def _version_from_libcuda(root: str, dirs: Sequence[str]) -> str:
    versions = sorted(
        {m[1] for d in dirs for entry in _listdir(d) if (m := _LIBCUDA_VERSION.match(entry))}
    )
    if not versions:
        raise InventoryError(
            f"no libcuda.so.<version> under {root} (searched {', '.join(LIBRARY_DIRS)}): "
            "is --driver-root the driver's install root?"
        )
    if len(versions) > 1:
        raise InventoryError(
            f"several driver versions under {root} ({', '.join(versions)}): remove the stale "
            "libraries, or let the plugin take the version from NVML"
        )
    return versions[0]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _first_file(name: str, dirs: Iterable[str]) -> str | None:
    for directory in dirs:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _driver_file(root: str, host_path: str) -> DriverFile:
    rel = os.path.relpath(host_path, root)
    return DriverFile(host_path=host_path, container_path="/" + rel)


def _device_nodes(dev_root: str, notes: list[str]) -> Iterable[FoundNode]:
    for path in CONTROL_NODES:
        seen_at = os.path.join(dev_root, os.path.basename(path))
        try:
            info = os.stat(seen_at)
        except FileNotFoundError:
            if path == "/dev/nvidiactl":
                raise InventoryError(
                    f"{seen_at} does not exist: is the NVIDIA kernel module loaded "
                    "(nvidia-smi on the host), and the host's /dev mounted at the dev root?"
                ) from None
            notes.append(f"{seen_at} not found (load nvidia-uvm: nvidia-modprobe -u -c=0)")
            continue
        if stat.S_ISCHR(info.st_mode):
            yield FoundNode(path, os.major(info.st_rdev), os.minor(info.st_rdev))
        else:
            yield FoundNode(path)


# --- the toolkit's spec --------------------------------------------------------------------


def find_toolkit_spec(
    cdi_dirs: Sequence[str] = CDI_DIRS,
) -> tuple[str, Mapping[str, Any]] | None:
    """The path and document of the toolkit's spec (kind ``nvidia.com/gpu``), if any.

    Reads ``*.json`` and ``*.yaml`` in ``cdi_dirs`` as a CDI runtime does. A later
    directory has the higher priority, so its spec wins; two in one directory are
    ambiguous (the runtime drops their devices as conflicting), which is an
    :class:`InventoryError`. Unreadable files of other vendors are skipped.
    """
    chosen: tuple[str, Mapping[str, Any]] | None = None
    for directory in cdi_dirs:
        in_dir: list[tuple[str, Mapping[str, Any]]] = []
        for entry in sorted(_listdir(directory)):
            if not entry.endswith((".json", ".yaml")):
                continue
            path = os.path.join(directory, entry)
            doc = _load(path)
            if isinstance(doc, Mapping) and doc.get("kind") == TOOLKIT_KIND:
                in_dir.append((path, doc))
        if len(in_dir) > 1:
            raise InventoryError(
                f"several {TOOLKIT_KIND} CDI specs in {directory} "
                f"({', '.join(p for p, _ in in_dir)}): the runtime refuses devices defined "
                "twice; keep one (nvidia-ctk cdi generate --output=...)"
            )
        if in_dir:
            chosen = in_dir[0]
    return chosen


def load_toolkit_spec(cdi_dirs: Sequence[str] = CDI_DIRS) -> Mapping[str, Any] | None:
    """The toolkit's spec document, or None when the node has none."""
    found = find_toolkit_spec(cdi_dirs)
    return None if found is None else found[1]


def _load(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            if path.endswith(".json"):
                return json.load(handle)
            return yaml.safe_load(handle)
    except (OSError, ValueError, yaml.YAMLError) as err:
        log.warning("skipping unreadable CDI spec %s: %s", path, err)
        return None
