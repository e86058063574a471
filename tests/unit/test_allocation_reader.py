"""``core.allocation``: the one reader of ``status.allocation`` (node and controller)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from dra_driver.allocator.model import allocated_results
from dra_driver.core.allocation import claim_from_dict, share_grant_for
from dra_driver.core.claim_shape import allocation_devices
from dra_driver.core.prepare import trusted_grant

DRIVER = "gpu.fractional.dev"
GRANT = {
    "apiVersion": "gpu.fractional.dev/v1alpha1",
    "kind": "GpuShareGrant",
    "device": "gpu-0",
    "shareID": "6f1c3a52-0000-4000-8000-000000000001",
    "memory": "10Gi",
    "computePercent": 25,
}
RESULT = {"request": "gpu/a", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"}


def config(
    *, source: str = "FromClaim", driver: str = DRIVER, requests: Any = None, **params: Any
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": driver, "parameters": {**GRANT, **params}},
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


@pytest.mark.parametrize(
    ("configs", "found"),
    [
        pytest.param([config()], True, id="from-claim-same-device"),
        pytest.param([config(requests=["gpu"])], True, id="main-request"),
        pytest.param([config(requests=["gpu/b"])], True, id="another-sub-request-same-main"),
        pytest.param([config(requests=["other"])], False, id="another-request"),
        pytest.param([config(source="FromClass")], False, id="from-class-is-not-trusted"),
        pytest.param([config(driver="other.dev")], False, id="another-driver"),
        pytest.param([config(device="gpu-1")], False, id="another-device"),
        pytest.param([config(memory="lots")], False, id="malformed-is-skipped"),
        pytest.param([config(kind="GpuConfig")], False, id="not-a-grant"),
        pytest.param([config(device="gpu-1"), config()], True, id="the-first-that-matches"),
    ],
)
def test_share_grant_for(configs: list[dict[str, Any]], found: bool) -> None:
    grant = share_grant_for(configs, RESULT)
    assert (grant is not None) is found
    if grant is not None:
        assert (grant.share_id, grant.memory_bytes) == (GRANT["shareID"], 10 * 2**30)


def claim(results: list[dict[str, Any]], configs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
        "status": {"allocation": {"devices": {"results": results, "config": configs}}},
    }


def test_both_paths_read_the_same_results() -> None:
    obj = claim([{**RESULT, "shareID": "s1", "consumedCapacity": {"memory": "4Gi"}}], [])
    node = claim_from_dict(obj).results[0]
    (controller,) = allocated_results(obj)
    assert (node.device, node.share_id, node.consumed_capacity) == (
        "gpu-0",
        "s1",
        {"memory": "4Gi"},
    )
    assert (controller.device, controller.share_id, controller.consumed) == (
        "gpu-0",
        "s1",
        {"memory": Fraction(4 * 2**30)},
    )


def test_a_grant_keyed_share_reads_as_the_grants_share_on_the_controller() -> None:
    obj = claim([RESULT], [config()])
    node = claim_from_dict(obj)
    assert node.results[0].share_id is None  # the node asks its trusted grant
    grant = trusted_grant(node.results[0], node.configs, DRIVER)
    assert grant is not None and grant.share_id == GRANT["shareID"]
    (controller,) = allocated_results(obj)
    assert controller.share_id == GRANT["shareID"]
    assert controller.consumed["memory"] == 10 * 2**30


def test_an_unallocated_claim_has_no_devices() -> None:
    assert allocation_devices({"status": {}}) == {}
    assert allocation_devices({}) == {}
    assert not claim_from_dict({"metadata": {}}).allocated
