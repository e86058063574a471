"""Which pods may use which claims, indexed both ways, so that neither a pod's change nor
a claim's decision scans every object of the other kind.

A pod names its claims in ``spec.resourceClaims[].resourceClaimName`` and, for claims
made from a template, in ``status.resourceClaimStatuses[].resourceClaimName``; a
template's claim also names its pod among its ``ownerReferences``. :func:`pod_uses` is
that rule, and the index holds exactly the pairs it accepts: scanning all pods per claim
and all claims per pod made the controller's work grow with the square of the claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dra_driver.core import claim_shape

NameKey = tuple[str, str]
"""(namespace, name)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def claims_named_by(pod: Mapping[str, Any]) -> set[NameKey]:
    namespace = str(_meta(pod).get("namespace", "default"))
    names = {
        ref.get("resourceClaimName") for ref in (pod.get("spec") or {}).get("resourceClaims") or []
    } | {
        status.get("resourceClaimName")
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    return {(namespace, str(n)) for n in names if n}


def owner_pods(claim: Mapping[str, Any]) -> set[str]:
    return {
        str(o.get("uid"))
        for o in claim_shape.owner_references(claim)
        if o.get("kind") == "Pod" and o.get("uid")
    }


def _claim_key(claim: Mapping[str, Any]) -> NameKey:
    return (claim_shape.namespace(claim) or "default", claim_shape.name(claim))


def pod_uses(pod: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """Whether ``pod`` may use ``claim``: it names the claim (:func:`claims_named_by`) or
    the claim names it as an owner (a claim made from the pod's template). The pairs the
    index holds are exactly these."""
    return _claim_key(claim) in claims_named_by(pod) or claim_shape.key(pod) in owner_pods(claim)


class ClaimPodIndex:
    def __init__(self) -> None:
        self._pods_naming: dict[NameKey, set[str]] = {}
        """Claim (namespace, name) -> UIDs of the pods that name it."""
        self._named_by_pod: dict[str, tuple[NameKey, ...]] = {}
        """Pod UID -> the claims it names (a tuple: a set is 216 bytes even for one)."""
        self._claim_by_key: dict[NameKey, str] = {}
        """Claim (namespace, name) -> its UID."""
        self._claims_owned: dict[str, set[str]] = {}
        """Pod UID -> UIDs of the claims it owns."""
        self._claim_keys: dict[str, tuple[NameKey, tuple[str, ...]]] = {}
        """Claim UID -> its (namespace, name) and owner pod UIDs, as indexed (tuples:
        most claims have no owner pod, and an empty set is 216 bytes a claim)."""

    # --- pods --------------------------------------------------------------------------

    def reset_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self._pods_naming.clear()
        self._named_by_pod.clear()
        for pod in pods:
            self.pod_changed(pod)

    def pod_changed(self, pod: Mapping[str, Any]) -> None:
        uid = claim_shape.key(pod)
        self.pod_gone(uid)
        keys = claims_named_by(pod)
        if keys:
            self._named_by_pod[uid] = tuple(keys)
            for key in keys:
                self._pods_naming.setdefault(key, set()).add(uid)

    def pod_gone(self, uid: str) -> None:
        for key in self._named_by_pod.pop(uid, ()):
            pods = self._pods_naming.get(key)
            if pods is not None:
                pods.discard(uid)
                if not pods:
                    del self._pods_naming[key]

    # --- claims ------------------------------------------------------------------------

    def reset_claims(self, claims: Iterable[Mapping[str, Any]]) -> None:
        self._claim_by_key.clear()
        self._claims_owned.clear()
        self._claim_keys.clear()
        for claim in claims:
            self.claim_changed(claim)

    def claim_changed(self, claim: Mapping[str, Any]) -> None:
        uid = claim_shape.key(claim)
        self.claim_gone(uid)
        key, owners = _claim_key(claim), owner_pods(claim)
        self._claim_by_key[key] = uid
        for pod in owners:
            self._claims_owned.setdefault(pod, set()).add(uid)
        self._claim_keys[uid] = (key, tuple(owners))

    def claim_gone(self, uid: str) -> None:
        indexed = self._claim_keys.pop(uid, None)
        if indexed is None:
            return
        key, owners = indexed
        if self._claim_by_key.get(key) == uid:
            del self._claim_by_key[key]
        for pod in owners:
            owned = self._claims_owned.get(pod)
            if owned is not None:
                owned.discard(uid)
                if not owned:
                    del self._claims_owned[pod]

    # --- lookups -----------------------------------------------------------------------

    def claims_of(self, pod: Mapping[str, Any]) -> set[str]:
        """UIDs of the claims ``pod`` may use: those it names, those it owns."""
        found = {uid for key in claims_named_by(pod) if (uid := self._claim_by_key.get(key))}
        return found | self._claims_owned.get(claim_shape.key(pod), set())

    def pods_of(self, claim: Mapping[str, Any]) -> set[str]:
        """UIDs of the pods that may use ``claim``: those that name it, its owners."""
        return self._pods_naming.get(_claim_key(claim), set()) | owner_pods(claim)
