"""Admission of the fake API server's writes: ValidatingAdmissionPolicies and the
ResourceClaim status authorization of 1.36+.

Pure but for CEL (``common-expression-language``, the ``cel`` module). Runs after
the object is validated and before it is stored, as the API server's
``createValidation``/``updateValidation`` hooks do, on create, update, patch and
delete (dry runs included).

ValidatingAdmissionPolicy (``admissionregistration.k8s.io/v1``), as the real
plugin evaluates it: a policy applies through each of its bindings; its
``matchConstraints.resourceRules`` match the request's group, version, operation
and resource (``resourceclaims/status`` matches only the status subresource);
``matchConditions`` must all hold; ``variables`` are computed in order; the first
failed validation of the first denying policy is the answer: 422 ``Invalid``
(or the validation's ``reason``) with the message ``<resource>.<group> "<name>"
is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>'
denied request: <message>``. CEL sees ``object``, ``oldObject`` (null on create,
respectively delete), ``request`` (``kind`` and ``resource`` as group, version and
kind or resource, ``operation``, ``userInfo``, ``namespace``, ``name``,
``subResource``) and ``variables``; a validation's ``messageExpression``, when it
has one, is its message (the real server prefers it to ``message``). NOT emulated:
``paramKind``, ``namespaceSelector``/``objectSelector``, ``matchPolicy`` equivalents,
``excludeResourceRules``, validation actions other than Deny, ``auditAnnotations``,
cost limits, and CEL's optional syntax (the chart avoids it).

ResourceClaim status writes on 1.36+ (DRAResourceClaimGranularStatusAuthorization,
beta and on; ``pkg/registry/resource`` ``AuthorizedForBinding`` and
``AuthorizedForDeviceStatus``): a change of ``status.allocation`` or
``status.reservedFor`` also needs the request's verb on ``resourceclaims/binding``
at the cluster scope; a change of any ``status.devices`` entry (by driver, pool,
device, shareID) needs, per driver, ``associated-node:<verb>`` (a ServiceAccount
whose token names the claim's one allocated node) or ``arbitrary-node:<verb>`` on
``resourceclaims/driver`` named for that driver in the claim's namespace. A
refusal is 422 ``Invalid``, a ``status: Forbidden`` field error carrying the 403
message of the check (the field path ``status`` is our reading; the text is the
server's).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tests.support.fakekube_auth import (
    Attributes,
    Authenticator,
    Rbac,
    User,
    forbidden,
    node_of_allocation,
    service_account_of,
)
from tests.support.fakekube_types import FakeApiError, JsonObj, ResourceKind

_REASON_CODES = {
    "Invalid": 422,
    "Forbidden": 403,
    "Unauthorized": 401,
    "RequestEntityTooLarge": 413,
}


@dataclass(frozen=True)
class WriteRequest:
    """One write as admission sees it."""

    user: User
    operation: str
    """CREATE, UPDATE or DELETE (a patch is an UPDATE)."""
    verb: str
    """The RBAC verb: create, update, patch, delete."""
    kind: ResourceKind
    namespace: str
    name: str
    subresource: str


@dataclass(frozen=True)
class _Policy:
    name: str
    bindings: tuple[str, ...]
    spec: JsonObj

    def matches(self, request: WriteRequest) -> bool:
        resource = request.kind.plural + (f"/{request.subresource}" if request.subresource else "")
        for rule in (self.spec.get("matchConstraints") or {}).get("resourceRules") or ():
            if (
                _has(rule.get("apiGroups"), request.kind.group)
                and _has(rule.get("apiVersions"), request.kind.version)
                and _has(rule.get("operations"), request.operation)
                and _has(rule.get("resources"), resource)
            ):
                return True
        return False


def _has(values: Iterable[str] | None, value: str) -> bool:
    return any(v in ("*", value) for v in values or ())


class Admission:
    """The chart's policies and the release's status authorization, over ``rbac``."""

    def __init__(self, objects: Iterable[JsonObj], rbac: Rbac, *, kube_minor: int) -> None:
        docs = list(objects)
        bindings: dict[str, list[str]] = {}
        for d in docs:
            if d.get("kind") == "ValidatingAdmissionPolicyBinding":
                spec = d.get("spec") or {}
                if "Deny" in (spec.get("validationActions") or ()):
                    bindings.setdefault(spec["policyName"], []).append(d["metadata"]["name"])
        self._policies = tuple(
            _Policy(d["metadata"]["name"], tuple(bindings[d["metadata"]["name"]]), d["spec"])
            for d in docs
            if d.get("kind") == "ValidatingAdmissionPolicy" and d["metadata"]["name"] in bindings
        )
        self._rbac = rbac
        self._granular_status = kube_minor >= 36

    def admit(self, request: WriteRequest, old: JsonObj | None, new: JsonObj | None) -> None:
        """Raise the API server's refusal of this write, if any."""
        claim_status = request.kind.kind == "ResourceClaim" and request.subresource == "status"
        if self._granular_status and claim_status:
            self._authorize_claim_status(request, old or {}, new or {})
        for policy in self._policies:
            if policy.matches(request):
                _run_policy(policy, request, old, new)

    def _authorize_claim_status(self, request: WriteRequest, old: JsonObj, new: JsonObj) -> None:
        before, after = old.get("status") or {}, new.get("status") or {}
        problems: list[str] = []
        if any(before.get(f) != after.get(f) for f in ("allocation", "reservedFor")):
            attrs = Attributes(request.verb, "resource.k8s.io", "resourceclaims", "binding")
            if not self._rbac.allows(request.user, attrs):
                problems.append(
                    "changing status.allocation or status.reservedFor requires "
                    f'resource="resourceclaims/binding", verb="{request.verb}" permission: '
                    f"{forbidden(request.user, attrs).message}"
                )
        node = node_of_allocation(new)
        associated = (
            bool(node)
            and service_account_of(request.user) is not None
            and request.user.extra.get("authentication.kubernetes.io/node-name") == (node,)
        )
        prefixes = ("associated-node:", "arbitrary-node:") if associated else ("arbitrary-node:",)
        verbs = [p + request.verb for p in prefixes]
        for driver in sorted(_changed_drivers(before, after)):
            tries = [
                Attributes(
                    v, "resource.k8s.io", "resourceclaims", "driver", request.namespace, driver
                )
                for v in verbs
            ]
            if not any(self._rbac.allows(request.user, a) for a in tries):
                shown = "[" + " ".join(verbs) + "]"
                problems.append(
                    f'changing status.devices requires resource="resourceclaims/driver", '
                    f'verb="{shown}" permission: {forbidden(request.user, tries[0]).message}'
                )
        if problems:
            causes = "; ".join(f"status: Forbidden: {p}" for p in problems)
            raise FakeApiError(
                422,
                f'ResourceClaim.resource.k8s.io "{request.name}" is invalid: {causes}',
                kind=request.kind,
                name=request.name,
            )


def _device_key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID", "")),
    )


def _changed_drivers(before: JsonObj, after: JsonObj) -> set[str]:
    """Drivers whose status.devices entries were added, removed or changed."""
    old = {_device_key(d): d for d in before.get("devices") or ()}
    changed: set[str] = set()
    for entry in after.get("devices") or ():
        key = _device_key(entry)
        if old.pop(key, None) != entry:
            changed.add(key[0])
    changed.update(key[0] for key in old)
    return changed


def _run_policy(
    policy: _Policy, request: WriteRequest, old: JsonObj | None, new: JsonObj | None
) -> None:
    import cel  # common-expression-language: the test extra

    kind = request.kind
    env: dict[str, Any] = {
        "request": {
            "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
            "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
            "operation": request.operation,
            "userInfo": request.user.as_cel(),
            "namespace": request.namespace,
            "name": request.name,
            "subResource": request.subresource,
        },
        "object": copy.deepcopy(new),
        "oldObject": copy.deepcopy(old),
        "variables": {},
    }
    spec = policy.spec
    if not all(cel.evaluate(c["expression"], env) for c in spec.get("matchConditions") or ()):
        return
    for variable in spec.get("variables") or ():  # in order: later ones read earlier ones
        value = cel.evaluate(variable["expression"], env)
        env["variables"] = {**env["variables"], variable["name"]: value}
    for check in spec.get("validations") or ():
        if cel.evaluate(check["expression"], env):
            continue
        message = (
            cel.evaluate(check["messageExpression"], env)
            if "messageExpression" in check
            else check.get("message", "")
        )
        reason = check.get("reason") or "Invalid"
        qualified = kind.qualified
        err = FakeApiError(
            _REASON_CODES.get(reason, 422),
            f'{qualified} "{request.name}" is forbidden: ValidatingAdmissionPolicy '
            f"'{policy.name}' with binding '{policy.bindings[0]}' denied request: "
            f"{str(message).strip()}",
            reason=reason,
            kind=kind,
            name=request.name,
        )
        raise err


class ApiSecurity:
    """What the fake checks of a request before it serves it: who sent it
    (:class:`~tests.support.fakekube_auth.Authenticator`), whether RBAC allows it
    (:class:`~tests.support.fakekube_auth.Rbac`), and whether admission lets a write
    through (:class:`Admission`). Built from rendered manifests: Roles, ClusterRoles,
    their bindings, ValidatingAdmissionPolicies and their bindings; the rest is ignored."""

    def __init__(self, objects: Iterable[JsonObj], *, kube_minor: int) -> None:
        docs = list(objects)
        self.authenticator = Authenticator()
        self.rbac = Rbac(docs)
        self.admission = Admission(docs, self.rbac, kube_minor=kube_minor)
        self.documents = tuple(docs)

    def token_for(self, user: User) -> str:
        return self.authenticator.token_for(user)
