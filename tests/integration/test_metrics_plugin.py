"""The kubelet plugin's metrics and claim log for real: prepares and unprepares from the
kubelet-like client over the DRA socket, the mps-agent with the fake MPS control daemon,
metrics scraped over HTTP from the metrics endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid

import pytest

from dra_driver.app.plugin import start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.kubelet import FakeKubelet, RegisteredPlugin
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.observability.claim_log import LOGGER
from dra_driver.observability.metrics_server import MetricsServer, new_registry, serve_metrics
from tests.support.metrics import Scrape, scrape
from tests.support.mps import agent_config, agent_running, mps_parts
from tests.support.node import DRIVER, NodeDirs, run_checked

P = "fractional_gpu_dra_"
GIB = 1 << 30
OPS = P + "claim_operations_total"
ERRORS = P + "claim_operation_errors_total"
SHARES = P + "mps_shares"
MEMORY = P + "mps_reserved_memory_bytes"
CLAIMS = P + "prepared_claims"


class Plugin:
    """A started plugin runtime whose engine reports to fresh metrics served over HTTP."""

    def __init__(self, dirs: NodeDirs, source: InMemoryClaimSource) -> None:
        self.metrics = new_registry("kubelet-plugin")
        # As dra-driver kubelet-plugin builds it with --metrics-port.
        self.parts = dataclasses.replace(mps_parts(dirs, source), metrics=self.metrics)
        self.kubelet = FakeKubelet(dirs.registry)
        self.server: MetricsServer | None = None
        self.gpu = ""

    async def __aenter__(self) -> RegisteredPlugin:
        self.runtime = await start_plugin(self.parts)
        self.gpu = self.runtime.inventory.gpus[0].uuid
        self.server = serve_metrics(0, self.metrics, "127.0.0.1")
        return await self.kubelet.wait_for_plugin(DRIVER)

    async def __aexit__(self, *exc: object) -> None:
        await self.kubelet.close()
        await self.runtime.stop()
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    async def scrape(self) -> Scrape:
        assert self.server is not None
        return await asyncio.to_thread(scrape, self.server.port)


def test_metrics_follow_prepares_errors_restarts_and_unprepares(
    node_dirs: NodeDirs, caplog: pytest.LogCaptureFixture
) -> None:
    small = resource_claim(
        "ns", "small", devices=[share("gpu-0", memory="10Gi", compute_percent=25)]
    )
    too_big = resource_claim("ns", "big", devices=[share("gpu-0", memory="72Gi")])
    source = InMemoryClaimSource([small, too_big])
    missing = ClaimRef("ns", "gone", ClaimUID(str(uuid.uuid4())))
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario() -> None:
        async with agent_running(agent_config(node_dirs)):
            first = Plugin(node_dirs, source)
            async with first as plugin:
                gpu = {"gpu_uuid": first.gpu, "device": "gpu-0"}
                before = await first.scrape()
                assert before.get(SHARES, **gpu) == 0
                assert before.get(MEMORY, **gpu) == 0
                assert before.get(CLAIMS, state="PrepareCompleted") == 0

                assert not (await plugin.prepare([claim_ref(small)]))[claim_ref(small).uid].error
                await plugin.prepare([claim_ref(small)])  # repeated
                results = await plugin.prepare([claim_ref(too_big), missing])
                assert all(results[r.uid].error for r in (claim_ref(too_big), missing))

                got = await first.scrape()
                assert got.get(OPS, operation="prepare", outcome="ok") == 1
                assert got.get(OPS, operation="prepare", outcome="repeated") == 1
                assert got.get(OPS, operation="prepare", outcome="error") == 2
                assert got.get(ERRORS, operation="prepare", reason="Overcommit") == 1
                assert got.get(ERRORS, operation="prepare", reason="ClaimNotFound") == 1
                seconds = P + "claim_operation_duration_seconds"
                assert got.get(seconds + "_count", operation="prepare") == 4
                assert got.get(seconds + "_bucket", operation="prepare", le="30.0") == 4
                assert got.get(SHARES, **gpu) == 1
                assert got.get(MEMORY, **gpu) == 10 * GIB
                assert got.get(CLAIMS, state="PrepareCompleted") == 1
                assert got.get(CLAIMS, state="PrepareStarted") == 0

            # A restarted plugin reports what is held at once, before any call.
            second = Plugin(node_dirs, source)
            async with second as plugin:
                restarted = await second.scrape()
                assert restarted.get(OPS, operation="prepare", outcome="ok") == 0
                assert restarted.get(SHARES, **gpu) == 1
                assert restarted.get(MEMORY, **gpu) == 10 * GIB
                assert restarted.get(CLAIMS, state="PrepareCompleted") == 1

                assert (await plugin.unprepare([claim_ref(small)]))[claim_ref(small).uid] == ""
                after = await second.scrape()
                assert after.get(OPS, operation="unprepare", outcome="ok") == 1
                assert after.get(SHARES, **gpu) == 0
                assert after.get(MEMORY, **gpu) == 0
                assert after.get(CLAIMS, state="PrepareCompleted") == 0

    run_checked(scenario())
    # Exactly one claim log line per claim operation, with its structured fields.
    records = [(r.levelname, r.__dict__["fields"]) for r in caplog.records if r.name == LOGGER]
    lines = [(level, f["operation"], f["outcome"], f["reason"]) for level, f in records]
    assert lines[:2] == [("INFO", "prepare", "ok", ""), ("INFO", "prepare", "repeated", "")]
    assert sorted(lines[2:4]) == [
        ("WARNING", "prepare", "error", "ClaimNotFound"),
        ("WARNING", "prepare", "error", "Overcommit"),
    ]
    assert lines[4:] == [("INFO", "unprepare", "ok", "")]
