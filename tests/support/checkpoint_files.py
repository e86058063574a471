"""Checkpoint documents edited by tests: the checksum recomputed as the format documents it."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_checksum(data: dict[str, Any]) -> str:
    """The checksum as the checkpoint module's docstring documents it, computed independently."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def with_valid_checksum(doc: dict[str, Any]) -> bytes:
    """``doc`` as file bytes, its checksum made to match its (edited) data."""
    doc["checksum"] = canonical_checksum(doc["data"])
    return json.dumps(doc).encode()
