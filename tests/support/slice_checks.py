"""Checks every built pool of slices must pass: our API rules and the official schema."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from dra_driver.core.settings import Capabilities
from dra_driver.core.slices import DesiredSlice, pool_problems, validate_pool

NODE = "node-a"
DRIVER = "gpu.fractional.dev"


def assert_publishable(slices: Sequence[DesiredSlice], caps: Capabilities, minor: int) -> None:
    """Our API rules and the official strict OpenAPI schema of 1.<minor>."""
    specs = [s.spec for s in slices]
    assert pool_problems(specs, caps) == []
    validate_pool(specs, caps)
    assert len({s.key for s in slices}) == len(slices), "keys must be unique"
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate",
        reason="kubernetes-validate (test extra) is not installed: OpenAPI schema not checked",
    )
    # One ResourceSliceList per pool: the schema is loaded once, not once per slice.
    items = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-{DRIVER}-{desired.key}"},
            "spec": dict(desired.spec),
        }
        for desired in slices
    ]
    pool = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList", "items": items}
    kubernetes_validate.validate(pool, f"1.{minor}.0", strict=True)
