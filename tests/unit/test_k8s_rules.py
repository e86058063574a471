"""``allocator.k8s_rules``: the Kubernetes matching rules the allocator and controller share.

Tolerations (pod and device alike), node selector requirements and terms, and
why a node does not fit a pod.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.allocator.k8s_rules import (
    keeps_off,
    match_expression,
    node_fits_pod,
    term_matches,
    tolerated,
    why_node_unfit,
)
from dra_driver.allocator.model import Taint, Toleration

TAINT = {"key": "gpu", "value": "busy", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        pytest.param({"operator": "Exists"}, TAINT, True, id="exists-empty-key-matches-all"),
        pytest.param({"key": "", "operator": "Exists"}, TAINT, True, id="exists-blank-key"),
        pytest.param({"key": "gpu", "operator": "Exists"}, TAINT, True, id="exists-same-key"),
        pytest.param({"key": "cpu", "operator": "Exists"}, TAINT, False, id="exists-other-key"),
        pytest.param({"key": "gpu", "operator": "Equal", "value": "busy"}, TAINT, True, id="equal"),
        pytest.param({"key": "gpu", "value": "busy"}, TAINT, True, id="operator-defaults-equal"),
        pytest.param(
            {"key": "gpu", "operator": "Equal", "value": "idle"}, TAINT, False, id="other-value"
        ),
        pytest.param(
            {"key": "gpu", "operator": "Equal"},
            {"key": "gpu", "effect": "NoSchedule"},
            True,
            id="absent-values-are-equal",
        ),
        pytest.param({"key": "gpu", "operator": "Equal"}, TAINT, False, id="absent-vs-value"),
        pytest.param({"operator": "Equal", "value": "busy"}, TAINT, False, id="equal-no-key"),
        pytest.param({"operator": "Exists", "effect": "NoSchedule"}, TAINT, True, id="same-effect"),
        pytest.param(
            {"operator": "Exists", "effect": "NoExecute"}, TAINT, False, id="other-effect"
        ),
        pytest.param(
            {"key": "gpu", "operator": "Exists", "effect": ""}, TAINT, True, id="blank-effect-all"
        ),
    ],
)
def test_tolerations(toleration: dict[str, Any], taint: dict[str, Any], expected: bool) -> None:
    assert tolerated([toleration], taint) is expected
    # The allocator's typed device tolerations follow the same rule (its parser
    # reads an absent operator as Equal).
    typed = Toleration(
        toleration.get("key"),
        toleration.get("operator") or "Equal",
        toleration.get("value"),
        toleration.get("effect"),
    )
    device_taint = Taint(taint["key"], taint.get("value", ""), taint["effect"])
    assert typed.tolerates(device_taint) is expected


def test_no_tolerations_tolerate_nothing() -> None:
    assert not tolerated([], TAINT)


@pytest.mark.parametrize(
    ("effect", "expected"),
    [("NoSchedule", True), ("NoExecute", True), ("PreferNoSchedule", False), (None, False)],
)
def test_which_effects_keep_off(effect: str | None, expected: bool) -> None:
    assert keeps_off(effect) is expected


@pytest.mark.parametrize(
    ("operator", "values", "value", "expected"),
    [
        ("In", ["a", "b"], "a", True),
        ("In", ["a"], "c", False),
        ("In", ["a"], None, False),
        ("NotIn", ["a"], "c", True),
        ("NotIn", ["a"], "a", False),
        ("NotIn", ["a"], None, True),
        ("Exists", [], "x", True),
        ("Exists", [], None, False),
        ("DoesNotExist", [], None, True),
        ("DoesNotExist", [], "x", False),
        ("Gt", ["3"], "4", True),
        ("Gt", ["3"], "3", False),
        ("Lt", ["3"], "2", True),
        ("Lt", ["3"], "x", False),
        ("Gt", [], "4", False),
        ("Unknown", ["a"], "a", False),
    ],
)
def test_match_expression(
    operator: str, values: list[str], value: str | None, expected: bool
) -> None:
    assert match_expression({"key": "k", "operator": operator, "values": values}, value) is expected


NODE = {"metadata": {"name": "node-a", "labels": {"zone": "a", "gpus": "4"}}, "spec": {}}


@pytest.mark.parametrize(
    ("term", "expected"),
    [
        ({}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}, False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}, True),
        (
            {
                "matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["2"]}],
                "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}],
            },
            False,
        ),
    ],
)
def test_term_matches(term: dict[str, Any], expected: bool) -> None:
    assert term_matches(term, NODE) is expected


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


ZONE_A = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
ZONE_B = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}


@pytest.mark.parametrize(
    ("node_spec", "pod_spec", "why"),
    [
        ({}, {}, None),
        ({}, {"nodeSelector": {"zone": "a"}}, None),
        ({}, {"nodeSelector": {"zone": "b"}}, "pod p's nodeSelector zone=b does not match"),
        ({}, {"affinity": affinity(ZONE_B, ZONE_A)}, None),
        ({}, {"affinity": affinity(ZONE_B)}, "pod p's required node affinity does not match"),
        ({}, {"affinity": affinity()}, "pod p's required node affinity does not match"),
        ({"taints": [TAINT]}, {}, "taint gpu=busy:NoSchedule is not tolerated by pod p"),
        (
            {"taints": [{"key": "gpu", "effect": "NoExecute"}]},
            {},
            "taint gpu:NoExecute is not tolerated by pod p",
        ),
        ({"taints": [{"key": "gpu", "effect": "PreferNoSchedule"}]}, {}, None),
        ({"taints": [TAINT]}, {"tolerations": [{"operator": "Exists"}]}, None),
        (
            {"unschedulable": True},
            {},
            "taint node.kubernetes.io/unschedulable:NoSchedule is not tolerated by pod p",
        ),
        (
            {"unschedulable": True},
            {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
            None,
        ),
    ],
)
def test_why_node_unfit(
    node_spec: dict[str, Any], pod_spec: dict[str, Any], why: str | None
) -> None:
    node = {**NODE, "spec": node_spec}
    pod = {"metadata": {"name": "p"}, "spec": pod_spec}
    assert why_node_unfit(node, pod) == why
    assert node_fits_pod(node, pod) is (why is None)
