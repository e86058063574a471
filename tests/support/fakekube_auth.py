"""Authentication and RBAC authorization of the fake API server, as kube-apiserver does them.

Pure: no HTTP here. :class:`Authenticator` maps bearer tokens to users (the
tokens a test hands out with :meth:`Authenticator.token_for`, as a
ServiceAccount's projected token or a TokenRequest would be); :class:`Rbac`
decides a request from the Roles, ClusterRoles and bindings it was given (for
the driver: those ``helm template`` renders from the chart) plus the bootstrap
policy every cluster has (``system:masters``; ``/version``, ``/healthz``,
``/livez`` and ``/readyz`` for everyone, discovery for the authenticated).

What the real server does, and so this fake:

* request attributes (``k8s.io/apiserver`` RequestInfo): GET of a name is
  ``get``, of a collection ``list``, with ``watch=true`` ``watch``; POST
  ``create``; PUT ``update``; PATCH ``patch`` whatever the patch type (JSON,
  merge, strategic merge, server-side apply); DELETE ``delete`` (of a collection
  ``deletecollection``). A subresource is matched as ``resource/subresource``;
  a ``fieldSelector`` of ``metadata.name=X`` names ``X`` on list and watch. A
  create has no name, so a rule limited by ``resourceNames`` never allows it;
* RBAC rules (``rbac/v1`` ``RuleAllows``): verbs, apiGroups, resources and
  resourceNames each match exactly or by ``*`` (``*/sub`` for any resource's
  subresource); a Role bound by a RoleBinding holds in its namespace, a
  ClusterRole bound by a RoleBinding in the binding's namespace, by a
  ClusterRoleBinding everywhere; subjects are ServiceAccounts (name and
  namespace), Users and Groups. A ServiceAccount user is
  ``system:serviceaccount:NS:NAME`` in the groups ``system:serviceaccounts``,
  ``system:serviceaccounts:NS`` and ``system:authenticated``; a pod's token
  carries its node in ``authentication.kubernetes.io/node-name``
  (ServiceAccountTokenPodNodeInfo, on by default since 1.32);
* a request without a token is ``system:anonymous`` (group
  ``system:unauthenticated``; kube-apiserver's default ``--anonymous-auth``);
  an unknown token is 401 ``Unauthorized``;
* a refusal is 403 ``Forbidden`` with the message of
  ``responsewriters.ForbiddenStatusError``: ``<resource>.<group> "<name>" is
  forbidden: User "<user>" cannot <verb> resource "<resource>[/<sub>]" in API
  group "<group>" in the namespace "<ns>"`` (``at the cluster scope`` without
  one), and ``details`` {name, group, kind: resource}.

NOT emulated: aggregated ClusterRoles (``aggregationRule``), impersonation,
any other authorizer (Node, Webhook, ABAC), the bootstrap roles beyond those
named above, ``resourceNames`` on a collection without the name selector, and
the authorizer's selector-aware decisions (``AuthorizeWithSelectors``).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.support.fakekube_types import FakeApiError, JsonObj

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
"""The user's extra that names the node of the pod a ServiceAccount token was made for."""

MASTERS = "system:masters"


@dataclass(frozen=True)
class User:
    """Who a request is from, as an authenticator says."""

    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def as_cel(self) -> JsonObj:
        """``request.userInfo`` as admission CEL sees it."""
        return {
            "username": self.name,
            "groups": list(self.groups),
            "extra": {k: list(v) for k, v in self.extra.items()},
        }


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))
ADMIN = User("kubernetes-admin", (MASTERS, "system:authenticated"))
"""The identity a kubeadm admin.conf gives: all is allowed (``system:masters``)."""


def service_account(namespace: str, name: str, *, node: str | None = None) -> User:
    """The user of a ServiceAccount token; ``node``: the token of a pod on that node."""
    extra = {NODE_NAME_KEY: (node,)} if node else {}
    return User(
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        extra,
    )


def service_account_of(user: User) -> tuple[str, str] | None:
    """(namespace, name) when ``user`` is a ServiceAccount."""
    parts = user.name.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and all(parts[2:]):
        return parts[2], parts[3]
    return None


class Authenticator:
    """Bearer tokens to users. Thread-safe: the HTTP side reads while tests add."""

    def __init__(self) -> None:
        self._users: dict[str, User] = {}
        self._lock = threading.Lock()

    def token_for(self, user: User) -> str:
        """A new token that authenticates as ``user``."""
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._users[token] = user
        return token

    def authenticate(self, authorization: str | None) -> User:
        """The user of an ``Authorization`` header; 401 for a token nobody issued."""
        if not authorization:
            return ANONYMOUS
        scheme, _, token = authorization.partition(" ")
        with self._lock:
            user = self._users.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise FakeApiError(401, "Unauthorized")
        return user


@dataclass(frozen=True)
class Attributes:
    """What authorization decides on (``authorizer.Attributes``)."""

    verb: str
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    """For a non-resource request (``/version``)."""

    @property
    def is_resource(self) -> bool:
        return bool(self.resource)

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def verb_of(method: str, *, named: bool, watch: bool) -> str:
    """The RBAC verb of an HTTP request on a resource (RequestInfo's mapping)."""
    if method == "GET":
        return "watch" if watch else ("get" if named else "list")
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method in verbs:
        return verbs[method]
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return method.lower()


@dataclass(frozen=True)
class _Rule:
    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    resource_names: frozenset[str]
    non_resource_urls: frozenset[str]

    @classmethod
    def of(cls, rule: Mapping[str, Any]) -> _Rule:
        def values(key: str) -> frozenset[str]:
            return frozenset(str(v) for v in rule.get(key) or ())

        return cls(
            values("verbs"),
            values("apiGroups"),
            values("resources"),
            values("resourceNames"),
            values("nonResourceURLs"),
        )

    def allows(self, attrs: Attributes) -> bool:
        if not ("*" in self.verbs or attrs.verb in self.verbs):
            return False
        if not attrs.is_resource:
            return any(_url_matches(u, attrs.path) for u in self.non_resource_urls)
        return (
            ("*" in self.api_groups or attrs.api_group in self.api_groups)
            and self._resource_matches(attrs)
            and (not self.resource_names or attrs.name in self.resource_names)
        )

    def _resource_matches(self, attrs: Attributes) -> bool:
        if "*" in self.resources or attrs.full_resource in self.resources:
            return True
        return bool(attrs.subresource) and f"*/{attrs.subresource}" in self.resources


def _url_matches(pattern: str, path: str) -> bool:
    if pattern in ("*", path):
        return True
    return pattern.endswith("*") and path.startswith(pattern[:-1])


@dataclass(frozen=True)
class _Subject:
    kind: str
    name: str
    namespace: str

    def includes(self, user: User) -> bool:
        if self.kind == "User":
            return user.name == self.name
        if self.kind == "Group":
            return self.name in user.groups
        return service_account_of(user) == (self.namespace, self.name)


@dataclass(frozen=True)
class _Grant:
    """A bound role: its rules hold for its subjects in ``namespace`` (None: everywhere)."""

    namespace: str | None
    subjects: tuple[_Subject, ...]
    rules: tuple[_Rule, ...]


_BOOTSTRAP_RULES: tuple[tuple[str, Mapping[str, Any]], ...] = (
    # system:public-info-viewer, bound to system:authenticated and system:unauthenticated
    ("system:unauthenticated", {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez",
                                "/readyz", "/version", "/version/"]}),
    ("system:authenticated", {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez",
                              "/readyz", "/version", "/version/"]}),
    # system:discovery, bound to system:authenticated
    ("system:authenticated", {"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis",
                              "/apis/*", "/openapi", "/openapi/*"]}),
)  # fmt: skip


class Rbac:
    """An RBAC authorizer over a fixed set of Roles, ClusterRoles and bindings."""

    def __init__(self, objects: Iterable[JsonObj]) -> None:
        docs = list(objects)
        roles = {
            (d["kind"], _namespace(d), d["metadata"]["name"]): tuple(
                _Rule.of(r) for r in d.get("rules") or ()
            )
            for d in docs
            if d.get("kind") in ("Role", "ClusterRole")
        }
        grants = [
            _Grant(None, (_Subject("Group", group, ""),), (_Rule.of(rule),))
            for group, rule in _BOOTSTRAP_RULES
        ]
        for d in docs:
            if d.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            ref = d["roleRef"]
            in_namespace = d["kind"] == "RoleBinding"
            namespace = _namespace(d) if in_namespace else None
            role_namespace = (namespace or "") if ref["kind"] == "Role" else ""
            key = (ref["kind"], role_namespace, ref["name"])
            subjects = tuple(
                _Subject(s["kind"], s["name"], s.get("namespace") or "")
                for s in d.get("subjects") or ()
            )
            # A binding to a role that does not exist grants nothing, as in RBAC.
            grants.append(_Grant(namespace, subjects, roles.get(key, ())))
        self._grants = tuple(grants)
        self._lock = threading.Lock()
        self._asked: list[tuple[User, Attributes, bool]] = []

    @property
    def decisions(self) -> list[tuple[User, Attributes, bool]]:
        """Every question asked so far (requests and the API server's own checks of
        synthetic subresources) with its answer: what each identity really uses."""
        with self._lock:
            return list(self._asked)

    def allows(self, user: User, attrs: Attributes) -> bool:
        allowed = self._decide(user, attrs)
        with self._lock:
            self._asked.append((user, attrs, allowed))
        return allowed

    def _decide(self, user: User, attrs: Attributes) -> bool:
        if MASTERS in user.groups:
            return True
        for grant in self._grants:
            if grant.namespace is not None and grant.namespace != attrs.namespace:
                continue
            if any(s.includes(user) for s in grant.subjects) and any(
                r.allows(attrs) for r in grant.rules
            ):
                return True
        return False

    def check(self, user: User, attrs: Attributes) -> None:
        """Raise the API server's 403 unless ``user`` may do ``attrs``."""
        if not self.allows(user, attrs):
            raise forbidden(user, attrs)


def _namespace(doc: JsonObj) -> str:
    return str((doc.get("metadata") or {}).get("namespace") or "")


def forbidden_message(user: User, attrs: Attributes) -> str:
    """``responsewriters.forbiddenMessage``: who may not do what, where."""
    if not attrs.is_resource:
        return f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    return (
        f'User "{user.name}" cannot {attrs.verb} resource "{attrs.full_resource}" '
        f'in API group "{attrs.api_group}" {where}'
    )


def forbidden(user: User, attrs: Attributes, reason: str = "") -> FakeApiError:
    """The 403 ``Forbidden`` Status kube-apiserver answers (``errors.NewForbidden``)."""
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    subject = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    message = forbidden_message(user, attrs) + (f": {reason}" if reason else "")
    err = FakeApiError(
        403, f"{subject} is forbidden: {message}" if subject else f"forbidden: {message}"
    )
    if attrs.is_resource:
        err.details = {"group": attrs.api_group, "kind": attrs.resource}
        if attrs.name:
            err.details["name"] = attrs.name
    return err


def node_of_allocation(claim: JsonObj | None) -> str:
    """The one node a claim's allocation selects by ``metadata.name In [node]``, else ""
    (``nodeNameFromAllocation`` in the API server's ResourceClaim authorization)."""
    allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1 or terms[0].get("matchExpressions"):
        return ""
    fields: Sequence[JsonObj] = terms[0].get("matchFields") or []
    if len(fields) != 1:
        return ""
    only = fields[0]
    values = only.get("values") or []
    if only.get("key") != "metadata.name" or only.get("operator") != "In" or len(values) != 1:
        return ""
    return str(values[0])


def request_attributes(method: str, path: str, query: Mapping[str, Sequence[str]]) -> Attributes:
    """The attributes of an HTTP request, parsed from its path as RequestInfo does."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return Attributes("get" if method == "GET" else method.lower(), path=path)
    if not rest:  # discovery of a group version
        return Attributes("get" if method == "GET" else method.lower(), path=path)
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) >= 2:
        # /api/v1/namespaces/NAME[/status|/finalize] is the Namespace NAME itself
        namespace = rest[1]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    watch = (query.get("watch") or [""])[-1] in ("true", "1")
    if not name and method == "GET":
        selector = (query.get("fieldSelector") or [""])[-1]
        for term in selector.split(","):
            key, _, value = term.partition("=")
            if key == "metadata.name" and value and not value.startswith("="):
                name = value
    verb = verb_of(method, named=bool(rest[1:]), watch=watch)
    return Attributes(verb, group, resource, subresource, namespace, name)
