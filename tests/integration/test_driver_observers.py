"""The engine tells its observers one ClaimOperation per claim and call (real socket)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any

import pytest

from dra_driver.app.plugin import start_plugin
from dra_driver.base.errors import (
    ApiUnavailableError,
    ClaimNotFoundError,
    DriverError,
    InvalidConfigError,
    MpsAgentError,
    OvercommitError,
)
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.model import ResourceClaim
from dra_driver.core.prepare import (
    ClaimOperation,
    DriverObserver,
    MpsShare,
    error_reason,
    notify,
)
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.kubelet import FakeKubelet, RegisteredPlugin
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.mpsagent.client import MpsAgentUnavailableError
from dra_driver.plugin.activity import CallActivity
from tests.support.eventually import eventually
from tests.support.mps import agent_config, agent_running, mps_parts
from tests.support.node import DRIVER, NodeDirs, run_checked


class Recorder:
    def __init__(self) -> None:
        self.ops: list[ClaimOperation] = []

    def claim_done(self, op: ClaimOperation) -> None:
        self.ops.append(op)


class Broken:
    def claim_done(self, op: ClaimOperation) -> None:
        raise RuntimeError("observer bug")


@contextlib.asynccontextmanager
async def observed_plugin(
    node_dirs: NodeDirs,
    source: InMemoryClaimSource,
    observers: Sequence[DriverObserver],
    activity: CallActivity | None = None,
) -> AsyncIterator[RegisteredPlugin]:
    """The plugin with its agent, ``observers`` told of every claim after its own, as the
    kubelet sees it; ``activity``: its calls in flight (None: its own)."""
    parts = mps_parts(node_dirs, source)
    parts = dataclasses.replace(
        parts, observers=observers, activity=activity if activity is not None else parts.activity
    )
    async with agent_running(agent_config(node_dirs)):
        runtime = await start_plugin(parts)
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            yield await kubelet.wait_for_plugin(DRIVER)
        finally:
            await kubelet.close()
            await runtime.stop()


def test_prepare_repeat_error_and_unprepare_are_reported(node_dirs: NodeDirs) -> None:
    ok = resource_claim("ns", "ok", devices=[share("gpu-0", memory="60Gi")])
    too_big = resource_claim("ns", "big", devices=[share("gpu-0", memory="60Gi")])
    source = InMemoryClaimSource([ok, too_big])
    missing = ClaimRef("ns", "gone", ClaimUID(str(uuid.uuid4())))
    recorder = Recorder()

    async def scenario() -> None:
        # A failing observer must not fail the claims or starve the others.
        async with observed_plugin(node_dirs, source, [Broken(), recorder]) as plugin:
            first = await plugin.prepare([claim_ref(ok)])
            assert not first[claim_ref(ok).uid].error
            await plugin.prepare([claim_ref(ok)])  # repeated
            results = await plugin.prepare([claim_ref(too_big), missing])
            assert results[claim_ref(too_big).uid].error
            assert results[missing.uid].error
            await plugin.unprepare([claim_ref(ok)])

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
    assert isinstance(first.devices[0], MpsShare)
    assert first.devices[0].limits.memory_bytes == 60 * 2**30
    assert all(o.seconds >= 0 for o in recorder.ops)
    big = next(o for o in recorder.ops if o.ref.name == "big")
    assert big.error is not None and "gpu-0" in big.error and not big.devices


class GatedSource(InMemoryClaimSource):
    """Holds every GET until ``wave`` of them wait: the calls are surely in flight together."""

    def __init__(self, claims: Iterable[Mapping[str, Any]], wave: int) -> None:
        super().__init__(claims)
        self.wave = wave
        self.waiting = 0
        self.gate = asyncio.Event()

    async def get_claim(self, ref: ClaimRef) -> ResourceClaim:
        self.waiting += 1
        if self.waiting >= self.wave:
            self.gate.set()
        await self.gate.wait()
        return await super().get_claim(ref)


class CallsInFlight:
    """Records, for each claim it is told of, how many kubelet calls were in flight
    (:attr:`activity`: give it to the plugin)."""

    def __init__(self) -> None:
        self.activity = CallActivity()
        # However long a wave takes on a loaded machine, its observers wait for its end
        # (the engine's lull gives up after max_wait_s, 2 s in the product).
        self.activity.max_wait_s = 120
        self.seen: list[tuple[str, str, int]] = []

    def claim_done(self, op: ClaimOperation) -> None:
        self.seen.append((op.operation, op.ref.name, self.activity.calls))


def test_a_wave_is_answered_before_its_observers_are_told(node_dirs: NodeDirs) -> None:
    wave = [resource_claim("ns", f"w{i}", devices=[share("gpu-0", memory="4Gi")]) for i in range(3)]
    alone = resource_claim("ns", "alone", devices=[share("gpu-0", memory="4Gi")])
    source = GatedSource([*wave, alone], wave=3)

    async def scenario() -> list[tuple[str, str, int]]:
        calls = CallsInFlight()
        async with observed_plugin(node_dirs, source, [calls], calls.activity) as plugin:
            told = calls.seen
            answers = await asyncio.gather(*(plugin.prepare([claim_ref(c)]) for c in wave))
            assert not any(r.error for a in answers for r in a.values()), answers
            await eventually(lambda: len(told) == 3, "the wave's prepares told")
            await asyncio.gather(*(plugin.unprepare([claim_ref(c)]) for c in wave))
            await eventually(lambda: len(told) == 6, "the wave's unprepares told")
            source.wave = 1  # a lone call: no one to wait for
            await plugin.prepare([claim_ref(alone)])
            told_alone = len(told)
            await plugin.unprepare([claim_ref(alone)])
            assert told_alone == 7, "a lone call's observers are told before its answer"
            return told

    seen = run_checked(scenario())
    # Told once no call was in flight any more, each prepare before its unprepare.
    assert sorted(seen[:3]) == [("prepare", f"w{i}", 0) for i in range(3)]
    assert sorted(seen[3:6]) == [("unprepare", f"w{i}", 0) for i in range(3)]
    # Alone: told while its own call was still in flight, i.e. before it was answered.
    assert seen[6:] == [("prepare", "alone", 1), ("unprepare", "alone", 1)]


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
