"""What the informers keep of each object: the fields the controller reads, with the
strings that repeat from object to object shared.

The caches hold every claim, pod, Node and Namespace of the cluster for the process's
life, and their decoded JSON is most of the controller's memory (about 17 KB a claim
and its pod at 500 nodes, ``hack/bench/controller.py``). A real pod carries its
containers, volumes and conditions, a Node its images and conditions, any object its
``managedFields``: none of which the controller reads. So each object is cut to what
it reads as it is decoded, and its keys and short strings (``apiVersion``, the
namespace, the class and driver names, quantities...) are interned: the JSON decoder
shares a key only within one document, here they are shared across all of them.

Whole subtrees that repeat from object to object are shared too (:class:`Subtrees`):
a claim's ``spec`` (every claim of one template, or of one share size, has the same),
the configs and the node selector of its allocation, the capacity each result
consumes; a pod's tolerations, affinity and node selector. Half of a decoded claim's
memory was such copies (500 nodes, 5,000 claims: ``hack/bench/controller.py``). So
an object read from a cache is read-only, as it always was (the cache hands out the
object it holds): a change to a shared subtree would change every object holding it.

What is read, and so kept:

* pods (:func:`~.reconcile.pod_uses`, :func:`~.reconcile.pod_is_live`, the pending
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
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from dra_driver.k8s.rest import JsonObj

SHORT = 64
"""Strings up to this long are interned (names, kinds, quantities, selectors' values);
longer ones (messages, CEL expressions) are seldom shared."""

_IDENTITY = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
_POD_META = (*_IDENTITY, "deletionTimestamp", "ownerReferences")
_POD_SPEC = ("nodeName", "nodeSelector", "affinity", "tolerations", "resourceClaims")
_POD_STATUS = ("phase", "resourceClaimStatuses")
_NODE_META = (*_IDENTITY, "labels")
_NODE_SPEC = ("taints", "unschedulable")
_NAMESPACE_META = (*_IDENTITY, "annotations")


_UNIQUE = frozenset({"uid", "resourceVersion", "shareID"})
"""Keys whose values no other object shares: interning them would only grow the
interpreter's table of interned strings (by 2 MB at 5,000 claims and pods)."""


def shared(node: Any) -> Any:
    """A copy of a decoded JSON tree with its keys and short strings interned."""
    kind = type(node)
    if kind is dict:
        return {
            sys.intern(k): v if k in _UNIQUE and type(v) is str else shared(v)
            for k, v in node.items()
        }
    if kind is list:
        return [shared(v) for v in node]
    if kind is str and len(node) <= SHORT:
        return sys.intern(node)
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
    without bound."""

    def __init__(self, limit: int = 16_384) -> None:
        self._limit = limit
        self._by_digest: dict[bytes, Any] = {}

    def one(self, node: Any) -> Any:
        digest = hashlib.blake2b(repr(node).encode(), digest_size=16).digest()
        found = self._by_digest.get(digest)
        if found is None:
            if len(self._by_digest) >= self._limit:
                self._by_digest.clear()
            found = self._by_digest[digest] = node
        return found

    def __len__(self) -> int:
        return len(self._by_digest)

    def at(self, node: Any, path: Sequence[str]) -> None:
        """Share the subtrees of ``node`` at ``path`` (``*``: every item of a list),
        in place: ``node`` is a fresh copy of ours (:func:`shared`)."""
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
_claim_subtrees = Subtrees()
_pod_subtrees = Subtrees()
"""One table per kind: each informer decodes in a thread of its own."""


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
    return shared(out)  # type: ignore[no-any-return]


def slim_pod(pod: JsonObj) -> JsonObj:
    out = _cut(pod, {"metadata": _POD_META, "spec": _POD_SPEC, "status": _POD_STATUS})
    for path in _POD_SUBTREES:
        _pod_subtrees.at(out, path)
    return out


def slim_node(node: JsonObj) -> JsonObj:
    return _cut(node, {"metadata": _NODE_META, "spec": _NODE_SPEC})


def slim_namespace(namespace: JsonObj) -> JsonObj:
    return _cut(namespace, {"metadata": _NAMESPACE_META})


def slim_claim(claim: JsonObj) -> JsonObj:
    out = dict(claim)
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    status = out.get("status")
    if isinstance(status, dict) and "devices" in status:
        out["status"] = {k: v for k, v in status.items() if k != "devices"}
    kept: JsonObj = shared(out)
    for path in _CLAIM_SUBTREES:
        _claim_subtrees.at(kept, path)
    return kept


def whole(obj: JsonObj) -> JsonObj:
    """Kept as decoded (ResourceSlices, DeviceClasses: the allocator reads them whole)."""
    return obj
