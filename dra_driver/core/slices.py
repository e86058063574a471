"""Inventory + node settings + cluster capabilities → the ResourceSlices we publish (pure).

One pool per node (pool name = node name, ``spec.nodeName`` set). The
publisher (``k8s/publisher.py``) gives each :class:`DesiredSlice` its
metadata and the pool's generation; everything else is decided here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DesiredSlice:
    """One ResourceSlice as we want it, before the publisher names and numbers it."""

    key: str
    """Stable within the node across rebuilds (e.g. ``gpu-0``, ``counters-0``); the
    publisher derives the object name from node, driver and key."""
    spec: Mapping[str, Any]
    """``ResourceSlice.spec`` as JSON (resource.k8s.io/v1). ``pool.generation`` is 0
    here; the publisher sets it. ``pool.resourceSliceCount`` is already right."""
