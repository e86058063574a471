"""One namespace per legacy MPS daemon (issue 33): the mps-agent's own guard.

Every client of a legacy daemon (a MIG instance's daemon is always legacy) gets the
daemon's ``control`` socket and ``/dev/shm``, so a tenant could quit the daemon,
change or read the other clients' limits and work. The agent therefore refuses a
share of a second Kubernetes namespace on such a daemon unless the GPU opts in
(``tenancy: cooperative``), naming both namespaces and the fixes; an MPS v3 daemon,
whose clients each reach only their own namespace directory, takes any namespace's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dra_driver.base.errors import MpsAgentError as AgentError
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.protocol import ShareInfo
from tests.support.mps import GIB, GPU0, Node, agent_running

MIG0 = "MIG-00000000-aaaa-bbbb-cccc-444444444444"


async def _ensure(
    node: Node, daemon: str, share: str, tenant: str, *, cooperative: bool = False
) -> ShareInfo:
    return await node.client().ensure_share(
        daemon,
        share,
        claim_uid=f"claim-{share}",
        memory_limit_bytes=GIB,
        active_thread_percentage=30,
        tenant=tenant,
        cooperative=cooperative,
    )


@pytest.mark.parametrize("daemon", [GPU0, MIG0], ids=["legacy-gpu", "mig-instance"])
def test_a_legacy_daemon_serves_one_namespace(legacy_node: Node, daemon: str) -> None:
    async def scenario() -> None:
        async with agent_running(legacy_node.config):
            await _ensure(legacy_node, daemon, "a1", "team-a")
            await _ensure(legacy_node, daemon, "a2", "team-a")  # same tenant: shares it
            with pytest.raises(AgentError) as refused:
                await _ensure(legacy_node, daemon, "b1", "team-b")
            message = str(refused.value)
            assert "serves claims of namespace team-a" in message, message
            assert "of namespace team-b" in message and "tenancy: cooperative" in message
            assert {s.share_id for s in await legacy_node.client().list_shares()} == {
                "a1",
                "a2",
            }
            # Once team-a's shares are gone the daemon is free for another namespace.
            for share in ("a1", "a2"):
                assert await legacy_node.client().release_share(daemon, share)
            info = await _ensure(legacy_node, daemon, "b1", "team-b")
            assert info.tenant == "team-b"

    asyncio.run(scenario())


def test_the_cooperative_opt_in_shares_a_legacy_daemon(legacy_node: Node) -> None:
    async def scenario() -> None:
        async with agent_running(legacy_node.config):
            await _ensure(legacy_node, GPU0, "a1", "team-a", cooperative=True)
            await _ensure(legacy_node, GPU0, "b1", "team-b", cooperative=True)
            shares = await legacy_node.client().list_shares()
            assert {(s.share_id, s.tenant) for s in shares} == {
                ("a1", "team-a"),
                ("b1", "team-b"),
            }
            # A share without the opt-in never joins a daemon already serving strangers.
            with pytest.raises(AgentError, match="serves claims of namespace"):
                await _ensure(legacy_node, GPU0, "c1", "team-c")

    asyncio.run(scenario())


def test_a_v3_daemon_keeps_tenants_apart_and_takes_any_namespace(v3_node: Node) -> None:
    async def scenario() -> None:
        async with agent_running(v3_node.config):
            a = await _ensure(v3_node, GPU0, "a1", "team-a")
            b = await _ensure(v3_node, GPU0, "b1", "team-b")
            assert a.protocol == b.protocol == "v3"
            assert a.pipe_dir != b.pipe_dir  # each its own namespace directory

    asyncio.run(scenario())


def test_the_tenant_survives_an_agent_restart(legacy_node: Node) -> None:
    """The record keeps the tenant, so a restarted agent still refuses a stranger."""

    async def scenario() -> None:
        async with agent_running(legacy_node.config):
            await _ensure(legacy_node, GPU0, "a1", "team-a")
        async with agent_running(legacy_node.config):
            (share,) = await legacy_node.client().list_shares()
            assert share.tenant == "team-a"
            with pytest.raises(AgentError, match="serves claims of namespace team-a"):
                await _ensure(legacy_node, GPU0, "b1", "team-b")

    asyncio.run(scenario())


def test_an_agent_older_than_the_rule_gets_a_refusal_that_names_the_fix(tmp_path: Path) -> None:
    """An mps-agent is rolled only by hand (OnDelete): until then it refuses the tenant
    field, and the plugin's error says how to roll it."""
    socket_path = str(tmp_path / "old-agent.sock")

    async def old_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(
            wire.encode_error(
                "invalid_request",
                "ensure_share args: unknown field(s) ['tenant']; allowed: active_thread_"
                "percentage, claim_uid, gpu_uuid, memory_limit_bytes, share_id, uid",
            )
        )
        await writer.drain()
        writer.close()

    async def scenario() -> str:
        server = await asyncio.start_unix_server(old_agent, socket_path)
        async with server:
            with pytest.raises(AgentError) as refused:
                await MpsAgentClient(socket_path).ensure_share(
                    GPU0, "a1", claim_uid="c", memory_limit_bytes=GIB,
                    active_thread_percentage=30, tenant="team-a",
                )  # fmt: skip
        return str(refused.value)

    message = asyncio.run(scenario())
    assert "unknown field(s) ['tenant']" in message
    assert "older than the kubelet plugin" in message and "kubectl delete pod" in message
