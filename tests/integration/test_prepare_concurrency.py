"""Claims on different GPUs are enforced at the same time, each answered when its own
work is recorded: the plugin over its real socket, the mps-agent with the fake control
binary as real processes, every accepted control command taking 300 ms.

Each command is a process of its own (as NVIDIA documents them), and a start of the
fake costs tens of ms of CPU on top, more on a loaded machine: so concurrency is read
from the daemons' own record of when each command was busy (how many of the GPUs'
commands were running at one moment), not from a wall-clock bound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dra_driver.app.plugin import Plugin, PluginParts, start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet, RegisteredPlugin
from dra_driver.fakes.mps_control import DELAY_ENV, RECORD_FILE
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.port import MpsAgentPort
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo
from tests.support.eventually import eventually
from tests.support.mps import agent_running, fake_agent_config, until_shares
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked

GPUS = 10
COMMAND_S = 0.3


def busy_spans(dirs: NodeDirs, *, since: float, verb: str) -> list[tuple[float, float]]:
    """When the fake daemons were busy with each ``namespace <verb>`` command since
    ``since`` (wall time), from their command records (a command is recorded once done)."""
    spans: list[tuple[float, float]] = []
    for path in glob.glob(os.path.join(dirs.root, "**", RECORD_FILE), recursive=True):
        with open(path, encoding="utf-8") as f:
            for line in f:
                entry = json.loads(line)
                argv = entry.get("argv") or []
                if argv[:2] == ["namespace", verb] and entry.get("busy_since", 0) >= since:
                    spans.append((entry["busy_since"], entry["t"]))
    return spans


def most_busy_at_once(dirs: NodeDirs, *, since: float, verb: str) -> int:
    """The most ``namespace <verb>`` commands the fake daemons were busy with at one
    moment since ``since`` (wall time)."""
    spans = busy_spans(dirs, since=since, verb=verb)
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    busy = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        busy += step
        most = max(most, busy)
    return most


def slow_agent(dirs: NodeDirs) -> AgentConfig:
    return fake_agent_config(dirs.plugin, dirs.root, {DELAY_ENV: str(COMMAND_S)})


@contextlib.asynccontextmanager
async def serving(
    dirs: NodeDirs, claims: list[dict[str, Any]], gpus: int, settings: NodeSettings
) -> AsyncIterator[tuple[Plugin, RegisteredPlugin, AgentConfig]]:
    """The slow agent, and the plugin on ``gpus`` fake H100s serving ``claims`` over
    its real socket, registered with a kubelet-like client."""
    agent = slow_agent(dirs)
    config = dataclasses.replace(
        dirs.config(), settings=settings, mps_agent_socket=agent.socket_path
    )
    async with agent_running(agent):
        backend = FakeGpuBackend(f"h100-80gb:{gpus}", NODE)
        runtime = await start_plugin(PluginParts(config, backend, InMemoryClaimSource(claims)))
        kubelet = FakeKubelet(dirs.registry)
        try:
            yield runtime, await kubelet.wait_for_plugin(DRIVER), agent
        finally:
            await kubelet.close()
            await runtime.stop()


@pytest.mark.parametrize("calls", ["one call per claim", "one call"])
def test_ten_claims_on_ten_gpus_are_enforced_at_once(node_dirs: NodeDirs, calls: str) -> None:
    """Each new share is two control commands (namespace create, set): 600 ms of the
    daemon's time per claim. One after another, ten claims take over six seconds."""
    resident = [
        resource_claim("r", f"resident-{i}", devices=[share(f"gpu-{i}")]) for i in range(GPUS)
    ]
    burst = [resource_claim("b", f"claim-{i}", devices=[share(f"gpu-{i}")]) for i in range(GPUS)]
    timesliced = resource_claim("t", "timesliced", devices=[share("gpu-10")])
    settings = NodeSettings(
        default=GpuSettings(Sharing.MPS), per_gpu={"10": GpuSettings(Sharing.TIMESLICING)}
    )
    claims = [*resident, *burst, timesliced]

    async def scenario() -> None:
        async with serving(node_dirs, claims, GPUS + 1, settings) as (_, plugin, agent):
            # Every GPU's daemon up (a daemon start is more commands and a process).
            warm = await plugin.prepare([claim_ref(c) for c in resident])
            assert not any(r.error for r in warm.values()), warm

            refs = [claim_ref(c) for c in burst]
            quick_ref = claim_ref(timesliced)
            answered: dict[str, float] = {}
            wall_start = time.time()
            started = time.perf_counter()

            async def call(group: list) -> None:  # type: ignore[type-arg]
                results = await plugin.prepare(group)
                for ref in group:
                    assert results[ref.uid].error == "", results[ref.uid].error
                    answered[ref.uid] = time.perf_counter() - started

            groups = [[r] for r in refs] if calls == "one call per claim" else [refs]
            await asyncio.gather(*(call(g) for g in groups), call([quick_ref]))
            elapsed = time.perf_counter() - started

            shares = await MpsAgentClient(agent.socket_path).list_shares()
            assert {s.claim_uid for s in shares} >= {r.uid for r in refs}
            # Serial: one command at a time. Concurrent: the GPUs' daemons busy at once.
            at_once = most_busy_at_once(node_dirs, since=wall_start, verb="set")
            assert at_once >= GPUS // 2, (at_once, elapsed, answered)
            # A claim without side effects is not held up by the MPS claims.
            assert answered[quick_ref.uid] < min(answered[r.uid] for r in refs), answered

            wall_start = time.time()
            groups = [[r] for r in refs] if calls == "one call per claim" else [refs]
            gone = await asyncio.gather(*(plugin.unprepare(g) for g in groups))
            assert not any(e for errors in gone for e in errors.values()), gone
            # Namespace delete: one command each, after the answers, also at once.
            await eventually(
                lambda: len(busy_spans(node_dirs, since=wall_start, verb="delete")) == GPUS,
                "the namespace deletes",
            )
            at_once = most_busy_at_once(node_dirs, since=wall_start, verb="delete")
            assert at_once >= GPUS // 2, at_once

    run_checked(scenario())


class GatedAgent:
    """The real mps-agent client whose share requests wait at a gate: ``arrived`` is set
    when one is asked for, and it goes on to the agent once ``opened`` is set."""

    def __init__(self, agent: MpsAgentPort) -> None:
        self.agent = agent
        self.arrived = asyncio.Event()
        self.opened = asyncio.Event()

    async def ensure_share(self, gpu_uuid: str, share_id: str, **limits: Any) -> ShareInfo:
        self.arrived.set()
        await self.opened.wait()
        return await self.agent.ensure_share(gpu_uuid, share_id, **limits)

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        return await self.agent.release_share(gpu_uuid, share_id)

    async def list_shares(self) -> list[ShareInfo]:
        return await self.agent.list_shares()

    async def status(self) -> AgentStatus:
        return await self.agent.status()


def test_an_unprepare_waits_for_the_prepare_in_flight(node_dirs: NodeDirs) -> None:
    """The kubelet gives up on a slow prepare and unprepares: the unprepare is decided
    after the prepare's side effects finish, so it releases the share they made."""
    resident = resource_claim("r", "resident", devices=[share("gpu-0")])
    claim = resource_claim("b", "slow", devices=[share("gpu-0")])
    resident_uid = claim_ref(resident).uid

    async def scenario() -> None:
        async with serving(node_dirs, [resident, claim], 1, NodeSettings()) as (
            runtime,
            plugin,
            agent,
        ):
            assert not (await plugin.prepare([claim_ref(resident)]))[resident_uid].error
            driver = runtime.driver
            assert driver is not None and driver.enforcer is not None
            assert driver.enforcer.mps is not None
            gated = GatedAgent(driver.enforcer.mps)
            driver.enforcer.mps = gated
            ref = claim_ref(claim)
            try:
                prepare = asyncio.create_task(plugin.prepare([ref]))
                await asyncio.wait_for(gated.arrived.wait(), 30)  # its share is being made
                unprepare = asyncio.create_task(plugin.unprepare([ref]))
                await eventually(lambda: driver.activity.calls == 2, "the unprepare in the engine")
                # A later unprepare (of a claim never prepared) is decided in arrival order:
                # once it is answered, the engine has passed ours by and left it waiting.
                never = ClaimRef("b", "never", ClaimUID(str(uuid.uuid4())))
                assert (await plugin.unprepare([never]))[never.uid] == ""
                assert not prepare.done() and not unprepare.done()
            finally:
                gated.opened.set()  # also when an assertion failed: the prepare ends
            errors = await unprepare
            assert errors[ref.uid] == ""
            assert prepare.done()  # answered before the unprepare was
            assert (await prepare)[ref.uid].error == ""
            await until_shares(MpsAgentClient(agent.socket_path), [resident_uid])
            assert not os.path.exists(
                os.path.join(node_dirs.cdi, f"k8s.gpu.fractional.dev-claim_{ref.uid}.json")
            )

    run_checked(scenario())


# A completion waiting for the node lock shares the next decisions' write: stated in
# tests/unit/test_checkpoint_journal.py, through a CheckpointStore passed in.
