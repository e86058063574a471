"""The fake API server's authentication, RBAC and admission answer as kube-apiserver's do
(the rules and their sources: tests/support/fakekube_auth.py, fakekube_admission.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.support.chart import CONTROLLER_VALUES, chart_api, client_as, plugin_user
from tests.support.fakekube import FakeKubeApi, RecordedRequest
from tests.support.fakekube_admission import ApiSecurity
from tests.support.fakekube_auth import (
    ADMIN,
    ANONYMOUS,
    Attributes,
    Authenticator,
    Rbac,
    User,
    forbidden,
    request_attributes,
    service_account,
)
from tests.support.fakekube_types import FakeApiError
from tests.support.http import send
from tests.support.transport import transport_of

SA = service_account("ns", "robot")


def role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(
    kind: str, role_kind: str, role_name: str, subject: dict[str, str], namespace: str = ""
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"{role_name}-binding"}
    if namespace:
        meta["namespace"] = namespace
    return {
        "kind": kind,
        "metadata": meta,
        "roleRef": {"kind": role_kind, "name": role_name},
        "subjects": [subject],
    }


ROBOT = {"kind": "ServiceAccount", "name": "robot", "namespace": "ns"}


def cluster_rbac(rules: list[dict[str, Any]], subject: dict[str, str] = ROBOT) -> Rbac:
    """One ClusterRole of ``rules`` bound to ``subject`` cluster-wide."""
    return Rbac(
        [
            role("ClusterRole", "c", rules),
            binding("ClusterRoleBinding", "ClusterRole", "c", subject),
        ]
    )


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods/p", {}, Attributes("get", "", "pods", "", "ns", "p")),
        ("GET", "/api/v1/pods", {}, Attributes("list", "", "pods")),
        ("GET", "/api/v1/pods", {"watch": ["true"]}, Attributes("watch", "", "pods")),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
            {"fieldSelector": ["metadata.name=l"]},
            Attributes("list", "coordination.k8s.io", "leases", "", "ns", "l"),
        ),
        ("POST", "/api/v1/namespaces/ns/events", {}, Attributes("create", "", "events", "", "ns")),
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
            {},
            Attributes("patch", "resource.k8s.io", "resourceclaims", "status", "ns", "c"),
        ),
        (
            "PUT",
            "/apis/resource.k8s.io/v1/resourceslices/s",
            {},
            Attributes("update", "resource.k8s.io", "resourceslices", "", "", "s"),
        ),
        (
            "DELETE",
            "/apis/resource.k8s.io/v1/resourceslices",
            {},
            Attributes("deletecollection", "resource.k8s.io", "resourceslices"),
        ),
        ("GET", "/version", {}, Attributes("get", path="/version")),
    ],
)
def test_request_attributes_as_request_info_parses_them(
    method: str, path: str, query: dict[str, list[str]], expected: Attributes
) -> None:
    assert request_attributes(method, path, query) == expected


def test_every_patch_type_is_the_verb_patch_and_a_put_is_update() -> None:
    """A Role with get and update on a Lease, as the chart had it, cannot renew it by
    merge patch (observed on a real 1.36 API server, 2026-12-01)."""
    rbac = Rbac(
        [
            role("Role", "r", [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                               "resourceNames": ["l"], "verbs": ["get", "update"]}], "ns"),
            binding("RoleBinding", "Role", "r", ROBOT, "ns"),
        ]
    )  # fmt: skip
    path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
    assert rbac.allows(SA, request_attributes("PUT", path, {}))
    assert not rbac.allows(SA, request_attributes("PATCH", path, {}))
    # A rule limited by name never allows a create: the request names nothing yet.
    assert not rbac.allows(SA, request_attributes("POST", path.rsplit("/", 1)[0], {}))
    # Another namespace: the Role holds only in its own.
    assert not rbac.allows(SA, request_attributes("PUT", path.replace("/ns/", "/other/"), {}))


def test_subresources_are_their_own_resources() -> None:
    rules = [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["*"]}]
    rbac = cluster_rbac(rules)
    status = Attributes("patch", "resource.k8s.io", "resourceclaims", "status", "ns", "c")
    assert rbac.allows(SA, Attributes("patch", "resource.k8s.io", "resourceclaims", "", "ns", "c"))
    assert not rbac.allows(SA, status)
    any_status = [{"apiGroups": ["resource.k8s.io"], "resources": ["*/status"], "verbs": ["patch"]}]
    rbac = cluster_rbac(any_status)
    assert rbac.allows(SA, status)


def test_a_cluster_role_bound_in_a_namespace_holds_there_only() -> None:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    rbac = Rbac(
        [role("ClusterRole", "c", rules), binding("RoleBinding", "ClusterRole", "c", ROBOT, "ns")]
    )
    assert rbac.allows(SA, Attributes("get", "", "pods", "", "ns", "p"))
    assert not rbac.allows(SA, Attributes("get", "", "pods", "", "other", "p"))


def test_groups_the_masters_and_public_info() -> None:
    rules = [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]
    group = {"kind": "Group", "name": "system:serviceaccounts:ns"}
    rbac = cluster_rbac(rules, group)
    assert rbac.allows(SA, Attributes("list", "", "nodes"))
    assert not rbac.allows(service_account("elsewhere", "robot"), Attributes("list", "", "nodes"))
    assert rbac.allows(ADMIN, Attributes("delete", "", "secrets", "", "kube-system", "x"))
    assert rbac.allows(ANONYMOUS, Attributes("get", path="/version"))
    assert not rbac.allows(ANONYMOUS, Attributes("list", "", "nodes"))


def test_forbidden_is_the_api_servers_status() -> None:
    err = forbidden(SA, Attributes("patch", "coordination.k8s.io", "leases", "", "ns", "l"))
    assert err.code == 403 and err.reason == "Forbidden"
    assert err.message == (
        'leases.coordination.k8s.io "l" is forbidden: User "system:serviceaccount:ns:robot" '
        'cannot patch resource "leases" in API group "coordination.k8s.io" in the namespace "ns"'
    )
    assert err.details == {"group": "coordination.k8s.io", "kind": "leases", "name": "l"}
    cluster = forbidden(SA, Attributes("list", "", "nodes"))
    assert cluster.message == (
        'nodes is forbidden: User "system:serviceaccount:ns:robot" cannot list resource "nodes"'
        ' in API group "" at the cluster scope'
    )


def test_tokens_authenticate_and_unknown_ones_are_401() -> None:
    auth = Authenticator()
    token = auth.token_for(SA)
    assert auth.authenticate(f"Bearer {token}") == SA
    assert auth.authenticate(None) == ANONYMOUS
    with pytest.raises(FakeApiError) as err:
        auth.authenticate("Bearer nobody-issued-this")
    assert err.value.code == 401


def test_the_chart_installed_fake_answers_401_403_and_422_over_http() -> None:
    """Through HTTP, as a component sees it: an unknown token, a verb the chart does not
    grant, and a write that a chart policy denies."""
    with chart_api(CONTROLLER_VALUES) as api:
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
        slices = "/apis/resource.k8s.io/v1/resourceslices"
        code, body = send(api, "GET", slices, user=User("nobody"))
        assert code == 403, body
        body_401 = _raw(api, "GET", slices, "Bearer forged")
        assert body_401 == 401
        # The plugin on node-b may not write node-a's slice: the policy says who and why.
        slice_obj = (
            '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"s"},'
            '"spec":{"driver":"gpu.fractional.dev","nodeName":"node-a","pool":{"name":"node-a",'
            '"generation":1,"resourceSliceCount":1},"devices":[]}}'
        )
        code, body = send(api, "POST", slices, slice_obj.encode(), user=plugin_user("node-b"))
        assert code == 422, body
        assert body["message"].startswith(
            'resourceslices.resource.k8s.io "s" is forbidden: ValidatingAdmissionPolicy '
            "'fractional-gpu-dra-resourceslices-own-node' with binding "
        )
        assert (
            "the kubelet plugin on node node-b may not modify ResourceSlices of node node-a"
            in (body["message"])
        )
        code, body = send(api, "POST", slices, slice_obj.encode(), user=plugin_user("node-a"))
        assert code == 201, body
        # The driver's transport, as the plugin's identity, lists what it wrote.
        client = transport_of(client_as(api, plugin_user("node-a")))
        listed = asyncio.run(client.send_json("GET", slices))
        assert [i["metadata"]["name"] for i in listed["items"]] == ["s"]


def _raw(api: FakeKubeApi, method: str, path: str, authorization: str) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(api.url + path, method=method)
    request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        with err:
            return int(err.code)


def test_claim_status_writes_on_136_need_the_binding_and_driver_subresources() -> None:
    """AuthorizedForBinding and AuthorizedForDeviceStatus (pkg/registry/resource, 1.36)."""
    docs = [
        role("ClusterRole", "status-only", [{"apiGroups": ["resource.k8s.io"],
             "resources": ["resourceclaims/status"], "verbs": ["patch"]}]),
        binding("ClusterRoleBinding", "ClusterRole", "status-only", ROBOT),
    ]  # fmt: skip
    security = ApiSecurity(docs, kube_minor=36)
    with FakeKubeApi(security=security) as api:
        api.create(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"devices": {"requests": []}},
            }
        )
        path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
        allocation = (
            '{"status":{"allocation":{"devices":{"results":[{"request":"gpu","driver":"d",'
            '"pool":"p","device":"gpu-0"}]},"nodeSelector":{"nodeSelectorTerms":[{"matchFields":'
            '[{"key":"metadata.name","operator":"In","values":["node-a"]}]}]}}}}'
        )
        merge = "application/merge-patch+json"
        code, body = send(api, "PATCH", path, allocation.encode(), merge, user=SA)
        assert code == 422, body
        assert 'requires resource="resourceclaims/binding", verb="patch"' in body["message"]
        # Without the binding subresource there is nothing more to try: that is the answer.
        recorded: list[RecordedRequest] = api.request_log
        assert [r.method for r in recorded] == ["PATCH"]
