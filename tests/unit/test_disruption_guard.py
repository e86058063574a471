"""The disruption guard's pure decisions: which claims, which pods, which annotation changes."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.core.claim_writes import (
    CA_SAFE_TO_EVICT,
    KARPENTER_DO_NOT_DISRUPT,
    GuardMode,
    Marker,
    annotation_changes,
    claim_wants_guard,
    guarded_claims,
    marker_key,
    opt_in_key,
    pod_uses_claim,
)

DRIVER = "gpu.fractional.dev"
MARKER = marker_key(DRIVER)
OPT_IN = opt_in_key(DRIVER)


def test_keys() -> None:
    assert OPT_IN == "gpu.fractional.dev/disruption-guard"
    assert MARKER == "gpu.fractional.dev/disruption-guard-set"
    assert (CA_SAFE_TO_EVICT, KARPENTER_DO_NOT_DISRUPT) == (
        "cluster-autoscaler.kubernetes.io/safe-to-evict",
        "karpenter.sh/do-not-disrupt",
    )


@pytest.mark.parametrize(
    ("mode", "value", "wanted", "warns"),
    [
        (GuardMode.OFF, "true", False, False),
        (GuardMode.ANNOTATED, None, False, False),
        (GuardMode.ANNOTATED, "true", True, False),
        (GuardMode.ANNOTATED, " True ", True, False),
        (GuardMode.ANNOTATED, "false", False, False),
        (GuardMode.ANNOTATED, "yes", False, True),
        (GuardMode.ALL, None, True, False),
        (GuardMode.ALL, "false", False, False),
        (GuardMode.ALL, "nope", True, True),
    ],
    ids=repr,
)
def test_which_claims_guard(mode: GuardMode, value: str | None, wanted: bool, warns: bool) -> None:
    annotations = {} if value is None else {OPT_IN: value}
    got, warning = claim_wants_guard(mode, annotations, DRIVER)
    assert got is wanted
    assert bool(warning) is warns
    if warns:
        assert OPT_IN in warning and "neither" in warning


def _pod(**fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, **fields}


@pytest.mark.parametrize(
    ("pod", "uses"),
    [
        (_pod(spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}), True),
        (
            _pod(
                spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
                status={"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c"}]},
            ),
            True,
        ),
        (_pod(status={"extendedResourceClaimStatus": {"resourceClaimName": "c"}}), True),
        (_pod(spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": "other"}]}), False),
        (_pod(spec={"resourceClaims": [{"name": "c", "resourceClaimTemplateName": "c"}]}), False),
        (_pod(), False),
    ],
    ids=["direct", "from-template", "extended-resource", "other-claim", "template-name", "none"],
)
def test_which_pods_use_a_claim(pod: dict[str, Any], uses: bool) -> None:
    assert pod_uses_claim(pod, "c") is uses


def marker(claims: set[str], keys: set[str]) -> str:
    return Marker(frozenset(claims), frozenset(keys)).encode()


BOTH = {KARPENTER_DO_NOT_DISRUPT, CA_SAFE_TO_EVICT}
GUARDED = {KARPENTER_DO_NOT_DISRUPT: "true", CA_SAFE_TO_EVICT: "false"}


@pytest.mark.parametrize(
    ("before", "add", "remove", "changes"),
    [
        ({}, {"u1"}, set(), {**GUARDED, MARKER: marker({"u1"}, BOTH)}),
        (
            {"app": "x", KARPENTER_DO_NOT_DISRUPT: "true"},
            {"u1"},
            set(),
            {CA_SAFE_TO_EVICT: "false", MARKER: marker({"u1"}, {CA_SAFE_TO_EVICT})},
        ),
        (
            # A user who said the pod may be evicted keeps that.
            {CA_SAFE_TO_EVICT: "true"},
            {"u1"},
            set(),
            {KARPENTER_DO_NOT_DISRUPT: "true", MARKER: marker({"u1"}, {KARPENTER_DO_NOT_DISRUPT})},
        ),
        ({**GUARDED, MARKER: marker({"u1"}, BOTH)}, {"u1"}, set(), {}),
        (
            {**GUARDED, MARKER: marker({"u1"}, BOTH)},
            {"u2"},
            set(),
            {MARKER: marker({"u1", "u2"}, BOTH)},
        ),
        (
            {**GUARDED, MARKER: marker({"u1", "u2"}, BOTH)},
            set(),
            {"u1"},
            {MARKER: marker({"u2"}, BOTH)},
        ),
        (
            {**GUARDED, MARKER: marker({"u1"}, BOTH)},
            set(),
            {"u1"},
            {KARPENTER_DO_NOT_DISRUPT: None, CA_SAFE_TO_EVICT: None, MARKER: None},
        ),
        (
            # The user's own do-not-disrupt is never removed.
            {**GUARDED, MARKER: marker({"u1"}, {CA_SAFE_TO_EVICT})},
            set(),
            {"u1"},
            {CA_SAFE_TO_EVICT: None, MARKER: None},
        ),
        (
            # Someone changed a value we set: theirs now.
            {
                KARPENTER_DO_NOT_DISRUPT: "false",
                CA_SAFE_TO_EVICT: "false",
                MARKER: marker({"u1"}, BOTH),
            },
            set(),
            {"u1"},
            {CA_SAFE_TO_EVICT: None, MARKER: None},
        ),
        ({**GUARDED}, set(), {"u1"}, {}),
        ({"app": "x"}, set(), {"u1"}, {}),
        (
            # An unreadable marker: we set nothing we know of; only the marker goes.
            {**GUARDED, MARKER: "{broken"},
            set(),
            {"u1"},
            {MARKER: None},
        ),
    ],
    ids=[
        "add-to-bare-pod",
        "user-do-not-disrupt-kept",
        "user-safe-to-evict-kept",
        "already-guarded",
        "second-claim",
        "one-of-two-released",
        "last-released",
        "user-key-never-removed",
        "changed-value-left",
        "user-annotations-without-marker",
        "nothing-ours",
        "unreadable-marker",
    ],
)
def test_annotation_changes(
    before: dict[str, str], add: set[str], remove: set[str], changes: dict[str, str | None]
) -> None:
    assert annotation_changes(before, DRIVER, add=add, remove=remove) == changes
    after = {k: v for k, v in {**before, **changes}.items() if v is not None}
    # Applying the changes is a fixed point: nothing more to write.
    assert annotation_changes(after, DRIVER, add=add, remove=remove) == {}
    user_keys = {k for k in before if k != MARKER} - (
        (Marker.decode(before.get(MARKER)) or Marker()).set_keys
    )
    for key in user_keys:
        assert after.get(key) == before[key], f"user's {key} changed"


def test_marker_round_trip_and_claims() -> None:
    text = marker({"b", "a"}, BOTH)
    assert text == (
        '{"claims":["a","b"],"set":["cluster-autoscaler.kubernetes.io/safe-to-evict",'
        '"karpenter.sh/do-not-disrupt"]}'
    )
    assert Marker.decode(text) == Marker(frozenset({"a", "b"}), frozenset(BOTH))
    assert guarded_claims({MARKER: text}, DRIVER) == {"a", "b"}
    assert guarded_claims({}, DRIVER) == frozenset()
    # Keys we never write are not taken from a marker (someone edited it).
    assert Marker.decode('{"claims":["a"],"set":["app"]}') == Marker(frozenset({"a"}))
