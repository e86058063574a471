"""What the mps-agent runs at once on one GPU: the real agent on its socket, the fake
``nvidia-cuda-mps-control`` as real processes, every accepted command taking
``COMMAND_S`` in the fake daemon (``FAKE_MPS_COMMAND_DELAY_S``).

Shares of different claims on one v3 daemon are prepared side by side; one share's
own ensure and release, a daemon's start and restart, and every legacy change stay
one at a time. Overlap is read from the fake daemon's own record of when each command
was busy, not from wall-clock bounds (the machine is shared and loaded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.fakes.mps_control import DELAY_ENV
from dra_driver.mpsagent import agent as agent_module
from dra_driver.mpsagent.agent_state import load_state, save_state, state_path
from dra_driver.mpsagent.client import MpsAgentClient, MpsAgentError
from dra_driver.mpsagent.commands import namespace_name
from dra_driver.mpsagent.protocol import ShareInfo
from tests.support.eventually import eventually
from tests.support.mps import GIB, GPU0, Node, agent_running, cleanup, daemon_pid, make_node

COMMAND_S = 0.3
WAVE = 5


def slow(protocol: str) -> Node:
    node = make_node(protocol)
    env = {**(node.config.daemon_env or {}), DELAY_ENV: str(COMMAND_S)}
    return dataclasses.replace(node, config=dataclasses.replace(node.config, daemon_env=env))


@pytest.fixture
def slow_v3() -> Iterator[Node]:
    made = slow("v3")
    yield made
    cleanup(made)


@pytest.fixture
def slow_legacy() -> Iterator[Node]:
    made = slow("legacy")
    yield made
    cleanup(made)


def spans(node: Node, gpu: str, *, since: float = 0.0) -> list[dict[str, Any]]:
    """The fake daemon's accepted commands since ``since``, each with its busy span."""
    return [
        {**r, "span": (r["busy_since"], r["t"])}
        for r in node.records(gpu)
        if r.get("ok") and r.get("busy_since", 0) >= since
    ]


def most_at_once(records: list[dict[str, Any]]) -> int:
    """The most of ``records`` the daemon was busy with at one moment."""
    edges = sorted(
        [(r["span"][0], 1) for r in records] + [(r["span"][1], -1) for r in records]
    )  # an end sorts before a start at the same instant
    busy = most = 0
    for _, step in edges:
        busy += step
        most = max(most, busy)
    return most


def of_namespace(records: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    return [r for r in records if namespace in (r.get("argv") or [])]


def held(node: Node, gpu: str) -> dict[str, tuple[str | None, int | None]]:
    spaces = node.fake_state(gpu)["servers"]["shares"]["namespaces"]
    return {
        name: (lim.get("pinned_memory_limit"), lim.get("active_thread_percentage"))
        for name, lim in spaces.items()
    }


def recorded(node: Node) -> set[str]:
    return {s.share_id for s in load_state(state_path(node.config.state_dir))}


async def ensure(client: MpsAgentClient, name: str, gib: int = 1, pct: int = 20) -> ShareInfo:
    return await client.ensure_share(
        GPU0, name, claim_uid=f"claim-{name}", memory_limit_bytes=gib * GIB,
        active_thread_percentage=pct,
    )  # fmt: skip


def wall(node: Node) -> float:
    """The newest record's time: later commands are the ones a step below sent."""
    return float(max(r["t"] for r in node.records(GPU0)))


def test_shares_of_different_claims_on_one_gpu_prepare_at_once(slow_v3: Node) -> None:
    """One after another, the wave's ``namespace set`` commands never overlap; side
    by side, most of them do. Each share's own commands stay in order."""
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")  # the daemon up
            since = wall(node)
            names = [f"share-{i}" for i in range(WAVE)]
            infos = await asyncio.gather(*(ensure(client, n) for n in names))
            assert {i.share_id for i in infos} == set(names)
            records = spans(node, GPU0, since=since)
            sets = [r for r in records if r["argv"][:2] == ["namespace", "set"]]
            assert len(sets) == WAVE
            assert most_at_once(sets) >= 3, [r["span"] for r in sets]
            for name in names:  # create, then set: never the set first or beside
                create, limit = of_namespace(records, namespace_name(name))
                assert create["argv"][:2] == ["namespace", "create"]
                assert create["span"][1] <= limit["span"][0]
            assert set(held(node, GPU0)) == {namespace_name(n) for n in ["resident", *names]}
            assert recorded(node) == {"resident", *names}  # every share in the file

            since = wall(node)
            gone = await asyncio.gather(*(client.release_share(GPU0, n) for n in names))
            assert gone == [True] * WAVE
            assert recorded(node) == {"resident"}  # answered once the file is written
            await eventually(  # the deletes follow the answers (recorded once done)
                lambda: len(spans(node, GPU0, since=since)) == WAVE, "the deletes"
            )
            assert set(held(node, GPU0)) == {namespace_name("resident")}
            deletes = spans(node, GPU0, since=since)
            assert most_at_once(deletes) >= 3, [r["span"] for r in deletes]

    asyncio.run(scenario())


def test_two_ensures_of_one_share_never_interleave(slow_v3: Node) -> None:
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")
            since = wall(node)
            first, second = await asyncio.gather(
                ensure(client, "twice", gib=2, pct=30), ensure(client, "twice", gib=3, pct=40)
            )
            assert first.share_id == second.share_id == "twice"
            mine = of_namespace(spans(node, GPU0, since=since), namespace_name("twice"))
            # create + set, then set: one command at a time, in that order, and none
            # refused (a create beside the other's would find the namespace there).
            sent = [r for r in node.records(GPU0) if r["t"] > since]
            assert len(of_namespace(sent, namespace_name("twice"))) == 3
            assert [r["argv"][:2] for r in mine] == [
                ["namespace", "create"],
                ["namespace", "set"],
                ["namespace", "set"],
            ]
            assert most_at_once(mine) == 1
            # The daemon holds what the later of the two sent, one of the two asked.
            last = mine[-1]["argv"]
            limits = (last[4].split("=")[1], int(last[5].split("=")[1]))
            assert limits in {("2048M", 30), ("3072M", 40)}
            assert held(node, GPU0)[namespace_name("twice")] == limits

    asyncio.run(scenario())


def test_a_release_waits_for_the_ensure_of_its_share(slow_v3: Node) -> None:
    """Asked while the share's create is running, the release finds the share (it
    waited) and removes it: no namespace and no record left behind."""
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")
            creating = asyncio.create_task(ensure(client, "raced"))
            # The daemon holds the namespace while its create's delay runs: mid-ensure.
            await eventually(lambda: namespace_name("raced") in held(node, GPU0), "the create")
            assert not creating.done()
            released = await client.release_share(GPU0, "raced")
            assert (await creating).share_id == "raced"
            assert released is True
            assert recorded(node) == {"resident"}
            await eventually(lambda: namespace_name("raced") not in held(node, GPU0), "delete")
            assert {s.share_id for s in await client.list_shares()} == {"resident"}

    asyncio.run(scenario())


def test_the_last_share_released_during_another_ensure_keeps_the_daemon(slow_v3: Node) -> None:
    """The release of the GPU's only recorded share stops the daemon, unless a share
    ensured meanwhile needs it: counted once the ensure has finished."""
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "old")
            pid = await daemon_pid(client, GPU0)
            creating = asyncio.create_task(ensure(client, "new"))
            await eventually(lambda: namespace_name("new") in held(node, GPU0), "the create")
            assert not creating.done()
            assert await client.release_share(GPU0, "old") is True
            await creating
            assert await daemon_pid(client, GPU0) == pid
            assert set(held(node, GPU0)) == {namespace_name("new")}
            assert recorded(node) == {"new"}

    asyncio.run(scenario())


def test_a_daemon_killed_mid_wave_comes_back_with_every_ensured_share(slow_v3: Node) -> None:
    """Every share whose ensure answered is held by the restarted daemon and is in the
    state file; an ensure the death cut short fails and, retried, succeeds."""
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")
            old = await daemon_pid(client, GPU0)
            assert old is not None
            names = [f"share-{i}" for i in range(WAVE)]

            async def later(i: int, name: str) -> ShareInfo:
                await asyncio.sleep(i * COMMAND_S / 2)
                return await ensure(client, name)

            wave = asyncio.gather(
                *(later(i, n) for i, n in enumerate(names)), return_exceptions=True
            )
            # Some shares answered by now, some mid-command, some not yet asked for.
            await asyncio.sleep(COMMAND_S * 2.5)
            os.kill(old, signal.SIGKILL)
            results = await wave
            failed = [n for n, r in zip(names, results, strict=True) if isinstance(r, Exception)]
            for result in results:
                assert not isinstance(result, Exception) or isinstance(result, MpsAgentError)

            async def restarted() -> bool:
                status = (await client.status()).daemons[0]
                return status.running and status.pid != old

            await eventually(restarted, "the daemon restarted", timeout=30)
            ensured = {"resident", *(n for n in names if n not in failed)}
            await eventually(
                lambda: {namespace_name(n) for n in ensured} <= set(held(node, GPU0)),
                "every ensured share restored",
                timeout=30,
            )
            assert recorded(node) == ensured
            for name in failed:
                await ensure(client, name)
            assert set(held(node, GPU0)) == {namespace_name(n) for n in ["resident", *names]}
            assert recorded(node) == {"resident", *names}

    asyncio.run(scenario())


def test_legacy_changes_stay_one_at_a_time(slow_legacy: Node) -> None:
    """A legacy change re-sends every share's limits: two at once could leave the
    defaults without the larger share's. Each wave's commands never overlap."""
    node = slow_legacy

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")
            since = wall(node)
            sizes = {f"share-{i}": i + 1 for i in range(3)}
            await asyncio.gather(*(ensure(client, n, gib=g) for n, g in sizes.items()))
            assert most_at_once(spans(node, GPU0, since=since)) == 1
            default = node.fake_state(GPU0)["legacy"]["default_mem"][GPU0]
            assert default == f"{max(sizes.values()) * 1024}M"
            assert recorded(node) == {"resident", *sizes}

    asyncio.run(scenario())


def test_one_at_a_time_each_change_is_written_and_a_wave_of_releases_shares_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ensure alone has its own write, made before its answer; a wave of releases
    (no command of theirs runs before the answer) shares writes rather than each
    writing the whole file."""
    node = make_node("v3")
    writes: list[set[str]] = []

    def counted(path: str, protocol: Any, shares: Any, encoder: Any = None) -> None:
        shares = list(shares)
        writes.append({s.share_id for s in shares})
        save_state(path, protocol, shares, encoder)

    monkeypatch.setattr(agent_module, "save_state", counted)

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            names = [f"share-{i}" for i in range(8)]
            await ensure(client, "resident")
            before = len(writes)
            for name in names:
                await ensure(client, name)
                assert name in writes[-1] and recorded(node) >= {name}
            assert len(writes) - before == len(names)
            before = len(writes)
            gone = await asyncio.gather(*(client.release_share(GPU0, n) for n in names))
            assert gone == [True] * len(names)
            assert recorded(node) == {"resident"}
            assert len(writes) - before < len(names) // 2, writes[before:]

    try:
        asyncio.run(scenario())
    finally:
        cleanup(node)
