"""A v3 release answers once the state file no longer holds the share; the
namespace's ``namespace delete`` follows the answer (``MpsAgent._delete_namespace``).

The real agent on its socket, the fake ``nvidia-cuda-mps-control`` as real processes;
order is read from the fake daemon's own record of each command's busy span, not from
wall-clock bounds. A delete the daemon refuses comes from a wrapper of the control
binary that fails ``namespace delete`` while a flag file exists.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.fakes.mps_control import DELAY_ENV
from dra_driver.mpsagent import agent as agent_module
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.commands import namespace_name
from dra_driver.mpsagent.protocol import DaemonStatus
from tests.support.eventually import eventually
from tests.support.mps import (
    GIB,
    GPU0,
    Node,
    agent_running,
    cleanup,
    make_node,
    refusing,
    with_env,
)

COMMAND_S = 0.3


@pytest.fixture
def slow_v3() -> Iterator[Node]:
    made = with_env(make_node("v3"), **{DELAY_ENV: str(COMMAND_S)})
    yield made
    cleanup(made)


@pytest.fixture
def refusing_v3() -> Iterator[tuple[Node, str]]:
    """A v3 node whose control binary refuses ``namespace delete`` while the returned
    flag file exists (created here)."""
    made = make_node("v3")
    flag = os.path.join(made.root, "refuse-deletes")
    open(flag, "w").close()
    made = refusing(made, "delete", flag)
    yield made, flag
    cleanup(made)


async def ensure(client: MpsAgentClient, name: str, gib: int = 1, pct: int = 20) -> None:
    await client.ensure_share(
        GPU0, name, claim_uid=f"claim-{name}", memory_limit_bytes=gib * GIB,
        active_thread_percentage=pct,
    )  # fmt: skip


async def ensured_then_released(client: MpsAgentClient, name: str) -> None:
    """A resident share keeps the daemon up; ``name`` (1 GiB, 20%) is ensured and
    released: its namespace's delete is then pending."""
    await ensure(client, "resident")
    await ensure(client, name)
    assert await client.release_share(GPU0, name) is True


def held(node: Node) -> dict[str, tuple[str | None, int | None]]:
    spaces = node.fake_state(GPU0)["servers"]["shares"]["namespaces"]
    return {
        name: (lim.get("pinned_memory_limit"), lim.get("active_thread_percentage"))
        for name, lim in spaces.items()
    }


def commands_of(node: Node, name: str, verb: str) -> list[dict[str, Any]]:
    return [
        r
        for r in node.records(GPU0)
        if r.get("ok") and (r.get("argv") or [])[:3] == ["namespace", verb, namespace_name(name)]
    ]


async def gpu_status(client: MpsAgentClient) -> DaemonStatus:
    return next(d for d in (await client.status()).daemons if d.gpu_uuid == GPU0)


def test_a_release_answers_before_its_namespace_delete_ends(slow_v3: Node) -> None:
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensured_then_released(client, "done")
            answered = time.time()
            assert {s.share_id for s in await client.list_shares()} == {"resident"}
            await eventually(lambda: commands_of(node, "done", "delete"), "the delete")
            (delete,) = commands_of(node, "done", "delete")
            # The daemon was still busy with the delete when the release answered.
            assert float(delete["t"]) > answered, (delete, answered)
            assert namespace_name("done") not in held(node)
            await eventually(lambda: _deleting_is(client, 0), "no namespace left to delete")

    asyncio.run(scenario())


async def _deleting_is(client: MpsAgentClient, count: int) -> bool:
    return (await gpu_status(client)).namespaces_deleting == count


def sent_for(node: Node, name: str) -> list[dict[str, Any]]:
    return [r for r in node.records(GPU0) if namespace_name(name) in (r.get("argv") or [])]


def test_an_ensure_of_a_share_being_deleted_waits_for_the_delete(slow_v3: Node) -> None:
    """Ensured again while its delete runs, the share's namespace is deleted first,
    then created with the new limits: never deleted under the new share."""
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensured_then_released(client, "again")
            # The fake daemon drops the namespace, then takes COMMAND_S: mid-delete.
            await eventually(lambda: namespace_name("again") not in held(node), "the delete")
            await ensure(client, "again", gib=2, pct=30)
            assert held(node)[namespace_name("again")] == ("2048M", 30)
            sent = sent_for(node, "again")
            assert all(r["ok"] for r in sent), sent  # no set of a namespace mid-delete
            (delete,) = commands_of(node, "again", "delete")
            creates = commands_of(node, "again", "create")
            assert len(creates) == 2
            assert float(delete["t"]) <= float(creates[1]["busy_since"])
            assert (await gpu_status(client)).namespaces_deleting == 0

    asyncio.run(scenario())


def test_a_share_ensured_again_before_its_delete_ran_keeps_its_namespace(
    slow_v3: Node,
) -> None:
    """The delete waits until no ensure or release has run for a moment (the plugin's
    calls come in waves); ensured again before that, the share keeps its namespace,
    with the new limits, and no delete is sent."""
    node = slow_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensured_then_released(client, "back")
            await ensure(client, "back", gib=2, pct=30)
            assert (await gpu_status(client)).namespaces_deleting == 0
            await asyncio.sleep(3 * agent_module.DELETE_IDLE_S)
            assert held(node)[namespace_name("back")] == ("2048M", 30)
            verbs = [r["argv"][1] for r in sent_for(node, "back")]
            assert verbs == ["create", "set", "set"], verbs

    asyncio.run(scenario())


def test_the_deletes_wait_for_a_wave_of_releases_to_end(
    slow_v3: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Releases that follow each other closely are all answered before any delete
    starts: the deletes' processes do not take the cores from the calls. (A quiet
    spell of 1 s here, not 0.1: a loaded machine must not split the wave.)"""
    node = slow_v3
    monkeypatch.setattr(agent_module, "DELETE_IDLE_S", 1.0)
    monkeypatch.setattr(agent_module, "DELETE_IDLE_MAX_WAIT_S", 20.0)

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensure(client, "resident")
            names = [f"w{i}" for i in range(4)]
            for name in names:
                await ensure(client, name)
            answered = []
            for name in names:  # one after another, as a kubelet tearing pods down
                assert await client.release_share(GPU0, name) is True
                answered.append(time.time())
            await eventually(lambda: _deleting_is(client, 0), "the deletes")
            starts = [float(commands_of(node, n, "delete")[0]["busy_since"]) for n in names]
            assert min(starts) > max(answered), (starts, answered)

    asyncio.run(scenario())


def test_a_refused_delete_is_logged_counted_and_retried(
    refusing_v3: tuple[Node, str], caplog: pytest.LogCaptureFixture
) -> None:
    node, flag = refusing_v3
    caplog.set_level(logging.ERROR, logger="dra_driver.mpsagent.agent")

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensured_then_released(client, "stuck")
            await eventually(lambda: _failures_at_least(client, 2), "two refused tries", timeout=15)
            status = await gpu_status(client)
            assert status.namespaces_deleting == 1
            assert namespace_name("stuck") in held(node)
            assert "namespace delete refused (test)" in caplog.text
            assert "retrying in" in caplog.text
            os.unlink(flag)
            await eventually(
                lambda: namespace_name("stuck") not in held(node), "the retried delete", timeout=15
            )
            await eventually(lambda: _deleting_is(client, 0), "no namespace left to delete")

    asyncio.run(scenario())


async def _failures_at_least(client: MpsAgentClient, count: int) -> bool:
    return (await gpu_status(client)).namespace_delete_failures >= count


def test_a_share_wanted_again_stops_the_retries_and_keeps_its_namespace(
    refusing_v3: tuple[Node, str],
) -> None:
    """The delete keeps failing; the share is ensured again: the namespace it finds
    gets the new limits and no later try deletes it."""
    node, _flag = refusing_v3

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            await ensured_then_released(client, "back")
            await eventually(lambda: _failures_at_least(client, 1), "a refused try")
            await ensure(client, "back", gib=3, pct=40)
            assert (await gpu_status(client)).namespaces_deleting == 0
            failures = (await gpu_status(client)).namespace_delete_failures
            await asyncio.sleep(1.2)  # past the next retry's time (0.5 s, then 1 s)
            assert (await gpu_status(client)).namespace_delete_failures == failures
            assert held(node)[namespace_name("back")] == ("3072M", 40)

    asyncio.run(scenario())
