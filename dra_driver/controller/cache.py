"""One informer's objects by UID: as decoded (:class:`PlainCache`), or as compact JSON
decoded when read (:class:`PackedCache`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Protocol

from dra_driver.k8s.rest import JsonObj


class ObjectCache(Protocol):
    def get(self, uid: str) -> JsonObj | None: ...

    def put(self, uid: str, obj: JsonObj) -> None: ...

    def pop(self, uid: str) -> None: ...

    def values(self) -> list[JsonObj]: ...

    def each(self) -> Iterator[JsonObj]:
        """The objects one at a time (a packed one decoded only when reached)."""
        ...

    def uids(self) -> set[str]: ...

    def __len__(self) -> int: ...


class PlainCache:
    def __init__(self) -> None:
        self._objects: dict[str, JsonObj] = {}

    def get(self, uid: str) -> JsonObj | None:
        return self._objects.get(uid)

    def put(self, uid: str, obj: JsonObj) -> None:
        self._objects[uid] = obj

    def pop(self, uid: str) -> None:
        self._objects.pop(uid, None)

    def values(self) -> list[JsonObj]:
        return list(self._objects.values())

    def each(self) -> Iterator[JsonObj]:
        return iter(list(self._objects.values()))

    def uids(self) -> set[str]:
        return set(self._objects)

    def __len__(self) -> int:
        return len(self._objects)


class PackedCache:
    """Each object as its compact JSON (UTF-8): a few times smaller than the decoded
    dicts; every read decodes a fresh copy (so a reader may keep or change it; what the
    allocator's state keeps of the slices shares its repeating strings itself,
    :func:`~dra_driver.allocator.model.gather_pools`)."""

    def __init__(self) -> None:
        self._packed: dict[str, bytes] = {}

    def get(self, uid: str) -> JsonObj | None:
        data = self._packed.get(uid)
        return None if data is None else _unpacked(data)

    def put(self, uid: str, obj: JsonObj) -> None:
        self._packed[uid] = json.dumps(obj, separators=(",", ":")).encode()

    def pop(self, uid: str) -> None:
        self._packed.pop(uid, None)

    def values(self) -> list[JsonObj]:
        return [_unpacked(d) for d in self._packed.values()]

    def each(self) -> Iterator[JsonObj]:
        return (_unpacked(d) for d in list(self._packed.values()))

    def uids(self) -> set[str]:
        return set(self._packed)

    def __len__(self) -> int:
        return len(self._packed)


def _unpacked(data: bytes) -> JsonObj:
    obj: JsonObj = json.loads(data)
    return obj
