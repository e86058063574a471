"""Pods and claims indexed both ways: by the names a pod gives, by a claim's owner pod."""

from __future__ import annotations

from typing import Any

from dra_driver.controller.claim_index import ClaimPodIndex, pod_uses

JsonObj = dict[str, Any]


def pod(uid: str, *claims: str, namespace: str = "ns", generated: str = "") -> JsonObj:
    obj: JsonObj = {
        "metadata": {"uid": uid, "name": uid, "namespace": namespace},
        "spec": {"resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims]},
    }
    if generated:  # a claim made from the pod's template, named in its status
        obj["status"] = {"resourceClaimStatuses": [{"name": "t", "resourceClaimName": generated}]}
    return obj


def claim(uid: str, name: str, namespace: str = "ns", owner: str = "") -> JsonObj:
    meta: JsonObj = {"uid": uid, "name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [{"kind": "Pod", "uid": owner, "name": owner}]
    return {"metadata": meta}


def test_a_pod_finds_the_claims_it_names_and_owns_and_back() -> None:
    index = ClaimPodIndex()
    c1, c2, c3 = claim("u1", "c1"), claim("u2", "c2"), claim("u3", "gen", owner="p2")
    other_namespace = claim("u4", "c1", namespace="elsewhere")
    index.reset_claims([c1, c2, c3, other_namespace])
    p1, p2 = pod("p1", "c1", "c2"), pod("p2", generated="gen")
    index.reset_pods([p1, p2])
    assert index.claims_of(p1) == {"u1", "u2"}
    assert index.claims_of(p2) == {"u3"}
    assert index.pods_of(c1) == {"p1"}
    assert index.pods_of(c3) == {"p2"}
    assert index.pods_of(other_namespace) == set()


def test_changes_and_deletions_move_the_entries() -> None:
    index = ClaimPodIndex()
    c1 = claim("u1", "c1")
    index.claim_changed(c1)
    index.pod_changed(pod("p1", "c1"))
    index.pod_changed(pod("p1", "c2"))  # the pod now names another claim
    assert index.pods_of(c1) == set()
    assert index.pods_of(claim("u2", "c2")) == {"p1"}
    index.pod_gone("p1")
    assert index.pods_of(claim("u2", "c2")) == set()
    index.pod_changed(pod("p9", "c1"))
    index.claim_gone("u1")
    assert index.claims_of(pod("p9", "c1")) == set()
    # A claim recreated under the same name (a new UID) is found by it again.
    index.claim_changed(claim("u5", "c1"))
    assert index.claims_of(pod("p9", "c1")) == {"u5"}


def test_pod_uses_is_the_rule_the_index_holds() -> None:
    """One rule for "the claims a pod uses": every pair the index gives is one that
    :func:`pod_uses` accepts, and none other."""
    claims = [
        claim("u1", "c1"),
        claim("u2", "c2"),
        claim("u3", "gen", owner="p2"),
        claim("u4", "c1", namespace="elsewhere"),
        claim("u5", "owned-only", owner="p3"),
    ]
    pods = [pod("p1", "c1", "c2"), pod("p2", generated="gen"), pod("p3"), pod("p4", "c9")]
    index = ClaimPodIndex()
    index.reset_claims(claims)
    index.reset_pods(pods)
    indexed = {(p["metadata"]["uid"], uid) for p in pods for uid in index.claims_of(p)}
    accepted = {
        (p["metadata"]["uid"], c["metadata"]["uid"]) for p in pods for c in claims if pod_uses(p, c)
    }
    assert indexed == accepted == {("p1", "u1"), ("p1", "u2"), ("p2", "u3"), ("p3", "u5")}
