"""What the informers keep of each object: the fields the controller reads, with what
repeats from object to object shared within one informer.

The caches hold every claim, pod, Node and Namespace of the cluster for the process's
life, and their decoded JSON is most of the controller's memory (about 17 KB a claim
and its pod at 500 nodes, ``hack/bench/controller.py``). A real pod carries its
containers, volumes and conditions, a Node its images and conditions, any object its
``managedFields``: none of which the controller reads. So each object is cut to what
it reads as it is decoded (:class:`Keeper`, one per informer).

What repeats is shared, by tables the informer's :class:`Keeper` owns, each bounded
(at its limit it starts afresh), so objects that come and go never make them grow,
and two controllers in one process share nothing:

* strings (:class:`Strings`): the keys (the JSON decoder shares a key only within one
  document) and short values that repeat (``apiVersion``, the namespace, the class and
  driver names, quantities). Not ``sys.intern``: an interned string lives as long as
  the interpreter wants (never, on Python 3.12), so names and timestamps of pods long
  deleted would pile up. Measured: see :data:`STRINGS_LIMIT`;
* whole subtrees (:class:`Subtrees`): a claim's ``spec`` (every claim of one template,
  or of one share size, has the same), the configs and the node selector of its
  allocation, the capacity each result consumes; a pod's tolerations, affinity and
  node selector. Half of a decoded claim's memory was such copies (500 nodes, 5,000
  claims: ``hack/bench/controller.py``). A shared subtree is read-only
  (:mod:`.readonly`): a change to it raises instead of changing every object holding it.
  The rest of an object is the cache's own: an object read from a cache is read-only
  by convention, as it always was (the cache hands out the object it holds).

What is read, and so kept:

* pods (:func:`~.claim_index.pod_uses`, :func:`~.reconcile.pod_is_live`, the pending
  pod's ``nodeName``, :func:`~dra_driver.allocator.why_node_unfit`, the claim index):
  identity, ``deletionTimestamp``; ``spec.nodeName``, ``nodeSelector``, ``affinity``,
  ``tolerations``, ``resourceClaims``; ``status.phase``, ``resourceClaimStatuses``;
* Nodes (:func:`~dra_driver.allocator.why_node_unfit`): identity, labels; ``spec.taints``,
  ``spec.unschedulable``;
* Namespaces (the VRAM quota, :mod:`dra_driver.allocator.quota`): identity, annotations;
* claims: everything but ``metadata.managedFields`` and ``status.devices`` (the
  drivers' device status, written for users; the controller writes ``status.allocation``
  and clears ``devices`` without reading it), since the allocator reads the spec and the
  allocation whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dra_driver.controller.readonly import read_only
from dra_driver.k8s.rest import JsonObj

SHORT = 64
"""Strings up to this long are shared (names, kinds, quantities, selectors' values);
longer ones (messages, CEL expressions) are seldom repeated."""

STRINGS_LIMIT = 4_096
"""Distinct strings one informer's table holds before it starts afresh (at most about
0.5 MB: the table and the strings it alone keeps alive).

Measured (tracemalloc, Python 3.11, 5,000 allocated claims and their 5,000 running
pods of the shapes the API server sends, kept by :func:`claim_keeper` and
:func:`pod_keeper`): 39.5 MB with no string shared, 30.5 MB sharing the keys only,
23.2 MB sharing keys and short values through this table (24.4 MB at a limit of 256,
23.5 MB at 65,536), 24.7 MB with ``sys.intern`` as before. So the table keeps what
interning saved, about 40 % of the caches, and lets go of what is deleted."""

_IDENTITY = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
_POD_META = (*_IDENTITY, "deletionTimestamp", "ownerReferences")
_POD_SPEC = ("nodeName", "nodeSelector", "affinity", "tolerations", "resourceClaims")
_POD_STATUS = ("phase", "resourceClaimStatuses")
_NODE_META = (*_IDENTITY, "labels")
_NODE_SPEC = ("taints", "unschedulable")
_NAMESPACE_META = (*_IDENTITY, "annotations")


_UNIQUE = frozenset({"uid", "resourceVersion", "shareID"})
"""Keys whose values no other object shares: a table entry for each would only push
out the strings that do repeat."""
_UNIQUE_MARKERS = tuple(f"{k!r}:" for k in sorted(_UNIQUE))
"""How such a key shows in the ``repr`` of a subtree holding it."""


class Strings:
    """One object per distinct string seen lately: a string equal to one seen before is
    replaced by that one. At ``limit`` entries it starts afresh (what the caches hold
    stays shared; later objects share with what is seen from then on), so strings that
    never repeat (names, timestamps) cannot make it grow without bound, and a string is
    freed once no cached object and no table holds it."""

    def __init__(self, limit: int = STRINGS_LIMIT) -> None:
        self._limit = limit
        self._table: dict[str, str] = {}

    def one(self, text: str) -> str:
        found = self._table.get(text)
        if found is None:
            if len(self._table) >= self._limit:
                self._table.clear()
            found = self._table[text] = text
        return found

    def __len__(self) -> int:
        return len(self._table)

    def shared(self, node: Any) -> Any:
        """A copy of a decoded JSON tree with its keys and short strings shared."""
        kind = type(node)
        if kind is dict:
            one = self.one
            return {
                one(k): v if k in _UNIQUE and type(v) is str else self.shared(v)
                for k, v in node.items()
            }
        if kind is list:
            return [self.shared(v) for v in node]
        if kind is str and len(node) <= SHORT:
            return self.one(node)
        return node


class Subtrees:
    """One object per distinct JSON subtree seen lately: a subtree equal to one seen
    before is replaced by that one. Equal means the same ``repr``: for decoded JSON
    that is the same types and values in the same order (``1`` is not ``True`` nor
    ``1.0``; key order counts), and ``repr`` is the quickest text of a tree at hand.

    Keyed by a 128-bit digest of that text (a collision is not to be expected in the
    life of the universe), not the text itself, so the table is small; at ``limit``
    entries it starts afresh (what the caches hold stays shared; later objects share
    with what is seen from then on), so subtrees that never repeat cannot make it grow
    without bound. What it hands out is a read-only copy (:func:`~.readonly.read_only`),
    made when the subtree is first seen."""

    def __init__(self, limit: int = 16_384) -> None:
        self._limit = limit
        self._by_digest: dict[bytes, Any] = {}

    def one(self, node: Any) -> Any:
        text = repr(node)
        if any(marker in text for marker in _UNIQUE_MARKERS):
            # A value no other object has (a grant's shareID): never found again, so
            # not entered (it would only push out the subtrees that do repeat).
            return node
        digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
        found = self._by_digest.get(digest)
        if found is None:
            if len(self._by_digest) >= self._limit:
                self._by_digest.clear()
            found = self._by_digest[digest] = read_only(node)
        return found

    def __len__(self) -> int:
        return len(self._by_digest)

    def at(self, node: Any, path: Sequence[str]) -> None:
        """Share the subtrees of ``node`` at ``path`` (``*``: every item of a list),
        in place: ``node`` is a fresh copy of ours (:meth:`Strings.shared`)."""
        head, rest = path[0], path[1:]
        if head == "*":
            if type(node) is list:
                for i, item in enumerate(node):
                    if rest:
                        self.at(item, rest)
                    else:
                        node[i] = self.one(item)
            return
        if type(node) is not dict or head not in node:
            return
        if rest:
            self.at(node[head], rest)
        else:
            node[head] = self.one(node[head])


_CLAIM_SUBTREES = (
    ("spec",),
    ("metadata", "finalizers"),
    ("status", "allocation", "devices", "config", "*"),
    ("status", "allocation", "devices", "results", "*", "consumedCapacity"),
    ("status", "allocation", "nodeSelector"),
)
_POD_SUBTREES = (
    ("spec", "tolerations"),
    ("spec", "affinity"),
    ("spec", "nodeSelector"),
)


def _kept(obj: JsonObj, part: str, fields: Iterable[str]) -> JsonObj | None:
    source = obj.get(part)
    if not isinstance(source, dict):
        return None
    return {f: source[f] for f in fields if f in source}


def _cut(obj: JsonObj, parts: dict[str, tuple[str, ...]]) -> JsonObj:
    out: JsonObj = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    for part, fields in parts.items():
        kept = _kept(obj, part, fields)
        if kept is not None:
            out[part] = kept
    return out


def _cut_pod(pod: JsonObj) -> JsonObj:
    return _cut(pod, {"metadata": _POD_META, "spec": _POD_SPEC, "status": _POD_STATUS})


def _cut_node(node: JsonObj) -> JsonObj:
    return _cut(node, {"metadata": _NODE_META, "spec": _NODE_SPEC})


def _cut_namespace(namespace: JsonObj) -> JsonObj:
    return _cut(namespace, {"metadata": _NAMESPACE_META})


def _cut_claim(claim: JsonObj) -> JsonObj:
    out = dict(claim)
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    status = out.get("status")
    if isinstance(status, dict) and "devices" in status:
        out["status"] = {k: v for k, v in status.items() if k != "devices"}
    return out


class Keeper:
    """What one informer keeps of each object of its kind (called with each decoded
    object, in the informer's thread): cut to what the controller reads, its strings
    and its repeating subtrees shared through tables of this keeper's own."""

    def __init__(
        self, cut: Callable[[JsonObj], JsonObj], subtree_paths: Sequence[Sequence[str]] = ()
    ) -> None:
        self._cut = cut
        self._subtree_paths = subtree_paths
        self.strings = Strings()
        self.subtrees = Subtrees()

    def __call__(self, obj: JsonObj) -> JsonObj:
        kept: JsonObj = self.strings.shared(self._cut(obj))
        for path in self._subtree_paths:
            self.subtrees.at(kept, path)
        return kept


def pod_keeper() -> Keeper:
    return Keeper(_cut_pod, _POD_SUBTREES)


def node_keeper() -> Keeper:
    return Keeper(_cut_node)


def namespace_keeper() -> Keeper:
    return Keeper(_cut_namespace)


def claim_keeper() -> Keeper:
    return Keeper(_cut_claim, _CLAIM_SUBTREES)


def whole_keeper() -> Callable[[JsonObj], JsonObj]:
    """Kept as decoded (ResourceSlices, DeviceClasses: the allocator reads them whole)."""
    return _whole


def _whole(obj: JsonObj) -> JsonObj:
    return obj
