"""Each item's encoding kept between writes of a file that lists them (pure).

The plugin's checkpoint and the mps-agent's state file are each rewritten whole
after every change, and a change touches one claim or share of many: encoding
every item each time was most of a write's CPU. Their items are immutable
objects, so an item that is the very object encoded last time has the same
encoding; anything else (a changed item is a new object) is encoded again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
E = TypeVar("E")


class KeptEncodings(Generic[K, V, E]):
    """Encodings of ``(key, item)`` pairs, each kept while its item is the same object."""

    def __init__(self) -> None:
        self._kept: dict[K, tuple[V, E]] = {}

    def encode_all(self, items: Iterable[tuple[K, V]], encode: Callable[[K, V], E]) -> list[E]:
        """The encodings of ``items``, in order; kept ones reused. What is kept
        afterwards is exactly these items (those gone are forgotten)."""
        kept: dict[K, tuple[V, E]] = {}
        encoded = []
        for key, item in items:
            entry = self._kept.get(key)
            if entry is None or entry[0] is not item:
                entry = (item, encode(key, item))
            kept[key] = entry
            encoded.append(entry[1])
        self._kept = kept
        return encoded

    def keys(self) -> set[K]:
        """The keys whose encodings are kept (tests)."""
        return set(self._kept)
