"""The fake API server keeps opaque parameters as bytes and refuses what a real one refuses.

Each case is what was seen on a real 1.36.2 API server (fact sheet 5.3, issue 16).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from dra_driver.fakes.objects import resource_claim
from tests.support.fakekube import FakeKubeApi
from tests.support.fakekube_raw import (
    RawJson,
    decode_body,
    encode_wire,
    go_canonical,
    go_compact,
    raw_paths,
    under,
)
from tests.support.fakekube_types import DEFAULT_KINDS
from tests.support.http import send

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"
PARAMS = {"kind": "GpuShare", "apiVersion": "gpu.fractional.dev/v1alpha1", "memory": "10Gi"}
"""Keys not in sorted order, as a writer's own struct or dict may hold them."""
CLAIM_KIND = next(k for k in DEFAULT_KINDS if k.kind == "ResourceClaim")


def raw_get(fake: FakeKubeApi, path: str) -> bytes:
    with urllib.request.urlopen(fake.url + path, timeout=5) as response:
        data: bytes = response.read()
        return data


def compact(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def spaced(obj: Any) -> bytes:
    return json.dumps(obj).encode()  # Python's default ", " and ": "


def kubectl_claim(fake: FakeKubeApi, name: str, **kw: Any) -> dict[str, Any]:
    """A claim with a GpuShare config, created the way kubectl sends it (compact, sorted)."""
    claim = resource_claim("default", name, allocated=False, configs=[PARAMS], **kw)
    claim["metadata"].pop("uid")
    claim.pop("status")
    code, created = send(
        fake, "POST", CLAIMS, json.dumps(claim, sort_keys=True, separators=(",", ":")).encode()
    )
    assert code == 201, created
    return dict(created)


def test_a_get_then_spaced_put_of_an_unchanged_claim_is_refused(fake_kube: FakeKubeApi) -> None:
    claim = kubectl_claim(fake_kube, "c1")
    claim["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    code, status = send(fake_kube, "PUT", f"{CLAIMS}/c1", spaced(claim))
    assert code == 422
    assert status["reason"] == "Invalid"
    assert (
        'ResourceClaim.resource.k8s.io "c1" is invalid: spec: Invalid value:' in status["message"]
    )
    assert status["message"].endswith("field is immutable")
    # The same PUT serialised compactly (the keys in the order the GET gave them) succeeds.
    code, updated = send(fake_kube, "PUT", f"{CLAIMS}/c1", compact(claim))
    assert code == 200, updated
    assert updated["metadata"]["finalizers"] == ["resource.kubernetes.io/delete-protection"]


def test_answers_compact_the_stored_bytes_and_keep_their_order(fake_kube: FakeKubeApi) -> None:
    claim = resource_claim("default", "c1", allocated=False)
    claim["metadata"].pop("uid")
    claim.pop("status")
    claim["spec"]["devices"]["config"] = [
        {"requests": ["gpu"], "opaque": {"driver": "gpu.fractional.dev", "parameters": "@@"}}
    ]
    data = json.dumps(claim).replace('"@@"', '{ "z": "<b>",\n  "a": 1.0 }').encode()
    code, created = send(fake_kube, "POST", CLAIMS, data)
    assert code == 201, created
    text = raw_get(fake_kube, f"{CLAIMS}/c1").decode()
    assert '"parameters": {"z":"\\u003cb\\u003e","a":1.0}' in text


def test_spaced_parameters_stored_by_a_put_break_every_later_patch(
    fake_kube: FakeKubeApi,
) -> None:
    """The controller's old status PUT (spaced JSON): nobody could write the claim after it."""
    claim = kubectl_claim(fake_kube, "c1")
    allocated = resource_claim("default", "c1", configs=[PARAMS])
    claim["status"] = {"allocation": allocated["status"]["allocation"]}
    claim["status"]["allocation"]["allocationTimestamp"] = "2026-12-01T00:00:00Z"
    code, written = send(fake_kube, "PUT", f"{CLAIMS}/c1/status", spaced(claim))
    assert code == 200, written  # the first allocation is accepted as sent
    label = {"metadata": {"labels": {"team": "a"}}}
    code, status = send(fake_kube, "PATCH", f"{CLAIMS}/c1", compact(label), MERGE)
    assert code == 422
    assert "status.allocation: Invalid value:" in status["message"]
    assert status["message"].endswith("field is immutable")


def test_apply_on_status_refuses_an_allocation_in_non_canonical_form(
    fake_kube: FakeKubeApi,
) -> None:
    """Compact but in the writer's key order: apply re-encodes it (sorted) and sees a change."""
    for name, sort in (("unsorted", False), ("sorted", True)):
        claim = kubectl_claim(fake_kube, name)
        allocation = resource_claim("default", name, configs=[PARAMS])["status"]["allocation"]
        allocation["allocationTimestamp"] = "2026-12-01T00:00:00Z"
        body = {"metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]}}
        body["status"] = {"allocation": allocation}
        data = json.dumps(body, separators=(",", ":"), sort_keys=sort).encode()
        code, written = send(fake_kube, "PATCH", f"{CLAIMS}/{name}/status", data, MERGE)
        assert code == 200, written
        result = allocation["devices"]["results"][0]
        apply = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "status": {
                "devices": [
                    {k: result[k] for k in ("driver", "pool", "device")}
                    | {"conditions": [], "data": {"mode": "whole"}}
                ]
            },
        }
        path = f"{CLAIMS}/{name}/status?fieldManager=gpu.fractional.dev%2Fnode-a&force=true"
        code, answer = send(fake_kube, "PATCH", path, compact(apply), APPLY)
        if sort:
            assert code == 200, answer
            assert answer["status"]["devices"][0]["data"] == {"mode": "whole"}
        else:
            assert code == 422
            assert "status.allocation: Invalid value:" in answer["message"]


def test_an_allocation_may_be_cleared_but_not_changed(fake_kube: FakeKubeApi) -> None:
    fake_kube.create(resource_claim("default", "c1"))
    claim = fake_kube.get("ResourceClaim", "c1", "default")
    changed = json.loads(json.dumps(claim))
    changed["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-1"
    code, status = send(fake_kube, "PUT", f"{CLAIMS}/c1/status", compact(changed))
    assert (code, status["reason"]) == (422, "Invalid")
    cleared = {"status": {"allocation": None, "reservedFor": None}}  # none without the other
    code, answer = send(fake_kube, "PATCH", f"{CLAIMS}/c1/status", compact(cleared), MERGE)
    assert code == 200, answer
    assert "allocation" not in answer["status"]


def test_writes_are_checked_against_the_official_schema(fake_kube: FakeKubeApi) -> None:
    claim = resource_claim("default", "c1", allocated=False)
    claim["metadata"].pop("uid")
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = "two"
    code, status = send(fake_kube, "POST", CLAIMS, compact(claim))
    assert code == 422
    assert "spec.devices.requests.0.exactly.count" in status["message"]
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    claim["spec"]["devices"]["requests"][0]["exactly"]["cuont"] = 2
    code, status = send(fake_kube, "POST", CLAIMS, compact(claim))
    assert code == 422
    assert "cuont" in status["message"]


@pytest.mark.parametrize(
    ("raw", "compacted"),
    [
        ('{ "b" : [1, 2],\n "a": "x y" }', '{"b":[1,2],"a":"x y"}'),
        ('{"s": "a\\"<&> b"}', '{"s":"a\\"\\u003c\\u0026\\u003e b"}'),
    ],
)
def test_go_compact(raw: str, compacted: str) -> None:
    assert go_compact(raw) == compacted


def test_go_canonical_sorts_keys_and_writes_integral_floats_as_integers() -> None:
    assert go_canonical({"b": 2.0, "a": ["é", "<"]}) == '{"a":["é","\\u003c"],"b":2}'


def test_decode_body_keeps_the_exact_text_of_opaque_parameters() -> None:
    text = '{"spec": {"devices": {"config": [{"opaque": {"parameters": { "k" : 1 }}}]}}}'
    body = decode_body(text, raw_paths(CLAIM_KIND))
    params = body["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert isinstance(params, RawJson)
    assert params == {"k": 1}
    assert params.raw == '{ "k" : 1 }'


def test_encoding_along_the_kinds_raw_paths_writes_what_the_whole_walk_writes() -> None:
    spaced = '{ "kind" : "GpuShare", "memory" : "10Gi" }'
    text = json.dumps(
        {
            "metadata": {"name": "c1"},
            "spec": {"devices": {"config": [{"opaque": {"parameters": json.loads(spaced)}}]}},
            "status": {
                "allocation": {"devices": {"config": [{"opaque": {"parameters": {"a": 1}}}]}}
            },
        }
    ).replace(json.dumps(json.loads(spaced)), spaced)
    claim = decode_body(text, raw_paths(CLAIM_KIND))
    paths = raw_paths(CLAIM_KIND)
    for body, at in (
        (claim, paths),
        ({"type": "MODIFIED", "object": claim}, under(("object",), paths)),
        ({"kind": "ResourceClaimList", "items": [claim, claim]}, under(("items", "*"), paths)),
    ):
        along = encode_wire(body, at)
        assert along == encode_wire(body)
        assert b'{"kind":"GpuShare","memory":"10Gi"}' in along
    assert encode_wire({"code": 404}, frozenset()) == b'{"code": 404}'
