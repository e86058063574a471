"""Spare MPS v3 namespaces: made ahead of the shares when the calls pause, so a new
share's ensure sends ``namespace set`` alone, or nothing when the spare's limits were
set ahead to what it asks for (``MpsAgent._refill_spares``, ``DaemonShares.add_spare``).

The real agent on its socket, the fake ``nvidia-cuda-mps-control`` as real processes;
what the agent sent is read from the fake daemon's own record of each command.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.commands import namespace_name
from dra_driver.mpsagent.layout import is_short_namespace
from dra_driver.mpsagent.protocol import DaemonStatus
from tests.support.eventually import eventually
from tests.support.mps import GIB, GPU0, Node, agent_running, cleanup, make_node, refusing

SPARES = 2


def with_spares(node: Node, spares: int = SPARES, **env: str) -> Node:
    config = dataclasses.replace(
        node.config,
        spare_namespaces=spares,
        daemon_env={**(node.config.daemon_env or {}), **env},
    )
    return dataclasses.replace(node, config=config)


@pytest.fixture
def v3() -> Iterator[Node]:
    made = with_spares(make_node("v3"))
    yield made
    cleanup(made)


@pytest.fixture
def refusing_creates() -> Iterator[tuple[Node, str]]:
    """A v3 node whose control binary refuses ``namespace create`` while the returned
    flag file exists (not yet created)."""
    made = make_node("v3")
    flag = os.path.join(made.root, "refuse-creates")
    made = with_spares(refusing(made, "create", flag))
    yield made, flag
    cleanup(made)


async def ensure(client: MpsAgentClient, name: str, gib: int = 1, pct: int = 20) -> str:
    """Ensure share ``name``; its namespace."""
    share = await client.ensure_share(
        GPU0, name, claim_uid=f"claim-{name}", memory_limit_bytes=gib * GIB,
        active_thread_percentage=pct,
    )  # fmt: skip
    assert share.namespace is not None
    assert share.pipe_dir.endswith("/" + share.namespace)
    return share.namespace


async def gpu_status(client: MpsAgentClient) -> DaemonStatus:
    return next(d for d in (await client.status()).daemons if d.gpu_uuid == GPU0)


async def spares_are(client: MpsAgentClient, count: int) -> bool:
    return (await gpu_status(client)).spare_namespaces == count


def held(node: Node) -> dict[str, dict[str, Any]]:
    namespaces: dict[str, dict[str, Any]] = node.fake_state(GPU0)["servers"]["shares"]["namespaces"]
    return namespaces


def commands(node: Node, verb: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """The daemon's record of the ``namespace <verb>`` commands that worked."""
    return [
        r
        for r in node.records(GPU0)
        if r.get("ok")
        and (r.get("argv") or [])[:2] == ["namespace", verb]
        and (namespace is None or r["argv"][2] == namespace)
    ]


def test_a_new_share_takes_a_spare_and_only_its_limits_are_set(v3: Node) -> None:
    node = v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            # The first share starts the daemon and creates its own namespace.
            assert await ensure(client, "first") == namespace_name("first")
            await eventually(lambda: spares_are(client, SPARES), "the spares made")
            spares = set(held(node)) - {namespace_name("first")}
            assert len(spares) == SPARES
            assert all(is_short_namespace(name) for name in spares)
            # Made ahead with the first share's limits (no container is given their
            # directory until a share holds one).
            assert all(held(node)[name] == {"pinned_memory_limit": "1024M",
                                            "active_thread_percentage": 20}
                       for name in spares), held(node)  # fmt: skip
            sent_before = len(node.records(GPU0))

            # Another size: the share sets its own limits.
            taken = await ensure(client, "second", gib=3, pct=30)

            assert taken in spares
            sent = [r["argv"][:2] for r in node.records(GPU0)[sent_before:]]
            assert sent[0] == ["namespace", "set"], sent
            assert held(node)[taken]["active_thread_percentage"] == 30
            assert os.path.isdir(next(s.pipe_dir for s in await client.list_shares()
                                      if s.share_id == "second"))  # fmt: skip
            # Taken spares are made again, when the calls pause.
            await eventually(lambda: spares_are(client, SPARES), "the spare made again")
            assert len(held(node)) == 2 + SPARES

    asyncio.run(scenario())


def test_a_share_of_the_last_shares_size_takes_a_spare_set_ahead_and_sends_nothing(
    v3: Node,
) -> None:
    node = v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "first", gib=4, pct=25)
            await eventually(lambda: spares_are(client, SPARES), "the spares made")
            sent_before = len(node.records(GPU0))

            taken = await ensure(client, "replica", gib=4, pct=25)

            assert node.records(GPU0)[sent_before:] == [], "a command on the prepare's path"
            assert is_short_namespace(taken)
            assert held(node)[taken] == {"pinned_memory_limit": "4096M",
                                         "active_thread_percentage": 25}  # fmt: skip
            share = next(s for s in await client.list_shares() if s.share_id == "replica")
            assert share.namespace == taken and os.path.isdir(share.pipe_dir)
            # The spare taken is made again, its limits set again, when the calls pause.
            await eventually(lambda: spares_are(client, SPARES), "the spare made again")
            again = commands(node, "set")[-1]
            assert again["argv"][2] not in (taken, namespace_name("first"))
            assert again["argv"][4:] == ["--pinned-memory-limit=4096M",
                                         "--active-thread-percentage=25"]  # fmt: skip

    asyncio.run(scenario())


def test_a_spare_whose_limits_are_refused_stays_bare_and_its_share_sets_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    made = make_node("v3")
    flag = os.path.join(made.root, "refuse-sets")
    node = with_spares(refusing(made, "set", flag))

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "first", gib=2, pct=30)
            open(flag, "w").close()  # from now on the daemon refuses every set
            await eventually(lambda: _failures_at_least(client, 1), "a spare's limits refused")
            await eventually(lambda: spares_are(client, SPARES), "the spares made, bare")
            spares = set(held(node)) - {namespace_name("first")}
            assert all(held(node)[name] == {} for name in spares), held(node)
            os.remove(flag)
            sent_before = len(node.records(GPU0))

            taken = await ensure(client, "replica", gib=2, pct=30)

            assert taken in spares
            sent = [r["argv"][:3] for r in node.records(GPU0)[sent_before:] if "argv" in r]
            assert sent == [["namespace", "set", taken]], sent
            assert held(node)[taken] == {"pinned_memory_limit": "2048M",
                                         "active_thread_percentage": 30}  # fmt: skip

    try:
        with caplog.at_level(logging.ERROR, logger="dra_driver.mpsagent.agent"):
            asyncio.run(scenario())
    finally:
        cleanup(node)
    assert any(
        "or its limits not set ahead" in r.getMessage()
        and "namespace set refused (test)" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


def test_spares_are_made_only_once_the_calls_pause(v3: Node) -> None:
    node = v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "first")  # starts the daemon: spares wanted from now
            await asyncio.gather(*(ensure(client, f"wave-{i}") for i in range(4)))
            answered = time.time()
            await eventually(lambda: spares_are(client, SPARES), "the spares made")
            first = namespace_name("first")
            creates = [r for r in commands(node, "create") if r["argv"][2] != first]
            made = [r for r in creates if r["argv"][2] not in {
                namespace_name(f"wave-{i}") for i in range(4)}]  # fmt: skip
            assert len(made) == SPARES, creates
            # Each after the wave's answers, the quiet spell (0.1 s) later.
            assert all(float(r["t"]) >= answered + 0.05 for r in made), (made, answered)

    asyncio.run(scenario())


def test_a_share_keeps_the_spare_it_took_across_an_agent_restart(v3: Node) -> None:
    node = v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "first")
            await eventually(lambda: spares_are(client, SPARES), "the spares made")
            taken = await ensure(client, "second", gib=2, pct=40)
            assert taken != namespace_name("second")
        # The agent stopped its daemons; the next one restores the recorded shares.
        async with agent_running(node.config):
            client = node.client()
            shares = {s.share_id: s for s in await client.list_shares()}
            assert shares["second"].namespace == taken
            await eventually(lambda: spares_are(client, SPARES), "spares made for the new daemon")
            assert held(node)[taken]["active_thread_percentage"] == 40
            # The same share ensured again (a plugin's retry) keeps its namespace.
            assert await ensure(client, "second", gib=2, pct=40) == taken

    asyncio.run(scenario())


def test_a_share_ensured_again_before_its_delete_keeps_its_namespace(v3: Node) -> None:
    node = v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")
            await eventually(lambda: spares_are(client, SPARES), "the spares made")
            taken = await ensure(client, "again")
            assert await client.release_share(GPU0, "again") is True
            # Its delete waits for the calls to pause; the share is wanted again first.
            assert await ensure(client, "again", gib=2, pct=50) == taken
            await eventually(lambda: spares_are(client, SPARES), "the spare made again")
            await asyncio.sleep(0.3)  # a delete, had one been left, would have run
            assert commands(node, "delete", taken) == []
            assert held(node)[taken]["active_thread_percentage"] == 50

    asyncio.run(scenario())


def test_a_refused_spare_is_logged_counted_and_tried_again(
    refusing_creates: tuple[Node, str], caplog: pytest.LogCaptureFixture
) -> None:
    node, flag = refusing_creates

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "first")
            open(flag, "w").close()
            await eventually(lambda: _failures_at_least(client, 1), "a spare refused and counted")
            status = await gpu_status(client)
            assert status.spare_namespaces == 0
            # A new share meanwhile creates its own namespace, as with no spares.
            os.remove(flag)
            assert await ensure(client, "second") == namespace_name("second")
            await eventually(lambda: spares_are(client, SPARES), "the spares made at last")

    with caplog.at_level(logging.ERROR, logger="dra_driver.mpsagent.agent"):
        asyncio.run(scenario())
    assert any(
        "spare MPS namespace was not made" in r.getMessage()
        and "namespace create refused (test)" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]


async def _failures_at_least(client: MpsAgentClient, count: int) -> bool:
    return (await gpu_status(client)).spare_namespace_failures >= count


def test_legacy_daemons_and_zero_spares_make_none() -> None:
    legacy = with_spares(make_node("legacy"))
    none = with_spares(make_node("v3"), spares=0)

    async def scenario(node: Node) -> None:
        async with agent_running(node.config):
            client = node.client()
            await client.ensure_share(
                GPU0, "only", claim_uid="claim-only", memory_limit_bytes=GIB,
                active_thread_percentage=20,
            )  # fmt: skip
            await asyncio.sleep(0.4)  # past the quiet spell spares would wait for
            assert (await gpu_status(client)).spare_namespaces == 0

    try:
        asyncio.run(scenario(legacy))
        asyncio.run(scenario(none))
        assert [r["argv"][2] for r in commands(none, "create")] == [namespace_name("only")]
    finally:
        cleanup(legacy)
        cleanup(none)
