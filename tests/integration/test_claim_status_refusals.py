"""The plugin's status.devices apply on a claim whose allocation bytes are not in the
API server's own form: refused for good (fact sheet 5.3), and the log says why."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from dra_driver.fakes.objects import claim_ref, resource_claim
from dra_driver.k8s.claim_status import ApplyResult, ClaimStatusWriter
from tests.support.chart import plugin_transport
from tests.support.fakekube import FakeKubeApi
from tests.support.http import send

pytestmark = pytest.mark.chart(())
"""The plugin runs as its ServiceAccount under the chart's RBAC and admission policies."""

DRIVER = "gpu.fractional.dev"
PARAMS = {"kind": "GpuConfig", "apiVersion": "gpu.fractional.dev/v1alpha1"}
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


async def _no_sleep(_: float) -> None:
    return None


@pytest.mark.parametrize("spaced", [False, True], ids=["canonical", "spaced"])
def test_apply_on_an_allocation_stored_with_spaces(
    fake_kube: FakeKubeApi, caplog: pytest.LogCaptureFixture, spaced: bool
) -> None:
    claim = resource_claim("default", "c", configs=[PARAMS])
    allocation = claim.pop("status")["allocation"]
    claim["metadata"].pop("uid")
    code, created = send(fake_kube, "POST", CLAIMS, json.dumps(claim, sort_keys=True).encode())
    assert code == 201, created
    # The scheduler copies the user's bytes into the allocation: here spaced or canonical.
    created["status"] = {"allocation": allocation}
    body = (
        json.dumps(created)
        if spaced
        else json.dumps(created, sort_keys=True, separators=(",", ":"))
    )
    code, written = send(fake_kube, "PUT", f"{CLAIMS}/c/status", body.encode())
    assert code == 200, written
    entry = {"driver": DRIVER, "pool": "node-a", "device": "gpu-0", "data": {"mode": "exclusive"}}
    api = plugin_transport(fake_kube)
    writer = ClaimStatusWriter(api, driver_name=DRIVER, node_name="node-a", sleep=_no_sleep)
    with caplog.at_level(logging.WARNING):
        result = asyncio.run(writer.apply(claim_ref(written), [entry]))
    if not spaced:
        assert result is ApplyResult.WRITTEN
        return
    assert result is ApplyResult.REFUSED
    assert "status.allocation: Invalid value" in caplog.text
    assert "no JSON client can write this claim's status" in caplog.text
