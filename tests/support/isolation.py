"""The isolation model of issue 33, as data: what a claim's container gets from its
CDI spec, what two claims of different namespaces share, and the table of
``docs/isolation.md`` rendered from the same rows (pure; no I/O but reading a spec).

A container's view is every host path it is given: device nodes, bind mounts'
host paths, and path-valued env vars (``CUDA_MPS_PIPE_DIRECTORY``). Views are
compared on the real paths, then written with symbols so the expectations (and the
doc) do not depend on a test's temporary directories.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PATH_ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
"""Env vars whose value is a host path the container reaches."""

CONTROL_NODES = frozenset({"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"})
TOOLKIT = "NVIDIA Container Toolkit CDI spec: every CUDA client needs the driver's control nodes"
MPS_CONTROL = "nvidia-cuda-mps-control"

PIPE = "<pipe>"
"""An MPS daemon's pipe directory (holds its ``control`` socket)."""
OWN_NS = "<pipe>/<ns>"
"""A directory strictly under a daemon's pipe directory: a v3 namespace of one claim."""
SHM = "<shm>"
"""The directory an MPS daemon sees as ``/dev/shm``."""
CAPS = "/dev/nvidia-caps/<GI,CI>"
"""A MIG instance's GPU-instance and compute-instance capability nodes."""


@dataclass(frozen=True)
class View:
    """What one container gets: host paths (nodes, mount sources, path env vars) and
    the container paths of its mounts."""

    host_paths: frozenset[str]
    container_mounts: frozenset[str]

    def shared_with(self, other: View) -> frozenset[str]:
        return self.host_paths & other.host_paths


def container_view(spec: Mapping[str, Any]) -> View:
    """The view of a container given every device of a claim's CDI ``spec``."""
    edits: list[Mapping[str, Any]] = [spec.get("containerEdits", {})]
    edits += [d.get("containerEdits", {}) for d in spec.get("devices", [])]
    paths: set[str] = set()
    mounts: set[str] = set()
    for edit in edits:
        paths.update(n["path"] for n in edit.get("deviceNodes", []))
        for mount in edit.get("mounts", []):
            paths.add(mount["hostPath"])
            mounts.add(mount["containerPath"])
        for env in edit.get("env", []):
            name, _, value = env.partition("=")
            if name in PATH_ENV:
                paths.add(value)
    return View(frozenset(paths), frozenset(mounts))


def symbols(paths: Iterable[str], pipes: Sequence[str], shms: Sequence[str]) -> frozenset[str]:
    """``paths`` written with the symbols above, given the node's daemons' pipe and shm
    directories."""
    out: set[str] = set()
    for path in paths:
        if path in pipes:
            out.add(PIPE)
        elif any(path.startswith(p + os.sep) for p in pipes):
            out.add(OWN_NS)
        elif path in shms:
            out.add(SHM)
        elif path.startswith("/dev/nvidia-caps/"):
            out.add(CAPS)
        else:
            out.add(path)
    return frozenset(out)


@dataclass(frozen=True)
class Mode:
    """One row of the model: a mode, and what holds for two claims of two namespaces."""

    name: str
    gets: frozenset[str]
    """Claim A's container, in symbols, besides :data:`CONTROL_NODES`."""
    shared: Mapping[str, str]
    """What A's and B's containers both get, besides :data:`CONTROL_NODES`, each with
    the source that makes it an accepted exception."""
    tenant_can: str
    """What a tenant can do to another's work on the same device."""
    refused: str | None = None
    """Without an opt-in, the text claim B's prepare fails with (B is not prepared)."""
    opt_in: str | None = None
    """The setting under which B is prepared after all (its row: ``name`` + opt-in)."""


_GPU = frozenset({"/dev/nvidia0"})
_LEGACY_GETS = frozenset({"/dev/nvidia0", PIPE, SHM})
_MIG_GETS = frozenset({"/dev/nvidia0", CAPS})
_PARENT = "NVIDIA MIG user guide: a MIG client opens its parent GPU's node; the GI/CI capability nodes select the instance"  # noqa: E501
_LEGACY = "legacy MPS: every client connects through the daemon's control socket and shares its /dev/shm (docs/nvidia-interfaces.md mps-control-socket / mps-shm rows); cooperative opt-in"  # noqa: E501
_REFUSED = "serves claims of namespace team-a"

MODES: tuple[Mode, ...] = (
    Mode(
        "exclusive",
        _GPU,
        {},
        "nothing through the GPU (B has another GPU; a claim takes a GPU whole)",
    ),
    Mode(
        "time-sliced",
        _GPU,
        {"/dev/nvidia0": "NVIDIA time-slicing: no isolation"},
        "read/fill its GPU memory, starve it of time, crash the GPU context (no memory or fault isolation; GPU-unverified here)",  # noqa: E501
    ),
    Mode(
        "admin access",
        _GPU,
        {"/dev/nvidia0": "Kubernetes DRA adminAccess (KEP-5018): access to a device in use"},
        "all of the GPU's work is visible to the admin container (by design; adminAccess is namespace-gated)",  # noqa: E501
    ),
    Mode(
        "MPS v3 share",
        frozenset({"/dev/nvidia0", OWN_NS}),
        {
            "/dev/nvidia0": "MPS: clients of one daemon share the GPU; "
            "the daemon enforces each one's limits"
        },
        "a fatal fault in one client may reach the daemon's other clients (GPU-unverified); no control socket, no shared /dev/shm",  # noqa: E501
    ),
    Mode(
        "legacy MPS share",
        _LEGACY_GETS,
        {},
        "nothing: B of another namespace is refused",
        refused=_REFUSED,
        opt_in="tenancy: cooperative",
    ),
    Mode(
        "legacy MPS share, cooperative",
        _LEGACY_GETS,
        {"/dev/nvidia0": _LEGACY, PIPE: _LEGACY, SHM: _LEGACY},
        "quit the daemon, change or read the other's limits, list/terminate its clients, read its /dev/shm (fake control verified; GPU-unverified)",  # noqa: E501
    ),
    Mode(
        "MIG instance",
        _MIG_GETS,
        {"/dev/nvidia0": _PARENT},
        "nothing through the instance: its own memory and SMs "
        "(B has another instance; GPU-unverified)",
    ),
    Mode(
        "MPS inside MIG",
        frozenset({"/dev/nvidia0", CAPS, PIPE, SHM}),
        {},
        "nothing: B of another namespace is refused (the instance's daemon is legacy)",
        refused=_REFUSED,
        opt_in="tenancy: cooperative",
    ),
    Mode(
        "MPS inside MIG, cooperative",
        frozenset({"/dev/nvidia0", CAPS, PIPE, SHM}),
        {"/dev/nvidia0": _LEGACY, CAPS: _LEGACY, PIPE: _LEGACY, SHM: _LEGACY},
        "as legacy MPS, cooperative, within the instance (GPU-unverified)",
    ),
)

HEADER = (
    "| mode | a container gets | shared with another claim | a tenant can do to another | source |",
    "|---|---|---|---|---|",
)


def _cell(items: Iterable[str]) -> str:
    return ", ".join(f"`{i}`" for i in sorted(items)) or "nothing"


def table_rows(modes: Sequence[Mode] = MODES) -> list[str]:
    """The rows of ``docs/isolation.md``'s table (header included)."""
    rows = list(HEADER)
    for mode in modes:
        sources = sorted(set(mode.shared.values()))
        shared = (
            f"refused: claim B fails, naming the rule ({mode.opt_in} opts in)"
            if mode.refused
            else _cell(mode.shared)
        )
        rows.append(
            f"| {mode.name} | {_cell(mode.gets)} | {shared} | {mode.tenant_can} "
            f"| {'; '.join(sources) or '-'} |"
        )
    return rows


def doc_rows(text: str) -> list[str]:
    """The table rows of a markdown document (lines starting with ``|``)."""
    return [line.strip() for line in text.splitlines() if line.startswith("|")]
