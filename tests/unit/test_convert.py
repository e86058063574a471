"""``claim_from_dict``: raw resource.k8s.io/v1 ResourceClaim JSON → our model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.base.errors import ClaimError
from dra_driver.base.ids import ClaimRef, ClaimUID, DeviceName, PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.model import DeviceResult, OpaqueConfig, ResourceClaim
from dra_driver.fakes.objects import Allocated, resource_claim

UID = "3a1f6c0e-7b9d-4e21-8c55-0a1b2c3d4e5f"
REF = ClaimRef("team-a", "train", ClaimUID(UID))
DRIVER = "gpu.fractional.dev"


def node_selector(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


def match_fields(*values: str, key: str = "metadata.name", operator: str = "In") -> dict[str, Any]:
    return {"matchFields": [{"key": key, "operator": operator, "values": list(values)}]}


def full_claim() -> dict[str, Any]:
    """A claim as the API server returns it after the scheduler allocated it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": "team-a",
            "name": "train",
            "uid": UID,
            "resourceVersion": "812",
            "finalizers": ["resource.kubernetes.io/delete-protection"],
        },
        "spec": {"devices": {"requests": [{"name": "gpu"}, {"name": "mon"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu/h100",
                            "driver": DRIVER,
                            "pool": "node-a",
                            "device": "gpu-0",
                            "shareID": "9b2d5c7e-1111-4222-8333-444455556666",
                            "consumedCapacity": {"memory": "10Gi", "multiprocessors": 33},
                        },
                        {
                            "request": "mon",
                            "driver": DRIVER,
                            "pool": "node-a",
                            "device": "gpu-1",
                            "adminAccess": True,
                            "tolerations": [{"key": "k", "operator": "Exists"}],
                        },
                        {
                            "request": "nic",
                            "driver": "net.example.com",
                            "pool": "node-a-nics",
                            "device": "eth1",
                            "shareID": "",
                            "adminAccess": False,
                        },
                    ],
                    "config": [
                        {
                            "source": "FromClass",
                            "opaque": {
                                "driver": DRIVER,
                                "parameters": {"kind": "GpuConfig", "sharing": {"mps": {}}},
                            },
                        },
                        {
                            "source": "FromClaim",
                            "requests": ["gpu", "mon"],
                            "opaque": {"driver": "net.example.com", "parameters": {"mtu": 9000}},
                        },
                    ],
                },
                "nodeSelector": node_selector(match_fields("node-a")),
                "allocationTimestamp": "2026-11-29T10:00:00Z",
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}],
        },
    }


def test_full_allocation() -> None:
    assert claim_from_dict(full_claim()) == ResourceClaim(
        ref=REF,
        allocated=True,
        results=(
            DeviceResult(
                request="gpu/h100",
                driver=DRIVER,
                pool=PoolName("node-a"),
                device=DeviceName("gpu-0"),
                share_id="9b2d5c7e-1111-4222-8333-444455556666",
                consumed_capacity={"memory": "10Gi", "multiprocessors": "33"},
            ),
            DeviceResult(
                request="mon",
                driver=DRIVER,
                pool=PoolName("node-a"),
                device=DeviceName("gpu-1"),
                admin_access=True,
            ),
            DeviceResult(
                request="nic",
                driver="net.example.com",
                pool=PoolName("node-a-nics"),
                device=DeviceName("eth1"),
            ),
        ),
        configs=(
            OpaqueConfig(
                source="FromClass",
                requests=(),
                driver=DRIVER,
                parameters={"kind": "GpuConfig", "sharing": {"mps": {}}},
            ),
            OpaqueConfig(
                source="FromClaim",
                requests=("gpu", "mon"),
                driver="net.example.com",
                parameters={"mtu": 9000},
            ),
        ),
        node_names=frozenset({"node-a"}),
    )


def test_main_request_of_sub_request() -> None:
    claim = claim_from_dict(full_claim())
    assert [r.main_request for r in claim.results] == ["gpu", "mon", "nic"]


def test_testing_builder_round_trips() -> None:
    """``fakes.objects`` (used by many tests) builds what convert understands."""
    raw = resource_claim(
        "ns",
        "c",
        uid=UID,
        devices=[Allocated("gpu-1", request="a/b", share_id="s"), Allocated("gpu-2")],
    )
    claim = claim_from_dict(raw)
    assert claim.ref == ClaimRef("ns", "c", ClaimUID(UID))
    assert claim.node_names == {"node-a"}
    assert [(r.request, r.device, r.pool, r.share_id) for r in claim.results] == [
        ("a/b", "gpu-1", "node-a", "s"),
        ("gpu", "gpu-2", "node-a", None),
    ]


# --- nodeSelector → node_names -------------------------------------------------------

SELECTOR_CASES = [
    pytest.param(node_selector(match_fields("node-a")), {"node-a"}, id="match-fields-in"),
    pytest.param(
        node_selector(match_fields("node-a"), match_fields("node-b", "node-c")),
        {"node-a", "node-b", "node-c"},
        id="terms-are-or-ed",
    ),
    pytest.param(
        node_selector(
            {
                "matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}
                ]
            }
        ),
        set(),
        id="match-expressions-only",
    ),
    pytest.param(node_selector(match_fields("node-a", operator="NotIn")), set(), id="not-in"),
    pytest.param(node_selector(match_fields("node-a", key="spec.unschedulable")), set(), id="key"),
    pytest.param(None, set(), id="no-selector"),
]


@pytest.mark.parametrize(("selector", "names"), SELECTOR_CASES)
def test_node_names(selector: dict[str, Any] | None, names: set[str]) -> None:
    raw = full_claim()
    if selector is None:
        del raw["status"]["allocation"]["nodeSelector"]
    else:
        raw["status"]["allocation"]["nodeSelector"] = selector
    assert claim_from_dict(raw).node_names == names


# --- not allocated -------------------------------------------------------------------


def _no_status(raw: dict[str, Any]) -> None:
    del raw["status"]


def _empty_status(raw: dict[str, Any]) -> None:
    raw["status"] = {}


def _null_allocation(raw: dict[str, Any]) -> None:
    raw["status"]["allocation"] = None


@pytest.mark.parametrize(
    "edit",
    [_no_status, _empty_status, _null_allocation],
    ids=["no-status", "empty-status", "null-allocation"],
)
def test_unallocated(edit: Callable[[dict[str, Any]], None]) -> None:
    raw = full_claim()
    edit(raw)
    assert claim_from_dict(raw) == ResourceClaim(ref=REF, allocated=False)


# --- malformed allocations ---------------------------------------------------------------


def _results(raw: dict[str, Any]) -> list[Any]:
    results: list[Any] = raw["status"]["allocation"]["devices"]["results"]
    return results


MALFORMED: list[Any] = [
    pytest.param(lambda raw: _results(raw)[0].pop("device"), "device", id="missing-device"),
    pytest.param(lambda raw: _results(raw)[0].update(device=""), "device", id="empty-device"),
    pytest.param(lambda raw: _results(raw)[0].update(pool=7), "pool", id="non-string-pool"),
    pytest.param(lambda raw: _results(raw)[1].pop("driver"), "driver", id="missing-driver"),
    pytest.param(lambda raw: _results(raw)[0].update(request=None), "request", id="null-request"),
    pytest.param(
        lambda raw: raw["status"]["allocation"]["devices"].update(results=5),
        "",
        id="results-a-number",
    ),
    pytest.param(
        lambda raw: raw["status"]["allocation"]["devices"].update(results="gpu-0"),
        "",
        id="results-a-string",
    ),
    pytest.param(
        lambda raw: raw["status"]["allocation"]["devices"].update(results={"device": "gpu-0"}),
        "",
        id="results-a-mapping",
    ),
    pytest.param(lambda raw: _results(raw).append("gpu-3"), "", id="result-not-an-object"),
    pytest.param(
        lambda raw: _results(raw)[0].update(consumedCapacity=["10Gi"]),
        "",
        id="consumed-capacity-a-list",
    ),
    pytest.param(
        lambda raw: raw["status"]["allocation"]["devices"].update(config=[["x"]]),
        "",
        id="config-entry-a-list",
    ),
    pytest.param(
        lambda raw: raw["status"]["allocation"].update(nodeSelector={"nodeSelectorTerms": "x"}),
        "",
        id="selector-terms-a-string",
    ),
    pytest.param(lambda raw: raw["status"].update(allocation="yes"), "", id="allocation-a-string"),
]


@pytest.mark.parametrize(("edit", "fragment"), MALFORMED)
def test_malformed_allocation(edit: Callable[[dict[str, Any]], object], fragment: str) -> None:
    raw = copy.deepcopy(full_claim())
    edit(raw)
    with pytest.raises(ClaimError) as info:
        claim_from_dict(raw)
    message = str(info.value)
    assert f"team-a/train:{UID}" in message
    assert "malformed status.allocation" in message
    assert fragment in message
    assert info.value.claim == REF
    assert info.value.__cause__ is not None


def test_non_string_share_id_fails_the_claim() -> None:
    obj = resource_claim("ns", "c", devices=[Allocated("gpu-0", share_id="x")])
    obj["status"]["allocation"]["devices"]["results"][0]["shareID"] = 7
    with pytest.raises(ClaimError, match="shareID must be a string"):
        claim_from_dict(obj)


def test_status_that_is_not_an_object_fails_the_claim() -> None:
    obj = resource_claim("ns", "c", devices=[Allocated("gpu-0")])
    obj["status"] = ["not", "an", "object"]
    with pytest.raises(ClaimError, match="ns/c:"):
        claim_from_dict(obj)
