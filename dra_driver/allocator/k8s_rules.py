"""Kubernetes matching rules shared by the allocator and the controller (pure).

* Tolerations (``core/v1`` Toleration and ``resource.k8s.io`` DeviceToleration
  alike): an empty ``effect`` matches every effect; ``Exists`` with an empty key
  tolerates every taint, with a key every taint of that key; ``Equal`` (the
  default, and what any other operator is read as) needs the same key and
  value (an absent value is ``""``). Only ``NoSchedule`` and ``NoExecute``
  taints keep pods and claims off (:func:`keeps_off`); ``PreferNoSchedule`` is a
  preference the scheduler may ignore, so it keeps nothing off here.
* Node selectors: a pod's ``nodeSelector`` (every label equal), its required
  node affinity (any term; a term matches when all its matchExpressions and
  matchFields do, an empty term matches nothing) and the node's taints
  (``spec.unschedulable`` counts as the ``node.kubernetes.io/unschedulable``
  NoSchedule taint): :func:`why_node_unfit`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects that keep what does not tolerate them off a node or device."""


def keeps_off(effect: str | None) -> bool:
    """Whether a taint of ``effect`` keeps off what does not tolerate it."""
    return effect in SCHEDULING_EFFECTS


def tolerates(
    key: str | None,
    operator: str | None,
    value: str | None,
    effect: str | None,
    *,
    taint_key: str | None,
    taint_value: str | None,
    taint_effect: str | None,
) -> bool:
    """Whether one toleration (``key``, ``operator``, ``value``, ``effect``) tolerates a taint."""
    if effect and effect != taint_effect:
        return False
    if operator == "Exists":
        return not key or key == taint_key
    return key == taint_key and (value or "") == (taint_value or "")


def tolerated(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether any of ``tolerations`` (JSON) tolerates ``taint`` (JSON)."""
    return any(
        tolerates(
            t.get("key"),
            t.get("operator"),
            t.get("value"),
            t.get("effect"),
            taint_key=taint.get("key"),
            taint_value=taint.get("value"),
            taint_effect=taint.get("effect"),
        )
        for t in tolerations
    )


def match_expression(expr: Mapping[str, Any], value: str | None) -> bool:  # noqa: PLR0911
    """A node selector requirement (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``,
    ``Lt``) against the label or field ``value`` (None: the node has none)."""
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or []]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """A node selector term: all its matchExpressions (labels) and matchFields
    (``metadata.name``) match; an empty term matches nothing."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    fields = {"metadata.name": (node.get("metadata") or {}).get("name")}
    exprs = term.get("matchExpressions") or []
    field_exprs = term.get("matchFields") or []
    if not exprs and not field_exprs:
        return False  # an empty term matches nothing
    return all(match_expression(e, labels.get(e.get("key"))) for e in exprs) and all(
        match_expression(e, fields.get(e.get("key"))) for e in field_exprs
    )


def node_fits_pod(node: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """The pod's nodeSelector, required node affinity and tolerations allow ``node``."""
    return why_node_unfit(node, pod) is None


def why_node_unfit(node: Mapping[str, Any], pod: Mapping[str, Any]) -> str | None:
    """What keeps ``pod`` off ``node`` (its selector, affinity, an untolerated taint), or None."""
    spec = pod.get("spec") or {}
    pod_name = (pod.get("metadata") or {}).get("name", "")
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return f"pod {pod_name}'s nodeSelector {key}={value} does not match"
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if required is not None and not any(term_matches(t, node) for t in required):
        return f"pod {pod_name}'s required node affinity does not match"
    tolerations = spec.get("tolerations") or []
    taints = list((node.get("spec") or {}).get("taints") or [])
    if (node.get("spec") or {}).get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    for t in taints:
        if keeps_off(t.get("effect")) and not tolerated(tolerations, t):
            value = f"={t['value']}" if t.get("value") else ""
            return (
                f"taint {t.get('key')}{value}:{t.get('effect')} is not tolerated by pod {pod_name}"
            )
    return None
