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

import sys
from collections.abc import Iterable
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


def shared(node: Any) -> Any:
    """A copy of a decoded JSON tree with its keys and short strings interned."""
    kind = type(node)
    if kind is dict:
        return {sys.intern(k): shared(v) for k, v in node.items()}
    if kind is list:
        return [shared(v) for v in node]
    if kind is str and len(node) <= SHORT:
        return sys.intern(node)
    return node


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
    return _cut(pod, {"metadata": _POD_META, "spec": _POD_SPEC, "status": _POD_STATUS})


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
    return shared(out)  # type: ignore[no-any-return]


def whole(obj: JsonObj) -> JsonObj:
    """Kept as decoded (ResourceSlices, DeviceClasses: the allocator reads them whole)."""
    return obj
