"""The fake API server copies once per write and shares stored objects, never aliases them.

The store keeps each stored object unchanged once stored and shares it with the watch
history and the answers (:mod:`tests.support.fakekube_store`), encoded once: these tests
pin that no caller, patch or later write can change what was stored, sent or recorded,
and that the shared encoding is the bytes the fake always sent.
"""

from __future__ import annotations

import copy
import json
import urllib.request
from typing import Any

from dra_driver.fakes.objects import resource_claim
from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_patch import json_patch, merge_patch
from tests.support.fakekube_raw import RawJson, copy_json, encode_wire, event_line, raw_paths, under
from tests.support.fakekube_types import DEFAULT_KINDS
from tests.support.http import send_json

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = "application/merge-patch+json"
KIND = next(k for k in DEFAULT_KINDS if k.kind == "ResourceClaim")


def test_copy_json_rebuilds_raw_json_like_deepcopy() -> None:
    raw = RawJson({"a": [1, {"b": 2}]}, '{ "a": [1, {"b": 2}] }')
    tree: dict[str, Any] = {"x": [raw, {"y": None}], "z": 1.5}
    copied = copy_json(tree)
    assert copied == copy.deepcopy(tree)
    assert type(copied["x"][0]) is RawJson
    assert copied["x"][0].raw == raw.raw
    copied["x"][0]["a"][1]["b"] = 3
    copied["x"][1]["y"] = 0
    assert tree == {"x": [RawJson({"a": [1, {"b": 2}]}, ""), {"y": None}], "z": 1.5}


def test_patches_never_share_a_node_with_the_patch_or_change_the_target() -> None:
    target: dict[str, Any] = {"a": {"b": 1}, "c": [1]}
    patch: dict[str, Any] = {"a": {"d": {"e": [1, 2]}}, "c": [{"f": 1}]}
    merged = merge_patch(target, patch)
    assert target == {"a": {"b": 1}, "c": [1]}
    patch["a"]["d"]["e"].append(3)
    patch["c"][0]["f"] = 2
    assert merged == {"a": {"b": 1, "d": {"e": [1, 2]}}, "c": [{"f": 1}]}
    own = {"a": {"b": 1}}
    assert merge_patch(own, {"a": {"b": None}}, in_place=True) is own
    assert own == {"a": {}}
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/a", "value": {"v": [1]}}]
    patched = json_patch({"x": 1}, ops)
    ops[0]["value"]["v"].append(2)
    assert patched == {"x": 1, "a": {"v": [1]}}


def test_what_the_test_side_api_returns_or_takes_is_never_the_stored_object() -> None:
    with FakeKubeApi() as api:
        claim = resource_claim("default", "c1", configs=({"kind": "GpuShare", "memory": "1Gi"},))
        created = api.create(claim)
        claim["spec"]["devices"]["requests"][0]["name"] = "changed-by-the-caller"
        created["spec"]["devices"]["requests"][0]["name"] = "changed-by-the-caller"
        for got in (api.get("ResourceClaim", "c1"), api.objects("ResourceClaim")[0]):
            assert got["spec"]["devices"]["requests"][0]["name"] == "gpu"
            got["spec"]["devices"]["config"][0]["opaque"]["parameters"]["memory"] = "9Gi"
        labels = {"a": ["x"]}
        patched = api.patch("ResourceClaim", "c1", {"metadata": {"annotations": labels}})
        labels["a"].append("y")
        patched["metadata"]["annotations"]["b"] = "c"
        updated = api.update_status({**api.get("ResourceClaim", "c1"), "status": {}})
        updated["metadata"]["name"] = "other"
        stored = api.get("ResourceClaim", "c1")
        assert stored["metadata"]["annotations"] == {"a": ["x"]}
        assert stored["spec"]["devices"]["config"][0]["opaque"]["parameters"]["memory"] == "1Gi"
        assert stored["metadata"]["name"] == "c1"


def _watch(api: FakeKubeApi, count: int) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{api.url}{CLAIMS}?watch=true&resourceVersion=1", timeout=5) as r:
        return [json.loads(r.readline()) for _ in range(count)]


def test_an_event_shows_its_write_after_later_writes_and_patches() -> None:
    with FakeKubeApi() as api:
        claim = resource_claim("default", "c1", allocated=False)
        code, _ = send_json(api, "POST", f"{CLAIMS}", claim)
        assert code == 201
        first = api.resource_version
        for i in range(3):
            patch = {"metadata": {"labels": {"n": str(i)}}}
            assert send_json(api, "PATCH", f"{CLAIMS}/c1", patch, content_type=MERGE)[0] == 200
        allocation = resource_claim("default", "c1")["status"]["allocation"]
        pod = {"resource": "pods", "name": "p", "uid": "u"}
        status = {"status": {"allocation": allocation, "reservedFor": [pod]}}
        assert send_json(api, "PATCH", f"{CLAIMS}/c1/status", status, content_type=MERGE)[0] == 200
        assert send_json(api, "DELETE", f"{CLAIMS}/c1")[0] == 200
        lines = _watch(api, 5)
    assert [e["type"] for e in lines] == ["MODIFIED"] * 4 + ["DELETED"]
    assert int(lines[0]["object"]["metadata"]["resourceVersion"]) == first + 1
    assert [(e["object"]["metadata"].get("labels") or {}).get("n") for e in lines] == [
        "0",
        "1",
        "2",
        "2",
        "2",
    ]
    assert "status" not in lines[0]["object"] or not lines[0]["object"]["status"]
    assert lines[3]["object"]["status"]["reservedFor"][0]["name"] == "p"


def test_an_event_line_is_what_encode_wire_writes_for_the_whole_event() -> None:
    params = RawJson({"b": "<&>", "a": 1}, '{ "b" : "<&>",\n "a": 1 }')
    claim = resource_claim("default", "c1", configs=({"x": 1},))
    claim["spec"]["devices"]["config"][0]["opaque"]["parameters"] = params
    claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] = params
    paths = raw_paths(KIND)
    for event_type in ("ADDED", "MODIFIED", "DELETED"):
        whole = encode_wire({"type": event_type, "object": claim}, under(("object",), paths))
        assert event_line(event_type, encode_wire(claim, paths)) == whole + b"\n"
    assert b'{ "b"' not in whole and b'"parameters": {"b":"\\u003c\\u0026\\u003e","a":1}' in whole


def test_a_stored_object_is_encoded_once_and_a_new_version_anew() -> None:
    with FakeKubeApi() as api:
        api.create(resource_claim("default", "c1", allocated=False))
        store = api._store
        stored = store.get(KIND, "default", "c1")
        first = store.wire(KIND, stored)
        assert store.wire(KIND, stored) is first
        assert first == encode_wire(stored, raw_paths(KIND))
        api.patch(KIND, "c1", {"metadata": {"labels": {"a": "b"}}})
        changed = store.get(KIND, "default", "c1")
        assert changed is not stored
        assert b'"labels": {"a": "b"}' in store.wire(KIND, changed)
        assert b'"labels"' not in store.wire(KIND, stored)


def test_encoding_along_the_raw_paths_is_encoding_everywhere() -> None:
    # The walk along a kind's raw paths (a trie built once) finds every RawJson that
    # the walk of the whole tree finds, for objects that hold them only there.
    text = '{ "z": [1, 2.5, "<a>"],  "a": {"b": null} }'
    params = RawJson(json.loads(text), text)
    claim = resource_claim("default", "c1", configs=({"x": 1}, {"y": 2}))
    for config in claim["spec"]["devices"]["config"]:
        config["opaque"]["parameters"] = params
    claim["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"] = params
    claim["status"]["devices"] = [{"driver": "d", "pool": "p", "device": "g", "data": params}]
    paths = raw_paths(KIND)
    assert encode_wire(claim, paths) == encode_wire(claim, None)
    listed = {"kind": "ResourceClaimList", "items": [claim, claim]}
    assert encode_wire(listed, under(("items", "*"), paths)) == encode_wire(listed, None)
    sent = encode_wire(listed, under(("items", "*"), paths))
    assert b'{ "z"' not in sent
    assert b'"data": {"z":[1,2.5,"\\u003ca\\u003e"],"a":{"b":null}}' in sent


def test_objects_without_copies_are_the_stored_ones() -> None:
    with FakeKubeApi() as api:
        api.create(resource_claim("default", "c1", allocated=False))
        shared = api.objects("ResourceClaim", copies=False)
        assert shared[0] is api._store.get(KIND, "default", "c1")
        assert api.objects("ResourceClaim")[0] is not shared[0]
        assert api.objects("ResourceClaim") == shared
