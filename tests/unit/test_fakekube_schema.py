"""The fake API server's schema check remembers valid fragments, never refusals."""

from __future__ import annotations

import copy

import pytest

from dra_driver.fakes.objects import resource_claim
from tests.support.fakekube import DEFAULT_KINDS, FakeApiError
from tests.support.fakekube_schema import check_schema

CLAIMS = next(k for k in DEFAULT_KINDS if k.kind == "ResourceClaim")
MINOR = 36


def refusal(obj: dict[str, object]) -> str:
    with pytest.raises(FakeApiError) as caught:
        check_schema(CLAIMS, obj, MINOR)
    assert caught.value.code == 422
    return str(caught.value)


def test_a_fragment_found_valid_before_still_refuses_what_changed_inside_it() -> None:
    claim = resource_claim("default", "c1")
    check_schema(CLAIMS, claim, MINOR)  # valid: its spec and status are remembered
    check_schema(CLAIMS, copy.deepcopy(claim), MINOR)

    broken = copy.deepcopy(claim)
    broken["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = 3
    assert "spec.devices.requests.0.exactly.allocationMode" in refusal(broken)

    unknown = copy.deepcopy(claim)
    unknown["status"]["allocation"]["devices"]["results"][0]["surprise"] = "x"
    assert "status.allocation.devices.results.0" in refusal(unknown)


def test_a_refusal_is_worded_the_same_each_time() -> None:
    claim = resource_claim("default", "c1")
    claim["metadata"]["finalizers"] = "not-a-list"
    first = refusal(claim)
    assert "metadata.finalizers" in first
    assert refusal(copy.deepcopy(claim)) == first
