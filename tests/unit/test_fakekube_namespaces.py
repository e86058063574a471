"""The fake API server's namespace lifecycle, over real HTTP: a deleted Namespace stays
``Terminating`` until its content and its ``kubernetes`` finalizer are gone, and the
server refuses meanwhile what a real one refuses (fact sheet 5.3.2)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from dra_driver.fakes.objects import node_object, resource_claim
from tests.support.eventually import eventually_sync
from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_auth import request_attributes
from tests.support.http import send_json as call

NAMESPACES = "/api/v1/namespaces"
MERGE = "application/merge-patch+json"


def namespace(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    if spec:
        body["spec"] = spec
    return body


def event(name: str = "", generate_name: str = "") -> dict[str, Any]:
    meta = {"name": name} if name else {"generateName": generate_name}
    return {"apiVersion": "v1", "kind": "Event", "metadata": meta, "involvedObject": {}}


def claims(ns: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"


@pytest.fixture
def stepped() -> Iterator[FakeKubeApi]:
    """A fake whose namespace controller runs only when the test calls it."""
    with FakeKubeApi(namespace_delay_s=None) as fake:
        yield fake


def terminating(fake: FakeKubeApi, name: str = "team", *content: dict[str, Any]) -> None:
    """Create namespace ``name`` (over HTTP), ``content`` in it, and delete it."""
    assert call(fake, "POST", NAMESPACES, namespace(name))[0] == 201
    for obj in content:
        fake.create({**obj, "metadata": {**obj["metadata"], "namespace": name}})
    assert call(fake, "DELETE", f"{NAMESPACES}/{name}")[0] == 200


def gone(fake: FakeKubeApi, path: str) -> bool:
    return call(fake, "GET", path)[0] == 404


# --- Create ------------------------------------------------------------------------


def test_a_new_namespace_is_active_with_the_kubernetes_finalizer(stepped: FakeKubeApi) -> None:
    body = namespace("team", finalizers=["example.com/keep"])
    body["status"] = {"phase": "Terminating"}  # what a client sends is not the status
    code, created = call(stepped, "POST", NAMESPACES, body)
    assert code == 201
    assert created["spec"]["finalizers"] == ["example.com/keep", "kubernetes"]
    assert created["status"] == {"phase": "Active"}
    assert call(stepped, "GET", f"{NAMESPACES}/team") == (200, created)


def test_an_update_of_a_namespace_keeps_its_finalizers(stepped: FakeKubeApi) -> None:
    _, created = call(stepped, "POST", NAMESPACES, namespace("team"))
    created["spec"]["finalizers"] = []
    created["metadata"]["labels"] = {"a": "b"}
    code, updated = call(stepped, "PUT", f"{NAMESPACES}/team", created)
    assert code == 200
    assert updated["metadata"]["labels"] == {"a": "b"}
    assert updated["spec"]["finalizers"] == ["kubernetes"]
    patch = {"spec": {"finalizers": None}}
    code, patched = call(stepped, "PATCH", f"{NAMESPACES}/team", patch, MERGE)
    assert (code, patched["spec"]["finalizers"]) == (200, ["kubernetes"])


# --- Delete: Terminating -------------------------------------------------------------


def test_delete_leaves_the_namespace_terminating_and_answers_it(stepped: FakeKubeApi) -> None:
    call(stepped, "POST", NAMESPACES, namespace("team"))
    code, answered = call(stepped, "DELETE", f"{NAMESPACES}/team")
    assert code == 200
    assert answered["metadata"]["deletionTimestamp"]
    assert answered["status"]["phase"] == "Terminating"
    assert answered["spec"]["finalizers"] == ["kubernetes"]
    assert call(stepped, "GET", f"{NAMESPACES}/team") == (200, answered)


def test_a_second_delete_answers_the_terminating_namespace_again(stepped: FakeKubeApi) -> None:
    call(stepped, "POST", NAMESPACES, namespace("team"))
    _, first = call(stepped, "DELETE", f"{NAMESPACES}/team")
    assert call(stepped, "DELETE", f"{NAMESPACES}/team") == (200, first)


def test_the_official_client_sees_the_terminating_namespace(stepped: FakeKubeApi) -> None:
    with client.ApiClient(client.Configuration(host=stepped.url)) as api_client:
        core = client.CoreV1Api(api_client)
        body = client.V1Namespace(metadata=client.V1ObjectMeta(name="team"))
        core.create_namespace(body)
        core.delete_namespace("team")
        status = core.read_namespace("team").status
        assert status is not None and status.phase == "Terminating"
        with pytest.raises(ApiException) as refused:
            core.create_namespace(body)
        assert refused.value.status == 409
        stepped.sync_namespaces()
        with pytest.raises(ApiException) as missing:
            core.read_namespace("team")
        assert missing.value.status == 404


@pytest.mark.parametrize("name", ["default", "kube-system", "kube-public"])
def test_the_immortal_namespaces_may_not_be_deleted(stepped: FakeKubeApi, name: str) -> None:
    call(stepped, "POST", NAMESPACES, namespace(name))
    code, status = call(stepped, "DELETE", f"{NAMESPACES}/{name}")
    assert (code, status["reason"]) == (403, "Forbidden")
    refusal = f'namespaces "{name}" is forbidden: this namespace may not be deleted'
    assert status["message"] == refusal
    assert call(stepped, "GET", f"{NAMESPACES}/{name}")[1]["status"]["phase"] == "Active"


# --- Refusals while it terminates --------------------------------------------------------


def test_a_create_of_its_name_is_refused_as_being_deleted(stepped: FakeKubeApi) -> None:
    terminating(stepped)
    code, status = call(stepped, "POST", NAMESPACES, namespace("team"))
    assert code == 409
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'object is being deleted: namespaces "team" already exists'
    assert status["details"] == {"name": "team", "group": "", "kind": "namespaces"}


@pytest.mark.parametrize(
    ("path", "body", "subject"),
    [
        (f"{NAMESPACES}/team/events", event("e1"), 'events "e1"'),
        (f"{NAMESPACES}/team/events", event(generate_name="ev-"), 'events "ev-"'),
        (claims("team"), resource_claim("team", "c1"), 'resourceclaims.resource.k8s.io "c1"'),
    ],
    ids=["event", "generated-name", "claim"],
)
def test_a_create_inside_it_is_forbidden(
    stepped: FakeKubeApi, path: str, body: dict[str, Any], subject: str
) -> None:
    terminating(stepped)
    code, status = call(stepped, "POST", path, body)
    assert code == 403
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        f"{subject} is forbidden: unable to create new content in namespace team "
        "because it is being terminated"
    )
    assert status["details"]["causes"] == [
        {
            "reason": "NamespaceTerminating",
            "message": "namespace team is being terminated",
            "field": "metadata.namespace",
        }
    ]
    assert call(stepped, "GET", path)[1]["items"] == []


def test_a_create_in_another_namespace_goes_on(stepped: FakeKubeApi) -> None:
    terminating(stepped)
    assert call(stepped, "POST", f"{NAMESPACES}/other/events", event("e1"))[0] == 201


def test_updates_patches_and_deletes_inside_it_go_on(stepped: FakeKubeApi) -> None:
    guarded = resource_claim("team", "c1")
    guarded["metadata"]["finalizers"] = ["example.com/keep"]
    terminating(stepped, "team", guarded, resource_claim("team", "c2"), event("e1"))
    stepped.sync_namespaces()  # c1 is only marked; c2 and e1 are gone
    _, c1 = call(stepped, "GET", f"{claims('team')}/c1")
    assert c1["metadata"]["deletionTimestamp"]
    c1["metadata"]["labels"] = {"a": "b"}
    assert call(stepped, "PUT", f"{claims('team')}/c1", c1)[0] == 200
    patch = {"metadata": {"annotations": {"x": "y"}}}
    assert call(stepped, "PATCH", f"{claims('team')}/c1", patch, MERGE)[0] == 200
    assert call(stepped, "DELETE", f"{claims('team')}/c1")[0] == 202  # still held
    unheld = {"metadata": {"finalizers": None}}
    assert call(stepped, "PATCH", f"{claims('team')}/c1", unheld, MERGE)[0] == 200
    assert gone(stepped, f"{claims('team')}/c1")


def test_a_create_of_any_object_being_deleted_is_refused_so(stepped: FakeKubeApi) -> None:
    guarded = node_object("n1")
    guarded["metadata"]["finalizers"] = ["example.com/keep"]
    stepped.create(guarded)
    call(stepped, "DELETE", "/api/v1/nodes/n1")
    code, status = call(stepped, "POST", "/api/v1/nodes", node_object("n1"))
    assert (code, status["reason"]) == (409, "AlreadyExists")
    assert status["message"] == 'object is being deleted: nodes "n1" already exists'


# --- The namespace controller ------------------------------------------------------------


def test_the_controller_deletes_the_content_then_the_namespace(stepped: FakeKubeApi) -> None:
    terminating(stepped, "team", resource_claim("team", "c1"), event("e1"))
    assert call(stepped, "GET", f"{claims('team')}/c1")[0] == 200
    stepped.sync_namespaces()
    assert gone(stepped, f"{claims('team')}/c1")
    assert gone(stepped, f"{NAMESPACES}/team/events/e1")
    assert gone(stepped, f"{NAMESPACES}/team")
    assert call(stepped, "POST", NAMESPACES, namespace("team"))[0] == 201  # a new one


def test_content_with_finalizers_holds_the_namespace_until_they_go(stepped: FakeKubeApi) -> None:
    guarded = resource_claim("team", "c1")
    guarded["metadata"]["finalizers"] = ["example.com/keep"]
    terminating(stepped, "team", guarded, resource_claim("team", "c2"))
    stepped.sync_namespaces()
    assert gone(stepped, f"{claims('team')}/c2")
    _, ns = call(stepped, "GET", f"{NAMESPACES}/team")
    assert ns["spec"]["finalizers"] == ["kubernetes"]
    conditions = {c["type"]: c for c in ns["status"]["conditions"]}
    assert conditions["NamespaceContentRemaining"]["status"] == "True"
    assert conditions["NamespaceContentRemaining"]["message"] == (
        "Some resources are remaining: resourceclaims.resource.k8s.io has 1 resource instances"
    )
    assert conditions["NamespaceFinalizersRemaining"]["message"] == (
        "Some finalizers are remaining: example.com/keep in 1 resource instances"
    )
    assert conditions["NamespaceDeletionDiscoveryFailure"]["status"] == "False"
    stepped.sync_namespaces()  # nothing changed: it stays
    assert call(stepped, "GET", f"{NAMESPACES}/team")[0] == 200
    unheld = {"metadata": {"finalizers": None}}
    assert call(stepped, "PATCH", f"{claims('team')}/c1", unheld, MERGE)[0] == 200
    stepped.sync_namespaces()
    assert gone(stepped, f"{NAMESPACES}/team")


def test_another_spec_finalizer_holds_it_until_finalize(stepped: FakeKubeApi) -> None:
    call(stepped, "POST", NAMESPACES, namespace("team", finalizers=["example.com/keep"]))
    call(stepped, "DELETE", f"{NAMESPACES}/team")
    stepped.sync_namespaces()
    _, ns = call(stepped, "GET", f"{NAMESPACES}/team")
    assert ns["spec"]["finalizers"] == ["example.com/keep"]  # ours is removed
    assert ns["status"]["phase"] == "Terminating"
    ns["spec"]["finalizers"] = []
    code, finalized = call(stepped, "PUT", f"{NAMESPACES}/team/finalize", ns)
    assert code == 200
    assert "finalizers" not in finalized["spec"]
    assert gone(stepped, f"{NAMESPACES}/team")


def test_finalize_serves_only_put(stepped: FakeKubeApi) -> None:
    call(stepped, "POST", NAMESPACES, namespace("team"))
    for method, body in (("GET", None), ("PATCH", {}), ("POST", {})):
        code, status = call(stepped, method, f"{NAMESPACES}/team/finalize", body, MERGE)
        assert (code, status["reason"]) == (405, "MethodNotAllowed"), method
    assert call(stepped, "GET", f"{NAMESPACES}/team/status")[0] == 200


def test_the_finalize_and_status_paths_name_the_namespace_for_rbac() -> None:
    for sub in ("finalize", "status"):
        attrs = request_attributes("PUT", f"{NAMESPACES}/team/{sub}", {})
        assert (attrs.verb, attrs.resource, attrs.subresource) == ("update", "namespaces", sub)
        assert (attrs.name, attrs.namespace) == ("team", "team")
    inside = request_attributes("POST", f"{NAMESPACES}/team/events", {})
    assert (inside.resource, inside.namespace, inside.name) == ("events", "team", "")


def test_on_its_own_the_controller_ends_it_after_a_short_delay(fake_kube: FakeKubeApi) -> None:
    guarded = resource_claim("team", "c1")
    guarded["metadata"]["finalizers"] = ["example.com/keep"]
    terminating(fake_kube, "team", guarded, event("e1"))
    # at once, as a fixture that deletes and re-creates would: refused
    assert call(fake_kube, "POST", NAMESPACES, namespace("team"))[0] == 409
    eventually_sync(lambda: gone(fake_kube, f"{NAMESPACES}/team/events/e1"), "e1 deleted")
    assert call(fake_kube, "GET", f"{NAMESPACES}/team")[0] == 200  # c1 holds it
    unheld = {"metadata": {"finalizers": None}}
    call(fake_kube, "PATCH", f"{claims('team')}/c1", unheld, MERGE)
    eventually_sync(lambda: gone(fake_kube, f"{NAMESPACES}/team"), "the namespace gone")
    assert call(fake_kube, "POST", NAMESPACES, namespace("team"))[0] == 201


def test_a_watch_sees_it_modified_then_deleted(stepped: FakeKubeApi) -> None:
    call(stepped, "POST", NAMESPACES, namespace("team"))
    start = stepped.resource_version
    call(stepped, "DELETE", f"{NAMESPACES}/team")
    stepped.sync_namespaces()
    url = f"{stepped.url}{NAMESPACES}?watch=true&resourceVersion={start}"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = [json.loads(response.readline()) for _ in range(3)]
    kinds = [(e["type"], e["object"]["status"].get("phase")) for e in lines]
    assert kinds == [
        ("MODIFIED", "Terminating"),  # deletionTimestamp
        ("MODIFIED", "Terminating"),  # the controller's conditions
        ("DELETED", "Terminating"),
    ]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in lines]
    assert versions == sorted(versions) and versions[-1] == stepped.resource_version
    assert "finalizers" not in lines[-1]["object"]["spec"]
