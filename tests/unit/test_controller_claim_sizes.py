"""A claim's requested size is worked out once per claim (its spec cannot change) and
reused by every ordering of a batch (dra_driver/controller/claim_sizes.py)."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from dra_driver.controller.claim_sizes import ClaimSizes
from dra_driver.controller.reconcile import CONTROLLER_CLASS, placement_key
from dra_driver.core.claim_shape import MalformedClaimError

DRIVER = "gpu.fractional.dev"
GI = 1024**3


def claim(uid: str, memory: str) -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid, "creationTimestamp": "T"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": CONTROLLER_CLASS,
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
    }


def test_a_size_is_worked_out_once_per_claim_and_forgotten_with_it() -> None:
    sizes = ClaimSizes(DRIVER)
    c1 = claim("u1", "10Gi")
    assert sizes(c1) == (0, Fraction(10 * GI))
    # Kept by UID: the same claim read again (a later resourceVersion) is not parsed again;
    # its requests are replaced here only to show that (a real spec never changes).
    c1["spec"]["devices"]["requests"] = "not requests"
    assert sizes(c1) == (0, Fraction(10 * GI))
    assert placement_key("u1", c1, DRIVER, sizes)[:3] == (1, 0, -Fraction(10 * GI))
    sizes.forget("u1")
    with pytest.raises(MalformedClaimError):
        sizes(c1)
    assert len(sizes) == 0
    sizes(claim("u2", "4Gi"))
    sizes(claim("u3", "4Gi"))
    sizes.retain({"u3"})
    assert len(sizes) == 1


def test_placement_key_falls_back_as_before_when_the_size_cannot_be_read() -> None:
    bad = claim("u1", "10Gi")
    bad["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["memory"] = "lots"
    assert placement_key("u1", bad, DRIVER, ClaimSizes(DRIVER))[:3] == (1, 0, Fraction(0))
