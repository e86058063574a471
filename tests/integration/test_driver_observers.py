"""The engine tells its observers one ClaimOperation per claim and call (real socket)."""

from __future__ import annotations

import uuid

import pytest

from dra_driver.base.errors import (
    ApiUnavailableError,
    ClaimNotFoundError,
    DriverError,
    InvalidConfigError,
    MpsAgentError,
    OvercommitError,
)
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.prepare import ClaimOperation, error_reason, notify
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.mpsagent.client import MpsAgentUnavailableError
from tests.support.mps import agent_config, agent_running, mps_runtime
from tests.support.node import DRIVER, NodeDirs, run_checked


class Recorder:
    def __init__(self) -> None:
        self.ops: list[ClaimOperation] = []

    def claim_done(self, op: ClaimOperation) -> None:
        self.ops.append(op)


class Broken:
    def claim_done(self, op: ClaimOperation) -> None:
        raise RuntimeError("observer bug")


def test_prepare_repeat_error_and_unprepare_are_reported(node_dirs: NodeDirs) -> None:
    ok = resource_claim("ns", "ok", devices=[share("gpu-0", memory="60Gi")])
    too_big = resource_claim("ns", "big", devices=[share("gpu-0", memory="60Gi")])
    source = InMemoryClaimSource([ok, too_big])
    missing = ClaimRef("ns", "gone", ClaimUID(str(uuid.uuid4())))
    recorder = Recorder()

    async def scenario() -> None:
        async with agent_running(agent_config(node_dirs)):
            runtime = mps_runtime(node_dirs, source)
            await runtime.start()
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                assert runtime.driver is not None
                # A failing observer must not fail the claims or starve the others.
                runtime.driver.observers[:] = [Broken(), recorder]
                plugin = await kubelet.wait_for_plugin(DRIVER)
                first = await plugin.prepare([claim_ref(ok)])
                assert not first[claim_ref(ok).uid].error
                await plugin.prepare([claim_ref(ok)])  # repeated
                results = await plugin.prepare([claim_ref(too_big), missing])
                assert results[claim_ref(too_big).uid].error
                assert results[missing.uid].error
                await plugin.unprepare([claim_ref(ok)])
            finally:
                await kubelet.close()
                await runtime.stop()

    run_checked(scenario())
    ops = [(o.operation, o.ref.name, o.ok, o.reason, o.repeated) for o in recorder.ops]
    assert ops[:2] == [("prepare", "ok", True, "", False), ("prepare", "ok", True, "", True)]
    assert sorted(ops[2:4]) == [
        ("prepare", "big", False, "Overcommit", False),
        ("prepare", "gone", False, "ClaimNotFound", False),
    ]
    assert ops[4] == ("unprepare", "ok", True, "", False)
    first = recorder.ops[0]
    assert first.claim is not None and first.claim.ref == claim_ref(ok)
    assert [d.device_name for d in first.devices] == ["gpu-0"]
    assert first.devices[0].limits is not None
    assert first.devices[0].limits.memory_bytes == 60 * 2**30
    assert all(o.seconds >= 0 for o in recorder.ops)
    big = next(o for o in recorder.ops if o.ref.name == "big")
    assert big.error is not None and "gpu-0" in big.error and not big.devices


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (ClaimNotFoundError(ClaimRef("n", "c", ClaimUID("u")), "gone"), "ClaimNotFound"),
        (OvercommitError(ClaimRef("n", "c", ClaimUID("u")), "full"), "Overcommit"),
        (InvalidConfigError("bad", "mps.computePercent"), "InvalidConfig"),
        (ApiUnavailableError("503"), "ApiError"),
        (MpsAgentError("internal", "no daemon"), "MpsAgentError"),
        (MpsAgentUnavailableError("away"), "MpsAgentError"),
        (DriverError("other"), "DriverError"),
        (ValueError("bug"), "InternalError"),
    ],
)
def test_error_reason(error: BaseException, reason: str) -> None:
    assert error_reason(error) == reason


def test_notify_survives_a_failing_observer() -> None:
    recorder = Recorder()
    op = ClaimOperation("unprepare", ClaimRef("n", "c", ClaimUID("u")), 0.1)
    notify([Broken(), recorder], op)
    assert recorder.ops == [op]
