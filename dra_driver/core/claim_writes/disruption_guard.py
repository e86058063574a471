"""The disruption guard's decisions (pure): which pods, which annotation changes.

While a claim of ours that asked for it is prepared on a node, the pods on that
node that use it carry the two annotations node autoscalers read before they
consolidate a node (:data:`GUARD_ANNOTATIONS`): Karpenter's
``karpenter.sh/do-not-disrupt: "true"`` and cluster-autoscaler's
``cluster-autoscaler.kubernetes.io/safe-to-evict: "false"``. They go when the
last guarded claim of the pod is unprepared.

Only what this driver set is ever removed. The pod records it in one
annotation of ours, the marker (:func:`marker_key`, ``<driver>/disruption-guard-set``),
whose value is compact JSON: ``{"claims": [<claim UIDs>], "set": [<keys we set>]}``.
A key the pod already had (the user's own ``do-not-disrupt``, or a
``safe-to-evict: "true"`` the user chose) is never written and never
recorded, so it is never removed; a key we set whose value someone changed
since is left alone too. Keeping the claims in the pod, not in the plugin,
makes the guard stateless: a restarted plugin reads what it did from the pods.

A claim asks for the guard with the claim annotation :func:`opt_in_key`
(``<driver>/disruption-guard: "true"``; on a ResourceClaimTemplate, in
``spec.metadata.annotations``, which the API copies into each claim). The node
setting :class:`GuardMode` says which claims are guarded: none, those that ask,
or all but those that say ``"false"``. An annotation rather than a field of the
opaque ``GpuConfig`` because the guard is about the pod, not a device (the
opaque config is per request), an annotation can be set where no opaque config
can be (no byte-compared ``RawExtension``, no per-request merge), and
reading it changes nothing in the plan.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
CA_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
GUARD_ANNOTATIONS: Mapping[str, str] = {
    KARPENTER_DO_NOT_DISRUPT: "true",
    CA_SAFE_TO_EVICT: "false",
}
"""What a guarded pod carries; the only pod keys (with the marker) the plugin writes."""

OPT_IN_SUFFIX = "disruption-guard"
MARKER_SUFFIX = "disruption-guard-set"


def opt_in_key(driver_name: str) -> str:
    """The claim annotation that asks for (``"true"``) or refuses (``"false"``) the guard."""
    return f"{driver_name}/{OPT_IN_SUFFIX}"


def marker_key(driver_name: str) -> str:
    """The pod annotation recording which claims guard the pod and which keys we set."""
    return f"{driver_name}/{MARKER_SUFFIX}"


class GuardMode(enum.StrEnum):
    """Which prepared claims guard their pods (``--disruption-guard``)."""

    OFF = "off"
    ANNOTATED = "annotated"
    """Claims annotated ``<driver>/disruption-guard: "true"``."""
    ALL = "all"
    """Every claim except those annotated ``"false"`` (also the scheduler-made claims of
    extended resources, which a user cannot annotate)."""


def claim_wants_guard(
    mode: GuardMode, annotations: Mapping[str, str], driver_name: str
) -> tuple[bool, str]:
    """Whether a claim with ``annotations`` guards its pods; and a warning ("" if none)
    for a value of the opt-in annotation that is neither ``true`` nor ``false``."""
    if mode is GuardMode.OFF:
        return False, ""
    key = opt_in_key(driver_name)
    raw = annotations.get(key)
    value = raw.strip().lower() if isinstance(raw, str) else None
    warning = ""
    if value not in (None, "true", "false"):
        warning = f'annotation {key}={raw!r} is neither "true" nor "false"; taken as absent'
        value = None
    if mode is GuardMode.ALL:
        return value != "false", warning
    return value == "true", warning


def pod_uses_claim(pod: Mapping[str, Any], claim_name: str) -> bool:
    """Whether ``pod`` names the claim: ``spec.resourceClaims[].resourceClaimName``, the
    claim made from a template (``status.resourceClaimStatuses[].resourceClaimName``) or
    the scheduler's extended-resource claim (``status.extendedResourceClaimStatus``)."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    names = [c.get("resourceClaimName") for c in spec.get("resourceClaims") or () if c]
    names += [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or () if s]
    extended = status.get("extendedResourceClaimStatus") or {}
    names.append(extended.get("resourceClaimName"))
    return claim_name in names


def pod_finished(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class Marker:
    """The marker annotation's content."""

    claims: frozenset[str] = frozenset()
    set_keys: frozenset[str] = frozenset()

    def encode(self) -> str:
        body = {"claims": sorted(self.claims), "set": sorted(self.set_keys)}
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def decode(cls, text: str | None) -> Marker | None:
        """None when absent; a value we cannot read counts as "we set nothing"."""
        if text is None:
            return None
        try:
            body = json.loads(text)
            claims = frozenset(str(c) for c in body.get("claims") or ())
            keys = frozenset(str(k) for k in body.get("set") or () if k in GUARD_ANNOTATIONS)
        except (ValueError, TypeError, AttributeError):
            return cls()
        return cls(claims, keys)


def annotation_changes(
    annotations: Mapping[str, str],
    driver_name: str,
    *,
    add: Iterable[str] = (),
    remove: Iterable[str] = (),
) -> dict[str, str | None]:
    """The merge-patch of ``metadata.annotations`` that makes claims ``add`` guard the pod
    and claims ``remove`` no longer; only the keys that change, None removing a key.
    Empty: nothing to write.

    A key is set only where the pod lacks it, and removed only when no guarding
    claim is left, we recorded setting it, and it still has the value we set.
    """
    key = marker_key(driver_name)
    marker = Marker.decode(annotations.get(key))
    old = marker or Marker()
    claims = (old.claims | frozenset(add)) - frozenset(remove)
    changes: dict[str, str | None] = {}
    set_keys = set(old.set_keys)
    if claims:
        for name, value in GUARD_ANNOTATIONS.items():
            if name not in annotations:
                changes[name] = value
                set_keys.add(name)
        new = Marker(claims, frozenset(set_keys))
        if marker is None or new != marker:
            changes[key] = new.encode()
        return changes
    if marker is None:
        return changes
    for name in sorted(old.set_keys):
        if annotations.get(name) == GUARD_ANNOTATIONS[name]:
            changes[name] = None
    changes[key] = None
    return changes


def guarded_claims(annotations: Mapping[str, str], driver_name: str) -> frozenset[str]:
    """The claim UIDs the pod's marker names (empty without a marker)."""
    marker = Marker.decode(annotations.get(marker_key(driver_name)))
    return marker.claims if marker is not None else frozenset()


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    meta = pod.get("metadata") or {}
    return {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
