"""The fake API server's server-side apply of ResourceClaim status.devices, over real HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.fakes.objects import Allocated, resource_claim
from tests.support.fakekube import FakeKubeApi
from tests.support.http import send_json

APPLY = "application/apply-patch+yaml"
CLAIM = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"
A = "gpu.fractional.dev"
B = "net.example.com"


def call(
    fake: FakeKubeApi, path: str, body: Any, *, content_type: str = APPLY, query: str = ""
) -> tuple[int, Any]:
    return send_json(fake, "PATCH", path + query, body, content_type)


def entry(driver: str, device: str, share: str | None = None, note: str = "") -> dict[str, Any]:
    e: dict[str, Any] = {"driver": driver, "pool": "node-a", "device": device}
    if share:
        e["shareID"] = share
    if note:
        e["data"] = {"note": note}
    return e


def apply(
    fake: FakeKubeApi,
    manager: str,
    entries: list[dict[str, Any]],
    *,
    force: bool = True,
    uid: str | None = None,
    path: str = CLAIM + "/status",
) -> tuple[int, Any]:
    meta: dict[str, Any] = {"name": "c1", "namespace": "default"}
    if uid:
        meta["uid"] = uid
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "status": {"devices": entries},
    }
    query = f"?fieldManager={manager}" + ("&force=true" if force else "")
    return call(fake, path, body, query=query)


def stored(fake: FakeKubeApi) -> list[tuple[str, str, str]]:
    devices = fake.get("ResourceClaim", "c1", "default")["status"].get("devices", [])
    return [(d["driver"], d["device"], d.get("shareID", "")) for d in devices]


@pytest.fixture
def claim(fake_kube: FakeKubeApi) -> dict[str, Any]:
    return fake_kube.create(
        resource_claim(
            "default",
            "c1",
            uid="uid-1",
            devices=[
                Allocated("gpu-0", share_id="s1"),
                Allocated("gpu-0", share_id="s2"),
                Allocated("gpu-1"),
                Allocated("eth0", driver=B),
            ],
        )
    )


def test_list_map_merge_keeps_other_managers_entries(
    fake_kube: FakeKubeApi, claim: dict[str, Any]
) -> None:
    assert apply(fake_kube, "b/node-a", [entry(B, "eth0")])[0] == 200
    code, body = apply(fake_kube, "a/node-a", [entry(A, "gpu-0", "s1"), entry(A, "gpu-0", "s2")])
    assert code == 200
    assert stored(fake_kube) == [(B, "eth0", ""), (A, "gpu-0", "s1"), (A, "gpu-0", "s2")]
    assert body["status"]["allocation"] == claim["status"]["allocation"]
    # Leaving an entry out removes it; the other manager's stays.
    assert apply(fake_kube, "a/node-a", [entry(A, "gpu-0", "s2", note="x")])[0] == 200
    assert stored(fake_kube) == [(B, "eth0", ""), (A, "gpu-0", "s2")]
    devices = fake_kube.get("ResourceClaim", "c1", "default")["status"]["devices"]
    assert devices[1]["data"] == {"note": "x"}
    # An empty list removes all of ours.
    assert apply(fake_kube, "a/node-a", [])[0] == 200
    assert stored(fake_kube) == [(B, "eth0", "")]
    assert apply(fake_kube, "b/node-a", [])[0] == 200
    assert "devices" not in fake_kube.get("ResourceClaim", "c1", "default")["status"]


def test_conflict_without_force_and_takeover_with_it(
    fake_kube: FakeKubeApi, claim: dict[str, Any]
) -> None:
    assert apply(fake_kube, "m1", [entry(A, "gpu-1", note="one")])[0] == 200
    code, body = apply(fake_kube, "m2", [entry(A, "gpu-1", note="two")], force=False)
    assert code == 409 and "conflict" in body["message"]
    assert apply(fake_kube, "m2", [entry(A, "gpu-1", note="one")], force=False)[0] == 200  # same
    assert apply(fake_kube, "m2", [entry(A, "gpu-1", note="two")])[0] == 200
    # m1 lost the entry to m2: m1 leaving it out no longer removes it.
    assert apply(fake_kube, "m1", [])[0] == 200
    assert stored(fake_kube) == [(A, "gpu-1", "")]


def test_shared_ownership_keeps_an_entry_until_both_leave_it(
    fake_kube: FakeKubeApi, claim: dict[str, Any]
) -> None:
    same = entry(A, "gpu-1", note="same")
    assert apply(fake_kube, "m1", [same])[0] == 200
    assert apply(fake_kube, "m2", [same], force=False)[0] == 200
    assert apply(fake_kube, "m1", [])[0] == 200
    assert stored(fake_kube) == [(A, "gpu-1", "")]
    assert apply(fake_kube, "m2", [])[0] == 200
    assert stored(fake_kube) == []


@pytest.mark.parametrize(
    ("entries", "code", "says"),
    [
        ([entry(A, "gpu-7")], 422, "must be an allocated device"),
        ([entry(A, "gpu-0", "s9")], 422, "must be an allocated device"),
        ([entry(A, "gpu-1"), entry(A, "gpu-1")], 422, "Duplicate"),
        ([{"driver": A, "device": "gpu-1"}], 422, "Required"),
        ([{**entry(A, "gpu-1"), "conditions": [{"type": str(i)} for i in range(9)]}], 422, "8"),
        ([entry(A, "gpu-1", note="x" * 10241)], 422, "10240"),
    ],
    ids=["not-allocated", "unknown-share", "duplicate", "no-pool", "conditions", "data"],
)
def test_validation(
    fake_kube: FakeKubeApi,
    claim: dict[str, Any],
    entries: list[dict[str, Any]],
    code: int,
    says: str,
) -> None:
    got, body = apply(fake_kube, "m1", entries)
    assert got == code and says in body["message"], body
    assert stored(fake_kube) == []


def test_request_errors(fake_kube: FakeKubeApi, claim: dict[str, Any]) -> None:
    assert apply(fake_kube, "", [entry(A, "gpu-1")])[0] == 400  # no fieldManager
    assert apply(fake_kube, "m1", [entry(A, "gpu-1")], uid="other-uid")[0] == 422
    assert apply(fake_kube, "m1", [entry(A, "gpu-1")], uid="uid-1")[0] == 200
    assert apply(fake_kube, "m1", [entry(A, "gpu-1")], path=CLAIM)[0] == 415  # main resource
    gone = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/nope/status"
    assert apply(fake_kube, "m1", [], path=gone)[0] == 404
    code, body = call(
        fake_kube,
        CLAIM + "/status",
        {"kind": "ResourceClaim", "status": {}},
        query="?fieldManager=m1",
    )
    assert code == 400 and "apiVersion" in body["message"]
    code, body = call(
        fake_kube,
        CLAIM + "/status",
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "status": {"x": 1}},
        query="?fieldManager=m1",
    )
    assert code == 422 and "not emulated" in body["message"]


def test_apply_is_a_no_op_when_nothing_changes(
    fake_kube: FakeKubeApi, claim: dict[str, Any]
) -> None:
    apply(fake_kube, "m1", [entry(A, "gpu-1")])
    version = fake_kube.resource_version
    assert apply(fake_kube, "m1", [entry(A, "gpu-1")])[0] == 200
    assert fake_kube.resource_version == version


def test_release_134_drops_share_ids_in_status_devices() -> None:
    with FakeKubeApi(kube_minor=34) as fake:
        fake.create(resource_claim("default", "c1", uid="uid-1", devices=[Allocated("gpu-1")]))
        assert apply(fake, "m1", [entry(A, "gpu-1")])[0] == 200
        assert stored(fake) == [(A, "gpu-1", "")]
