"""Fake GPU backend: GPUs described by a shorthand or a file, no hardware needed.

Used by the demo, tests and kind CI. The shorthand is ``model:count`` items
separated by commas (``h100-80gb:2,l4:1``); a file (YAML or JSON) lists GPUs
explicitly::

    gpus:
    - model: h100-80gb
    - model: l4
      uuid: GPU-00000000-0000-0000-0000-000000000001   # optional

UUIDs default to a deterministic value derived from the node name and index,
so two nodes never share one and a restart keeps them stable.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import yaml

from dra_driver.core.errors import ConfigError
from dra_driver.core.ids import GpuUUID
from dra_driver.core.model import GpuInfo, HealthEvent, Inventory
from dra_driver.gpu.models import KNOWN_MODELS, GpuModel

_UUID_NAMESPACE = uuid.UUID("5b3f0c8e-1d7a-4c62-9a0e-6f1f2b9d7c41")


def _model(key: str, where: str) -> GpuModel:
    try:
        return KNOWN_MODELS[key.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"{where}: unknown fake GPU model {key!r}; known models: {', '.join(KNOWN_MODELS)}"
        ) from None


def _fake_uuid(node_name: str, index: int) -> GpuUUID:
    return GpuUUID(f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}")


def parse_shorthand(spec: str) -> list[Mapping[str, Any]]:
    """``h100-80gb:2,l4`` → one entry per GPU."""
    entries: list[Mapping[str, Any]] = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, count_text = item.partition(":")
        try:
            count = int(count_text) if count_text else 1
        except ValueError:
            raise ConfigError(
                f"--fake-gpus: {item!r} is not MODEL[:COUNT], e.g. h100-80gb:2"
            ) from None
        if count < 1:
            raise ConfigError(f"--fake-gpus: count in {item!r} must be at least 1")
        _model(key, "--fake-gpus")
        entries.extend({"model": key} for _ in range(count))
    if not entries:
        raise ConfigError("--fake-gpus: no GPUs given; use e.g. h100-80gb:2")
    return entries


def _looks_like_path(spec: str) -> bool:
    # So that a shorthand such as "l4" is never read from a file named l4.
    return "/" in spec or spec.endswith((".yaml", ".yml", ".json"))


def load_spec(spec: str) -> list[Mapping[str, Any]]:
    """A shorthand, or the path of a YAML/JSON file with a ``gpus`` list.

    A file is named by a path with a ``/`` or a .yaml/.yml/.json extension.
    """
    if not _looks_like_path(spec):
        return parse_shorthand(spec)
    if not os.path.isfile(spec):
        raise ConfigError(f"--fake-gpus file {spec} does not exist")
    try:
        with open(spec, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"--fake-gpus file {spec}: cannot read it: {err}") from err
    gpus = doc.get("gpus") if isinstance(doc, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise ConfigError(f"--fake-gpus file {spec}: expected a non-empty 'gpus' list")
    for i, entry in enumerate(gpus):
        if not isinstance(entry, dict) or "model" not in entry:
            raise ConfigError(f"--fake-gpus file {spec}: gpus[{i}] needs a 'model'")
        minor = entry.get("minor", 0)
        if not isinstance(minor, int) or isinstance(minor, bool) or minor < 0:
            raise ConfigError(
                f"--fake-gpus file {spec}: gpus[{i}].minor must be a non-negative integer, "
                f"not {minor!r}"
            )
    return gpus


def build_inventory(entries: Iterable[Mapping[str, Any]], node_name: str) -> Inventory:
    gpus = []
    for index, entry in enumerate(entries):
        model = _model(str(entry["model"]), "--fake-gpus")
        gpus.append(
            GpuInfo(
                index=index,
                uuid=GpuUUID(str(entry.get("uuid") or _fake_uuid(node_name, index))),
                product_name=model.product_name,
                memory_bytes=model.memory_bytes,
                minor=int(entry.get("minor", index)),
            )
        )
    return Inventory(gpus=tuple(gpus))


class FakeGpuBackend:
    """A :class:`~dra_driver.core.ports.GpuBackend` over a static description."""

    def __init__(self, spec: str, node_name: str) -> None:
        self._inventory = build_inventory(load_spec(spec), node_name)
        self._events: asyncio.Queue[HealthEvent | None] = asyncio.Queue()

    def inject(self, event: HealthEvent) -> None:
        """Report ``event`` as if NVML had (tests, the demo)."""
        self._events.put_nowait(event)

    async def health_events(self) -> AsyncIterator[HealthEvent]:
        while (event := await self._events.get()) is not None:
            yield event

    @property
    def name(self) -> str:
        return "fake"

    async def inventory(self) -> Inventory:
        return self._inventory

    async def close(self) -> None:
        self._events.put_nowait(None)
