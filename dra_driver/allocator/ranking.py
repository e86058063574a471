"""The order in which a multi-device claim's search tries nodes: by a lower bound.

A multi-device claim's score on a node is the sorted tuple of its picks' packing
keys, and the node-by-node search keeps the smallest (score, node name). Each pick
costs at least its device's *alone key* (the key of that device taking the request
alone), so a node's ``k`` smallest alone keys (``k`` picks) bound its score from
below; the search tries nodes in (bound, name) order and stops at the first bound
past the best found (:meth:`~dra_driver.allocator.node_search.NodeSearch._search`).

:class:`SortedNodes` ranks every node up front: the alone key of every device that
could fit, nearly every device while the cluster is not full. :class:`LazyNodes`
yields the same order from the alone keys in ascending order, as a policy's index
can give them (best fit: by free memory from the request's floor; first fit: in
pool and index order), and ranks a node when it first shows up:

* a node is first seen at its smallest alone key, the first element of its bound;
  every node not seen yet has a bound that starts at the stream's next key or later,
  so a ranked node is yielded once that key is past its bound's first element;
* given the best score so far, the stream is dropped once its next key is past the
  score's first element: every node not seen yet has a bound past the best.

Both yield identical sequences, so the search tries the same nodes in the same order
and finds the same winner.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

Key = tuple[Any, ...]
"""A packing key (:data:`~dra_driver.allocator.packing.Policy`)."""
AloneKey = tuple[Key, int, str | None]
"""(alone key, device position, node): one device that can take a request alone."""


@dataclass(frozen=True)
class Ranked:
    """A node with enough devices that fit alone, and the bound on its score."""

    bound: Key
    """The node's ``k`` smallest alone keys, ascending (never empty)."""
    name: str
    """The node's name, ``""`` for devices without a node (the tie-break)."""
    node: str | None
    candidates: Any = None
    """Whatever the search computed while ranking the node (its candidates), kept for
    the node's search."""


class NodeOrder(Protocol):
    def next(self, limit: Key | None) -> Ranked | None:
        """The node with the smallest (bound, name) not yet returned, or None when no
        node is left. ``limit``: the first element of the best score found so far
        (None: none yet); nodes whose bound starts past it may be left out."""
        ...


class SortedNodes:
    """Every node ranked up front (any packing policy)."""

    def __init__(self, ranked: Iterable[Ranked]) -> None:
        self._ranked = sorted(ranked, key=lambda r: (r.bound, r.name))
        self._at = 0

    def next(self, limit: Key | None) -> Ranked | None:
        if self._at == len(self._ranked):
            return None
        self._at += 1
        return self._ranked[self._at - 1]


class LazyNodes:
    """Nodes ranked as they show up in ``keys``, yielded in (bound, name) order.

    ``keys`` must be ascending by key and list every usable device that fits alone
    (one entry per device and request shape; repeats are fine). ``rank`` ranks one
    node from all its devices (None: it cannot hold the claim); it is called at most
    once per node, and must return a bound whose first element is the key the node
    is first seen at.
    """

    def __init__(self, keys: Iterator[AloneKey], rank: Callable[[str | None], Ranked | None]):
        self._keys: Iterator[AloneKey] | None = keys
        self._rank = rank
        self._peeked: AloneKey | None = None
        self._seen: set[str | None] = set()
        self._heap: list[tuple[Key, str, int, Ranked]] = []
        self._tie = itertools.count()  # never compare two Ranked (node may be None)

    def next(self, limit: Key | None) -> Ranked | None:
        while True:
            ahead = self._peek()
            if ahead is not None and limit is not None and ahead[0] > limit:
                self._keys = self._peeked = ahead = None  # no later node can win
            heap = self._heap
            if heap and (ahead is None or heap[0][0][0] < ahead[0]):
                return heapq.heappop(heap)[-1]
            if ahead is None:
                return None
            self._peeked = None
            node = ahead[2]
            if node in self._seen:
                continue
            self._seen.add(node)
            ranked = self._rank(node)
            if ranked is not None:
                heapq.heappush(heap, (ranked.bound, ranked.name, next(self._tie), ranked))

    def _peek(self) -> AloneKey | None:
        if self._peeked is None and self._keys is not None:
            self._peeked = next(self._keys, None)
            if self._peeked is None:
                self._keys = None
        return self._peeked
