"""Transient CDI spec files under ``--cdi-root``: write, remove, list ours."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from dra_driver.base.ids import ClaimUID
from dra_driver.core.cdi import transient_spec_filename, transient_spec_prefix
from dra_driver.state.files import atomic_write, remove_if_exists
from dra_driver.state.filesystems import on_memory_filesystem


class CdiStore:
    def __init__(self, root: str, kind: str, fsync: bool = True) -> None:
        self.root = root
        self.kind = kind
        self.fsync = fsync
        self._prefix = transient_spec_prefix(kind)
        self.in_memory = on_memory_filesystem(root)
        """On tmpfs or ramfs (the chart's /var/run/cdi): a write cannot block, so the
        plugin makes it from its event loop instead of a thread."""

    def path_for(self, claim_uid: str) -> str:
        return os.path.join(self.root, transient_spec_filename(self.kind, claim_uid))

    def write(self, claim_uid: str, spec: Mapping[str, Any]) -> str:
        os.makedirs(self.root, exist_ok=True)
        path = self.path_for(claim_uid)
        # Compact: with ``indent`` json falls back to its pure-Python encoder, which
        # was a quarter of the prepare path's own CPU (yappi, 10 claims at once).
        blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        atomic_write(path, blob, mode=0o644, fsync=self.fsync)
        return path

    def exists(self, path: str) -> bool:
        """Whether the spec file at ``path`` (one :meth:`write` returned) is there."""
        return os.path.exists(path)

    def remove(self, path: str) -> bool:
        return remove_if_exists(path)

    def list_claim_uids(self) -> dict[ClaimUID, str]:
        """Claim UID → path of every transient spec of ours in the CDI root."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return {}
        found: dict[ClaimUID, str] = {}
        for name in names:
            if name.startswith(self._prefix) and name.endswith(".json"):
                uid = ClaimUID(name[len(self._prefix) : -len(".json")])
                found[uid] = os.path.join(self.root, name)
        return found

    def stale_temp_files(self) -> list[str]:
        """Temp files of ours left by a process killed mid-write."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        dot_prefix = "." + self._prefix
        return [
            os.path.join(self.root, n)
            for n in names
            if n.startswith(dot_prefix) and n.endswith(".tmp")
        ]
