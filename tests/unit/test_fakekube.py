"""The fake Kubernetes API server, over real HTTP: urllib and the official client."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from dra_driver.fakes.objects import node_object, resource_claim
from tests.support.fakekube import DEFAULT_KINDS, FakeApiError, FakeKubeApi, ResourceKind
from tests.support.fakekube_patch import json_patch, merge_patch
from tests.support.fakekube_selectors import parse_label_selector
from tests.support.http import send_json

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
ALL_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
NODES = "/api/v1/nodes"
MERGE = "application/merge-patch+json"
PODS = ResourceKind("", "v1", "pods", "Pod", namespaced=True)


call = send_json
"""One request; returns (status, parsed JSON body) for successes and errors alike."""


def watch_lines(fake: FakeKubeApi, path: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of a watch; the stream is closed afterwards."""
    with urllib.request.urlopen(fake.url + path, timeout=5) as response:
        return [json.loads(response.readline()) for _ in range(count)]


def events(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"]["name"]) for e in lines]


@pytest.fixture
def api(fake_kube: FakeKubeApi) -> Iterator[client.ApiClient]:
    """The official client's generated API, whole: these tests check the fake against it."""
    with client.ApiClient(client.Configuration(host=fake_kube.url)) as api_client:
        yield api_client


# --- CRUD and Status bodies ---------------------------------------------------------


def test_create_sets_server_fields_and_get_returns_it(fake_kube: FakeKubeApi) -> None:
    claim = resource_claim("default", "c1", uid="client-side-uid")
    code, created = call(fake_kube, "POST", CLAIMS, claim)
    assert code == 201
    meta = created["metadata"]
    assert meta["uid"] != "client-side-uid"  # the API server assigns UIDs
    assert meta["resourceVersion"] == str(fake_kube.resource_version)
    assert meta["generation"] == 1
    assert meta["creationTimestamp"].endswith("Z")
    assert created["status"] == claim["status"]
    assert call(fake_kube, "GET", f"{CLAIMS}/c1") == (200, created)


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        (
            "GET",
            f"{CLAIMS}/missing",
            None,
            {
                "code": 404,
                "reason": "NotFound",
                "message": 'resourceclaims.resource.k8s.io "missing" not found',
                "details": {
                    "name": "missing",
                    "group": "resource.k8s.io",
                    "kind": "resourceclaims",
                },
            },
        ),
        (
            "POST",
            CLAIMS,
            resource_claim("default", "c1"),
            {
                "code": 409,
                "reason": "AlreadyExists",
                "message": 'resourceclaims.resource.k8s.io "c1" already exists',
                "details": {"name": "c1", "group": "resource.k8s.io", "kind": "resourceclaims"},
            },
        ),
        (
            "GET",
            "/apis/resource.k8s.io/v1beta1/namespaces/default/resourceclaims/c1",
            None,
            {"code": 404, "reason": "NotFound"},
        ),
        ("GET", "/api/v1/namespaces/default/nodes/n1", None, {"code": 404}),
        ("DELETE", CLAIMS, None, {"code": 405, "reason": "MethodNotAllowed"}),
        ("POST", f"{CLAIMS}/c1", {}, {"code": 405, "reason": "MethodNotAllowed"}),
        (
            "POST",
            "/apis/resource.k8s.io/v1/namespaces/other/resourceclaims",
            resource_claim("default", "c2"),
            {"code": 400, "reason": "BadRequest"},
        ),
        ("GET", f"{ALL_CLAIMS}?labelSelector=a%20in%20x", None, {"code": 400}),
        ("PATCH", f"{CLAIMS}/c1", {}, {"code": 415, "reason": "UnsupportedMediaType"}),
    ],
    ids=[
        "get-missing",
        "create-twice",
        "unserved-version",
        "cluster-kind-in-namespace",
        "deletecollection",
        "post-to-item",
        "namespace-mismatch",
        "bad-selector",
        "patch-without-patch-type",
    ],
)
def test_errors_are_status_objects(
    fake_kube: FakeKubeApi, method: str, path: str, body: Any, expected: dict[str, Any]
) -> None:
    fake_kube.create(resource_claim("default", "c1"))
    code, status = call(fake_kube, method, path, body)
    assert code == expected["code"]
    assert status["kind"] == "Status"
    assert status["apiVersion"] == "v1"
    assert status["status"] == "Failure"
    assert {k: status.get(k) for k in expected} == expected
    if code == 404 and "details" not in expected:
        assert "details" not in status  # "no such API" carries no object name


def test_list_shape_and_cluster_wide_list(fake_kube: FakeKubeApi) -> None:
    for namespace, name in [("b", "c2"), ("a", "c3"), ("a", "c1")]:
        fake_kube.create(resource_claim(namespace, name))
    code, listed = call(fake_kube, "GET", ALL_CLAIMS)
    assert code == 200
    assert listed["kind"] == "ResourceClaimList"
    assert listed["apiVersion"] == "resource.k8s.io/v1"
    assert listed["metadata"] == {"resourceVersion": str(fake_kube.resource_version)}
    names = [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in listed["items"]]
    assert names == [("a", "c1"), ("a", "c3"), ("b", "c2")]
    assert all("kind" not in i and "apiVersion" not in i for i in listed["items"])
    _, in_a = call(fake_kube, "GET", "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims")
    assert [i["metadata"]["name"] for i in in_a["items"]] == ["c1", "c3"]


def test_update_conflicts_on_stale_resource_version(fake_kube: FakeKubeApi) -> None:
    created = fake_kube.create(node_object("n1"))
    changed = json.loads(json.dumps(created))
    changed["spec"] = {"unschedulable": True}
    code, updated = call(fake_kube, "PUT", f"{NODES}/n1", changed)
    assert code == 200
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert updated["metadata"]["generation"] == 2
    code, status = call(fake_kube, "PUT", f"{NODES}/n1", changed)  # the old resourceVersion
    assert (code, status["reason"]) == (409, "Conflict")
    assert "the object has been modified" in status["message"]


def test_noop_update_keeps_resource_version(fake_kube: FakeKubeApi) -> None:
    created = fake_kube.create(node_object("n1"))
    code, same = call(fake_kube, "PUT", f"{NODES}/n1", created)
    assert code == 200
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_main_resource_writes_keep_status_and_status_writes_keep_the_rest(
    fake_kube: FakeKubeApi,
) -> None:
    created = fake_kube.create(resource_claim("default", "c1"))
    no_status = {k: v for k, v in created.items() if k != "status"}
    _, updated = call(fake_kube, "PUT", f"{CLAIMS}/c1", {**no_status, "metadata": {"name": "c1"}})
    assert updated["status"] == created["status"]

    only_status = {**created, "spec": {}, "status": {"allocation": None}}
    _, updated = call(fake_kube, "PUT", f"{CLAIMS}/c1/status", only_status)
    assert updated["spec"] == created["spec"]
    assert updated["status"] == {"allocation": None}
    assert updated["metadata"]["generation"] == 1  # status writes never bump generation

    pod = {"resource": "pods", "name": "p", "uid": "u-1"}
    allocation = created["status"]["allocation"]
    patch = {"status": {"allocation": allocation, "reservedFor": [pod]}}
    code, patched = call(fake_kube, "PATCH", f"{CLAIMS}/c1/status", patch, MERGE)
    assert code == 200
    assert patched["status"] == {"allocation": allocation, "reservedFor": [pod]}


@pytest.mark.parametrize(
    "content_type",
    [MERGE, "application/strategic-merge-patch+json"],
    ids=["merge", "strategic-as-merge"],
)
def test_merge_patch(fake_kube: FakeKubeApi, content_type: str) -> None:
    fake_kube.create(node_object("n1", labels={"keep": "1", "drop": "1"}))
    patch = {"metadata": {"labels": {"drop": None, "new": "2"}}, "status": {"x": 1}}
    code, patched = call(fake_kube, "PATCH", f"{NODES}/n1", patch, content_type)
    assert code == 200
    assert patched["metadata"]["labels"] == {"keep": "1", "new": "2"}
    assert "status" not in patched  # status changes go through /status only


def test_patch_with_stale_resource_version_conflicts(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    patch = {"metadata": {"resourceVersion": "999", "labels": {"a": "b"}}}
    code, status = call(fake_kube, "PATCH", f"{NODES}/n1", patch, MERGE)
    assert (code, status["reason"]) == (409, "Conflict")


def test_json_patch_over_http(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1", labels={"a": "1"}))
    ops = [
        {"op": "test", "path": "/metadata/labels/a", "value": "1"},
        {"op": "add", "path": "/metadata/labels/b~1c", "value": "2"},
        {"op": "remove", "path": "/metadata/labels/a"},
    ]
    code, patched = call(fake_kube, "PATCH", f"{NODES}/n1", ops, "application/json-patch+json")
    assert code == 200
    assert patched["metadata"]["labels"] == {"b/c": "2"}
    failing = [{"op": "test", "path": "/metadata/labels/b~1c", "value": "x"}]
    code, status = call(fake_kube, "PATCH", f"{NODES}/n1", failing, "application/json-patch+json")
    assert (code, status["reason"]) == (422, "Invalid")


def test_delete_returns_object_and_honours_finalizers(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("plain"))
    code, deleted = call(fake_kube, "DELETE", f"{NODES}/plain")
    assert code == 200
    assert deleted["metadata"]["name"] == "plain"
    assert call(fake_kube, "GET", f"{NODES}/plain")[0] == 404

    guarded = node_object("guarded")
    guarded["metadata"]["finalizers"] = ["example.com/protect"]
    fake_kube.create(guarded)
    code, marked = call(fake_kube, "DELETE", f"{NODES}/guarded")
    assert code == 202
    assert marked["metadata"]["deletionTimestamp"]
    assert fake_kube.get("Node", "guarded")["metadata"]["deletionTimestamp"]
    fake_kube.patch("Node", "guarded", {"metadata": {"finalizers": None}})
    with pytest.raises(FakeApiError) as err:
        fake_kube.get("Node", "guarded")
    assert err.value.code == 404


def test_delete_precondition_on_uid(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    options = {"preconditions": {"uid": "someone-else"}}
    code, status = call(fake_kube, "DELETE", f"{NODES}/n1", options)
    assert (code, status["reason"]) == (409, "Conflict")
    assert "Precondition failed" in status["message"]


# --- Selectors -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ["n1", "n2", "n3", "n4"]),
        ("gpu=true", ["n1", "n2"]),
        ("gpu==true", ["n1", "n2"]),
        ("gpu!=true", ["n3", "n4"]),
        ("zone", ["n1", "n3"]),
        ("!zone", ["n2", "n4"]),
        ("zone in (a,b)", ["n1", "n3"]),
        ("zone in (b)", ["n3"]),
        ("zone notin (a)", ["n2", "n3", "n4"]),
        ("gpu=true,zone in (a, c)", ["n1"]),
    ],
    ids=lambda v: repr(v) if isinstance(v, str) else None,
)
def test_label_selector(fake_kube: FakeKubeApi, selector: str, expected: list[str]) -> None:
    labels = {
        "n1": {"gpu": "true", "zone": "a"},
        "n2": {"gpu": "true"},
        "n3": {"gpu": "false", "zone": "b"},
        "n4": {},
    }
    for name, node_labels in labels.items():
        fake_kube.create(node_object(name, labels=node_labels))
    query = urllib.parse.urlencode({"labelSelector": selector})
    _, listed = call(fake_kube, "GET", f"{NODES}?{query}")
    assert [i["metadata"]["name"] for i in listed["items"]] == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("metadata.name=p1", ["a/p1"]),
        ("metadata.namespace==b", ["b/p3"]),
        ("spec.nodeName=n1", ["a/p1", "b/p3"]),
        ("spec.nodeName!=n1", ["a/p2"]),
        ("spec.nodeName=n1,metadata.namespace=a", ["a/p1"]),
        ("status.phase=Running", ["a/p2"]),
        ("spec.nodeName=", []),
    ],
    ids=lambda v: repr(v) if isinstance(v, str) else None,
)
def test_field_selector_on_a_kind_added_by_one_registry_line(
    selector: str, expected: list[str]
) -> None:
    # pods are served by default now; the registry line is still what serves them
    with FakeKubeApi((*(k for k in DEFAULT_KINDS if k.plural != "pods"), PODS)) as fake:
        for namespace, name, node, phase in [
            ("a", "p1", "n1", "Pending"),
            ("a", "p2", "n2", "Running"),
            ("b", "p3", "n1", "Pending"),
        ]:
            fake.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"nodeName": node},
                    "status": {"phase": phase},
                }
            )
        query = urllib.parse.urlencode({"fieldSelector": selector})
        code, listed = call(fake, "GET", f"/api/v1/pods?{query}")
    assert code == 200
    names = [f"{i['metadata']['namespace']}/{i['metadata']['name']}" for i in listed["items"]]
    assert names == expected


@pytest.mark.parametrize("selector", ["a in x", "=b", "a b", "!", "a=b c"])
def test_malformed_label_selector_is_bad_request(selector: str) -> None:
    with pytest.raises(FakeApiError) as err:
        parse_label_selector(selector)
    assert err.value.code == 400


# --- Patches (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        (
            {"a": 1, "b": {"c": 2, "d": 3}},
            {"b": {"c": None, "e": 4}},
            {"a": 1, "b": {"d": 3, "e": 4}},
        ),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": 1}, {"a": {"b": 2}}, {"a": {"b": 2}}),
        ({"a": {"b": 1}}, {"a": None}, {}),
    ],
    ids=["nested-delete-add", "lists-replace", "scalar-to-object", "delete-subtree"],
)
def test_merge_patch_rfc7386(target: Any, patch: Any, expected: Any) -> None:
    assert merge_patch(target, patch) == expected


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ([{"op": "add", "path": "/l/-", "value": 9}], {"l": [1, 2, 9], "m": {"k": "v"}}),
        ([{"op": "add", "path": "/l/0", "value": 0}], {"l": [0, 1, 2], "m": {"k": "v"}}),
        ([{"op": "replace", "path": "/l/1", "value": 5}], {"l": [1, 5], "m": {"k": "v"}}),
        ([{"op": "move", "from": "/m/k", "path": "/n"}], {"l": [1, 2], "m": {}, "n": "v"}),
        (
            [{"op": "copy", "from": "/m", "path": "/c"}],
            {"l": [1, 2], "m": {"k": "v"}, "c": {"k": "v"}},
        ),
    ],
    ids=["append", "insert", "replace", "move", "copy"],
)
def test_json_patch_rfc6902(ops: list[dict[str, Any]], expected: Any) -> None:
    assert json_patch({"l": [1, 2], "m": {"k": "v"}}, ops) == expected


# --- Watch over urllib --------------------------------------------------------------


def test_watch_sends_initial_objects_then_changes(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    with urllib.request.urlopen(f"{fake_kube.url}{NODES}?watch=true", timeout=5) as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        first = json.loads(response.readline())
        fake_kube.create(node_object("n2"))
        fake_kube.patch("Node", "n1", {"metadata": {"labels": {"x": "y"}}})
        fake_kube.delete("Node", "n2")
        rest = [json.loads(response.readline()) for _ in range(3)]
    assert events([first, *rest]) == [
        ("ADDED", "n1"),
        ("ADDED", "n2"),
        ("MODIFIED", "n1"),
        ("DELETED", "n2"),
    ]
    assert first["object"]["kind"] == "Node"  # watch objects carry kind/apiVersion
    assert rest[2]["object"]["metadata"]["resourceVersion"] == str(fake_kube.resource_version)


def test_watch_resumes_after_resource_version(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    start = fake_kube.resource_version
    fake_kube.create(node_object("n2"))
    fake_kube.create(resource_claim("default", "c1"))  # another kind: not replayed
    fake_kube.delete("Node", "n1")
    lines = watch_lines(fake_kube, f"{NODES}?watch=1&resourceVersion={start}", 2)
    assert events(lines) == [("ADDED", "n2"), ("DELETED", "n1")]


def test_watch_from_compacted_version_is_expired(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    fake_kube.create(node_object("n2"))
    fake_kube.compact()
    (line,) = watch_lines(fake_kube, f"{NODES}?watch=true&resourceVersion=1", 1)
    assert line["type"] == "ERROR"
    status = line["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"] == "too old resource version: 1 (2)"


def test_history_limit_expires_old_versions() -> None:
    with FakeKubeApi(history_limit=1) as fake:
        for name in ("n1", "n2", "n3"):
            fake.create(node_object(name))
        (initial,) = watch_lines(fake, f"{NODES}?watch=true&resourceVersion=0", 1)
        assert initial["type"] == "ADDED"  # 0 means "from now, with initial objects"
        (line,) = watch_lines(fake, f"{NODES}?watch=true&resourceVersion=1", 1)
        assert line["object"]["code"] == 410
        assert events(watch_lines(fake, f"{NODES}?watch=true&resourceVersion=2", 1)) == [
            ("ADDED", "n3")
        ]


def test_watch_with_selector_sees_objects_enter_and_leave(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    path = (
        f"{NODES}?watch=true&labelSelector=gpu%3Dtrue&resourceVersion={fake_kube.resource_version}"
    )
    with urllib.request.urlopen(fake_kube.url + path, timeout=5) as response:
        fake_kube.patch("Node", "n1", {"metadata": {"labels": {"gpu": "true"}}})
        fake_kube.patch("Node", "n1", {"metadata": {"labels": {"zone": "a"}}})
        fake_kube.patch("Node", "n1", {"metadata": {"labels": {"gpu": None}}})
        lines = [json.loads(response.readline()) for _ in range(3)]
    assert events(lines) == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]


def test_watch_timeout_ends_the_stream(fake_kube: FakeKubeApi) -> None:
    started = time.monotonic()
    url = f"{fake_kube.url}{ALL_CLAIMS}?watch=true&timeoutSeconds=1"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.read() == b""
    assert 0.9 < time.monotonic() - started < 3


def test_close_ends_open_watches_promptly() -> None:
    fake = FakeKubeApi().start()
    opened = threading.Event()
    ended = threading.Event()

    def watch_forever() -> None:
        with urllib.request.urlopen(f"{fake.url}{NODES}?watch=true", timeout=10) as response:
            opened.set()  # headers received: the stream is open on the server
            response.read()
        ended.set()

    watcher = threading.Thread(target=watch_forever)
    watcher.start()
    # Closing before the handler has opened the stream is a different case
    # (the client gets a reset, as from a real server going away).
    assert opened.wait(5)
    started = time.monotonic()
    fake.close()
    assert ended.wait(2)
    watcher.join(2)
    assert time.monotonic() - started < 1


# --- Faults and the request log ----------------------------------------------------


def test_fail_next_injects_status_then_recovers(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(node_object("n1"))
    fake_kube.fail_next("GET", "/nodes/n1", 500, times=2)
    assert call(fake_kube, "GET", f"{NODES}/n1")[0] == 500
    code, status = call(fake_kube, "GET", f"{NODES}/n1")
    assert (code, status["reason"], status["message"]) == (500, "InternalError", "injected failure")
    assert call(fake_kube, "GET", NODES)[0] == 200  # other paths unaffected
    assert call(fake_kube, "GET", f"{NODES}/n1")[0] == 200
    assert fake_kube.requests == [("GET", f"{NODES}/n1")] * 2 + [
        ("GET", NODES),
        ("GET", f"{NODES}/n1"),
    ]


def test_fail_next_any_method_and_retry_after(fake_kube: FakeKubeApi) -> None:
    fake_kube.fail_next("*", "nodes", 429, retry_after=3)
    request = urllib.request.Request(f"{fake_kube.url}{NODES}", method="GET")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=5)
    with err.value:
        assert err.value.code == 429
        assert err.value.headers["Retry-After"] == "3"


def test_drop_next_closes_the_connection(fake_kube: FakeKubeApi) -> None:
    fake_kube.drop_next("GET", "/api/v1/nodes")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"{fake_kube.url}{NODES}", timeout=5)
    assert call(fake_kube, "GET", NODES)[0] == 200


def test_concurrent_writes_get_distinct_resource_versions(fake_kube: FakeKubeApi) -> None:
    def create(i: int) -> None:
        call(fake_kube, "POST", NODES, node_object(f"n{i}"))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    versions = [o["metadata"]["resourceVersion"] for o in fake_kube.objects("Node")]
    assert sorted(map(int, versions)) == list(range(1, 9))


# --- The official client -----------------------------------------------------------
# Its generated models make every field Optional; these tests check the wire, so
# they use the APIs untyped instead of asserting non-None at each step.


def claim_watch() -> Any:
    # kubernetes 37 derives the item type of resource.k8s.io/v1 lists wrongly
    # (V1ResourceClaim), so name it explicitly.
    return watch.Watch(return_type="ResourceV1ResourceClaim")  # type: ignore[no-untyped-call]


def test_official_client_core_v1_nodes(fake_kube: FakeKubeApi, api: client.ApiClient) -> None:
    core: Any = client.CoreV1Api(api)
    core.create_node(node_object("n1", labels={"gpu": "true"}))
    core.create_node(node_object("n2"))
    assert [n.metadata.name for n in core.list_node(label_selector="gpu=true").items] == ["n1"]
    patched = core.patch_node("n1", {"metadata": {"labels": {"zone": "a"}}})
    assert patched.metadata.labels == {"gpu": "true", "zone": "a"}
    with pytest.raises(client.ApiException) as err:
        core.read_node("missing")
    assert err.value.status == 404
    assert json.loads(str(err.value.body))["reason"] == "NotFound"


def test_official_client_resource_claims(fake_kube: FakeKubeApi, api: client.ApiClient) -> None:
    resource: Any = client.ResourceV1Api(api)
    created = resource.create_namespaced_resource_claim("default", resource_claim("default", "c1"))
    assert created.status.allocation.devices.results[0].device == "gpu-0"
    listed = resource.list_resource_claim_for_all_namespaces(field_selector="metadata.name=c1")
    assert [c.metadata.name for c in listed.items] == ["c1"]
    # The reservation goes with the allocation: none may stay without one.
    cleared = [{"op": "remove", "path": f"/status/{f}"} for f in ("reservedFor", "allocation")]
    status = resource.patch_namespaced_resource_claim_status("c1", "default", cleared)
    assert status.status.allocation is None
    with pytest.raises(client.ApiException) as err:
        resource.create_namespaced_resource_claim("default", resource_claim("default", "c1"))
    assert err.value.status == 409


def test_official_watch_resumes_and_expires(fake_kube: FakeKubeApi, api: client.ApiClient) -> None:
    resource: Any = client.ResourceV1Api(api)
    fake_kube.create(resource_claim("default", "c1"))
    start = str(fake_kube.resource_version)
    fake_kube.create(resource_claim("default", "c2"))
    fake_kube.patch("ResourceClaim", "c1", {"metadata": {"labels": {"a": "b"}}})
    fake_kube.create(resource_claim("other", "c3"))

    watcher = claim_watch()
    seen: list[tuple[str, str]] = []
    for event in watcher.stream(
        resource.list_namespaced_resource_claim, "default", resource_version=start
    ):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            watcher.stop()
    assert seen == [("ADDED", "c2"), ("MODIFIED", "c1")]
    assert watcher.resource_version == str(fake_kube.resource_version - 1)

    fake_kube.compact()
    # The client retries a 410 once from the same version, then raises.
    stream = claim_watch().stream(
        resource.list_resource_claim_for_all_namespaces, resource_version=start
    )
    with pytest.raises(client.ApiException) as err:
        next(stream)
    assert err.value.status == 410
    assert "too old resource version" in str(err.value.reason)
