"""What the controller's informers keep of each object, and how."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import pytest

from dra_driver.allocator import why_node_unfit
from dra_driver.controller.cache import PackedCache, PlainCache
from dra_driver.controller.claim_index import ClaimPodIndex, pod_uses
from dra_driver.controller.readonly import ReadOnlyDict, ReadOnlyList, read_only
from dra_driver.controller.reconcile import pod_is_live
from dra_driver.controller.slim import (
    Strings,
    Subtrees,
    claim_keeper,
    namespace_keeper,
    node_keeper,
    pod_keeper,
)

JsonObj = dict[str, Any]


def decoded(obj: JsonObj) -> JsonObj:
    """As the informer gets it: fresh from JSON (no string shared with another object)."""
    out: JsonObj = json.loads(json.dumps(obj))
    return out


POD: JsonObj = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p1",
        "namespace": "team-a",
        "uid": "pod-uid",
        "resourceVersion": "7",
        "deletionTimestamp": "2026-12-01T00:00:00Z",
        "labels": {"app": "x"},
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
    },
    "spec": {
        "nodeName": "",
        "nodeSelector": {"zone": "a"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
        "containers": [{"name": "main", "image": "x", "env": [{"name": "A", "value": "1"}]}],
        "volumes": [{"name": "v", "emptyDir": {}}],
    },
    "status": {
        "phase": "Pending",
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "c1"}],
        "conditions": [{"type": "PodScheduled", "status": "False"}],
    },
}

NODE: JsonObj = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "n1", "uid": "node-uid", "labels": {"zone": "b"}, "annotations": {}},
    "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}], "unschedulable": True},
    "status": {"images": [{"names": ["x"], "sizeBytes": 1}], "conditions": []},
}


def test_a_pod_keeps_what_the_controller_reads_and_nothing_else() -> None:
    slim = pod_keeper()(decoded(POD))
    assert slim == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            k: POD["metadata"][k]
            for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
        },
        "spec": {k: v for k, v in POD["spec"].items() if k not in ("containers", "volumes")},
        "status": {k: v for k, v in POD["status"].items() if k != "conditions"},
    }


def test_the_controller_reads_a_slim_pod_and_node_as_the_whole_ones() -> None:
    claim = {"metadata": {"name": "c1", "namespace": "team-a", "uid": "claim-uid"}}
    pod, node = decoded(POD), decoded(NODE)
    slim, thin_node = pod_keeper()(pod), node_keeper()(node)
    assert pod_uses(slim, claim) == pod_uses(pod, claim) is True
    assert pod_is_live(slim) == pod_is_live(pod) is False
    assert why_node_unfit(thin_node, slim) == why_node_unfit(node, pod) is not None
    whole, thin = ClaimPodIndex(), ClaimPodIndex()
    whole.pod_changed(pod)
    thin.pod_changed(slim)
    assert thin.pods_of(claim) == whole.pods_of(claim) == {"pod-uid"}
    assert "status" not in thin_node and thin_node["spec"] == NODE["spec"]


def test_a_namespace_keeps_its_annotations() -> None:
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "annotations": {"q": "1"}, "managedFields": [{}]},
        "spec": {"finalizers": ["kubernetes"]},
    }
    assert namespace_keeper()(decoded(namespace)) == {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "team-a", "annotations": {"q": "1"}},
    }


def test_a_claim_loses_only_its_managed_fields_and_device_status() -> None:
    claim: JsonObj = {
        "metadata": {"name": "c1", "managedFields": [{"manager": "x"}], "finalizers": ["f"]},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": []}}, "devices": [{"data": {}}]},
    }
    keep = claim_keeper()
    slim = keep(decoded(claim))
    expected = copy.deepcopy(claim)
    del expected["metadata"]["managedFields"]
    del expected["status"]["devices"]
    assert slim == expected
    assert keep(decoded({"metadata": {"name": "c"}})) == {"metadata": {"name": "c"}}


def test_keys_and_short_strings_are_shared_between_objects() -> None:
    strings = Strings()
    one, two = strings.shared(decoded(POD)), strings.shared(decoded(POD))
    assert one == POD
    key_one = next(iter(one["metadata"]))
    key_two = next(iter(two["metadata"]))
    assert key_one is key_two
    assert one["metadata"]["namespace"] is two["metadata"]["namespace"]
    long = "x" * 200
    assert (
        strings.shared(decoded({"m": long}))["m"] is not strings.shared(decoded({"m": long}))["m"]
    )


def test_nothing_kept_is_interned() -> None:
    """The interpreter's table of interned strings never learns an object's strings:
    on Python 3.12 it never lets them go (a pod's name would outlive the pod)."""
    name, namespace = "pod-interned-never-7f3a", "namespace-interned-never-7f3a"
    pod = decoded({**POD, "metadata": {**POD["metadata"], "name": name, "namespace": namespace}})
    kept = pod_keeper()(pod)
    fresh = "".join(["pod-interned-never-", "7f3a"])  # equal, built at run time
    assert sys.intern(fresh) is fresh is not kept["metadata"]["name"]
    assert (
        sys.intern("".join(["namespace-interned-never-", "7f3a"]))
        is not (kept["metadata"]["namespace"])
    )


def test_the_string_table_starts_afresh_at_its_limit() -> None:
    strings = Strings(limit=3)
    first = "".join(["a", "0"])
    assert strings.one(first) is first
    assert strings.one("".join(["a", "0"])) is first
    for n in range(1, 10):
        strings.one(f"a{n}")
        assert len(strings) <= 3
    assert strings.one("".join(["a", "0"])) is not first  # forgotten


def test_two_informers_keepers_share_nothing() -> None:
    """Each informer has its own tables: two controllers in one process (or two
    informers of one) never hold the same string or subtree object."""
    one, two = claim_keeper(), claim_keeper()
    a = one(decoded(_allocated_claim(1, "node-a", "10Gi")))
    b = two(decoded(_allocated_claim(1, "node-a", "10Gi")))
    assert a == b
    assert a["spec"] is not b["spec"]
    assert a["metadata"]["name"] is not b["metadata"]["name"]
    assert next(iter(a["metadata"])) is not next(iter(b["metadata"]))


def test_a_shared_subtree_refuses_changes() -> None:
    keep = claim_keeper()
    one = keep(decoded(_allocated_claim(1, "node-a", "10Gi")))
    two = keep(decoded(_allocated_claim(2, "node-a", "10Gi")))
    spec = one["spec"]
    assert spec is two["spec"] and isinstance(spec, ReadOnlyDict)
    requests = spec["devices"]["requests"]
    assert isinstance(requests, ReadOnlyList)
    with pytest.raises(TypeError, match="read-only"):
        spec["devices"]["config"] = []
    with pytest.raises(TypeError, match="read-only"):
        requests.append({"name": "more"})
    with pytest.raises(TypeError, match="read-only"):
        requests[0].pop("name")
    with pytest.raises(TypeError, match="read-only"):
        one["metadata"]["finalizers"] += ["x"]
    assert two["spec"] == _allocated_claim(2, "node-a", "10Gi")["spec"]  # unchanged
    # Only the shared subtrees are read-only: the object's own parts are the cache's.
    assert type(one["metadata"]) is dict


@pytest.mark.parametrize(
    "copied",
    [copy.deepcopy, copy.copy, lambda t: json.loads(json.dumps(t))],
    ids=["deepcopy", "copy", "json"],
)
def test_a_copy_of_a_read_only_tree_is_a_plain_one(copied: Any) -> None:
    tree = {"a": [1, {"b": "c"}], "d": {"e": None, "f": True}}
    frozen = read_only(tree)
    assert frozen == tree and json.dumps(frozen) == json.dumps(tree)
    mine = copied(frozen)
    assert mine == tree and type(mine) is dict
    mine["a"] = []  # a plain dict: the caller's own
    assert frozen == tree
    if copied is not copy.copy:
        assert type(mine["d"]) is dict
        mine["d"]["e"] = 1


def test_a_packed_cache_reads_as_a_plain_one_and_hands_out_copies() -> None:
    plain, packed = PlainCache(), PackedCache()
    for cache in (plain, packed):
        cache.put("a", decoded(NODE))
        cache.put("b", {"metadata": {"name": "b"}})
        cache.pop("b")
        cache.pop("missing")
    assert packed.values() == plain.values() == [NODE]
    assert packed.get("a") == NODE and packed.get("b") is None
    assert packed.uids() == plain.uids() == {"a"} and len(packed) == 1
    taken = packed.get("a")
    assert taken is not None
    taken["metadata"]["name"] = "changed"
    assert packed.get("a") == NODE


def _allocated_claim(n: int, node: str, memory: str) -> JsonObj:
    share = {"apiVersion": "gpu.fractional.dev/v1alpha1", "kind": "GpuShare", "memory": memory}
    config = {"requests": ["gpu"], "opaque": {"driver": "gpu.fractional.dev", "parameters": share}}
    grant = {"opaque": {"parameters": {"kind": "GpuShareGrant", "shareID": f"s-{n}"}}}
    selector = {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "values": [node]}]}]
    }
    return {
        "metadata": {"name": f"c{n}", "uid": f"u{n}", "finalizers": ["f"]},
        "spec": {"devices": {"requests": [{"name": "gpu"}], "config": [config]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"shareID": f"s-{n}", "consumedCapacity": {"memory": memory}}],
                    "config": [{"source": "FromClaim", **config}, grant],
                },
                "nodeSelector": selector,
            }
        },
    }


def test_claims_share_their_equal_subtrees_and_keep_their_own() -> None:
    keep = claim_keeper()
    one = keep(decoded(_allocated_claim(1, "node-a", "10Gi")))
    two = keep(decoded(_allocated_claim(2, "node-a", "10Gi")))
    other = keep(decoded(_allocated_claim(3, "node-b", "20Gi")))
    assert one == _allocated_claim(1, "node-a", "10Gi")  # nothing lost or changed
    assert two == _allocated_claim(2, "node-a", "10Gi")
    assert one["spec"] is two["spec"] and one["spec"] is not other["spec"]
    alloc_one, alloc_two = one["status"]["allocation"], two["status"]["allocation"]
    assert alloc_one["nodeSelector"] is alloc_two["nodeSelector"]
    assert alloc_one["devices"]["config"][0] is alloc_two["devices"]["config"][0]
    grant_one, grant_two = alloc_one["devices"]["config"][1], alloc_two["devices"]["config"][1]
    assert grant_one is not grant_two and grant_one != grant_two  # its own share ID
    assert type(grant_one) is dict  # never shared, so not in the table, the claim's own
    assert len(keep.subtrees) == 9  # by share size or node: 2 each of 4 paths; 1 finalizers
    results_one, results_two = alloc_one["devices"]["results"], alloc_two["devices"]["results"]
    assert results_one[0]["consumedCapacity"] is results_two[0]["consumedCapacity"]
    assert results_one[0] is not results_two[0]
    assert other["status"]["allocation"]["nodeSelector"] is not alloc_one["nodeSelector"]


def test_subtrees_equal_only_in_python_are_not_shared() -> None:
    table = Subtrees()
    counted = table.one({"count": 1})
    flag, real = table.one({"count": True}), table.one({"count": 1.0})
    assert flag == counted == real  # equal in Python, not in JSON
    assert flag is not counted and real is not counted and flag is not real
    assert type(flag["count"]) is bool and type(real["count"]) is float
    assert table.one({"count": 1}) is counted


def test_the_subtree_table_starts_afresh_at_its_limit() -> None:
    table = Subtrees(limit=3)
    first = table.one({"n": 0})
    assert first == {"n": 0} and table.one({"n": 0}) is first
    for n in range(1, 10):
        table.one({"n": n})
        assert len(table) <= 3
    assert table.one({"n": 0}) is not first  # forgotten, the objects holding it keep it


def test_values_no_other_object_shares_are_not_in_the_table() -> None:
    pod = {**POD, "metadata": {**POD["metadata"], "resourceVersion": "4815162342"}}
    strings = Strings()
    one, two = strings.shared(decoded(pod)), strings.shared(decoded(pod))
    assert one == two == pod
    assert one["metadata"]["uid"] is not two["metadata"]["uid"]  # each object's own
    assert one["metadata"]["resourceVersion"] is not two["metadata"]["resourceVersion"]
    assert one["metadata"]["name"] is two["metadata"]["name"]  # names may repeat: shared
