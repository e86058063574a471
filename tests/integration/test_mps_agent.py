"""The mps-agent for real: its unix socket, the fake ``nvidia-cuda-mps-control`` as
real processes (daemon and commands), state in real files.

The fake keeps its state (servers, namespaces, limits) in the daemon's pipe
directory and records every command in the log directory; the tests read both.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import stat
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.client import MpsAgentClient, MpsAgentError, MpsAgentUnavailableError
from dra_driver.mpsagent.commands import namespace_name, share_cdi_edits
from dra_driver.mpsagent.procs import alive
from tests.support.eventually import eventually
from tests.support.mps import (
    GIB,
    GPU0,
    GPU1,
    Node,
    agent_running,
    cleanup,
    daemon_pid,
    gpu_dir,
    make_node,
)


@pytest.fixture(params=["v3", "legacy"])
def node(request: pytest.FixtureRequest) -> Iterator[Node]:
    made = make_node(request.param)
    yield made
    cleanup(made)


def held_limits(node: Node, gpu: str) -> dict[str, Any]:
    """What the fake daemon holds: v3 namespaces, or legacy defaults."""
    state = node.fake_state(gpu)
    if state["protocol"] == 3:
        return {
            name: (lim.get("pinned_memory_limit"), lim.get("active_thread_percentage"))
            for name, lim in state["servers"]["shares"]["namespaces"].items()
        }
    legacy = state["legacy"]
    return {"default": (legacy["default_mem"].get(gpu), legacy["default_pct"])}


# -- the share lifecycle --------------------------------------------------------------


def test_v3_daemon_and_namespaces_follow_the_shares(v3_node: Node) -> None:
    node = v3_node

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            a = await client.ensure_share(
                GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=10 * GIB,
                active_thread_percentage=25,
            )  # fmt: skip
            ns_a = namespace_name("share-a")
            assert a.protocol == "v3" and a.namespace == ns_a
            assert a.pipe_dir == os.path.join(
                gpu_dir(node.config.state_dir, GPU0), "pipe", "shares", ns_a
            )
            assert os.path.isdir(a.pipe_dir) and os.path.isdir(a.shm_dir)
            state = node.fake_state(GPU0)
            assert (state["protocol"], state["multiuser"]) == (3, True)
            assert state["visible_devices"] == GPU0  # only its GPU
            assert held_limits(node, GPU0) == {ns_a: ("10240M", 25)}
            assert node.modes.modes[GPU0] == "EXCLUSIVE_PROCESS"
            pid = await daemon_pid(client, GPU0)
            assert pid is not None and alive(pid)
            edits = share_cdi_edits(a)
            # The pipe directory at its host path (finding 8), within the socket limit.
            assert edits.env == (f"CUDA_MPS_PIPE_DIRECTORY={a.pipe_dir}",)
            # Only the namespace's directory: the container keeps its own /dev/shm
            # (issue 33: no shared memory across claims).
            assert [(m.host_path, m.container_path) for m in edits.mounts] == [
                (a.pipe_dir, a.pipe_dir),
            ]
            assert stat.S_ISSOCK(os.lstat(os.path.join(a.pipe_dir, "control")).st_mode)

            b = await client.ensure_share(
                GPU0, "share-b", claim_uid="claim-b", memory_limit_bytes=2 * GIB,
                active_thread_percentage=50,
            )  # fmt: skip
            assert await daemon_pid(client, GPU0) == pid  # the same daemon
            assert held_limits(node, GPU0) == {ns_a: ("10240M", 25), b.namespace: ("2048M", 50)}
            # Repeating is idempotent; another claim cannot take the share.
            again = await client.ensure_share(
                GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=10 * GIB,
                active_thread_percentage=25,
            )  # fmt: skip
            assert again == a
            with pytest.raises(MpsAgentError, match="belongs to claim claim-a") as err:
                await client.ensure_share(
                    GPU0, "share-a", claim_uid="claim-x", memory_limit_bytes=GIB,
                    active_thread_percentage=25,
                )  # fmt: skip
            assert err.value.kind == "conflict"

            assert await client.release_share(GPU0, "share-a") is True
            # Its namespace's delete follows the answer (the claim's containers are gone).
            await eventually(
                lambda: held_limits(node, GPU0) == {b.namespace: ("2048M", 50)},
                "share-a's namespace deleted",
            )
            assert await daemon_pid(client, GPU0) == pid and alive(pid)

            assert await client.release_share(GPU0, "share-b") is True
            assert not alive(pid)
            assert await daemon_pid(client, GPU0) is None
            assert node.modes.modes[GPU0] == "DEFAULT"
            assert node.records(GPU0)[-2]["argv"] == ["-q"]
            assert node.records(GPU0)[-1]["event"] == "exit"
            assert await client.release_share(GPU0, "share-b") is False
            assert await client.list_shares() == []

    asyncio.run(scenario())


def test_legacy_daemon_defaults_are_the_largest_share(legacy_node: Node) -> None:
    node = legacy_node

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            a = await client.ensure_share(
                GPU1, "share-a", claim_uid="claim-a", memory_limit_bytes=4 * GIB,
                active_thread_percentage=25, uid=0,
            )  # fmt: skip
            assert a.protocol == "legacy" and a.namespace is None
            root = gpu_dir(node.config.state_dir, GPU1)
            assert a.pipe_dir == os.path.join(root, "pipe")
            assert node.fake_state(GPU1)["protocol"] == 2
            assert held_limits(node, GPU1) == {"default": ("4096M", 25)}
            assert share_cdi_edits(a).env == (
                f"CUDA_MPS_PIPE_DIRECTORY={a.pipe_dir}",
                f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU1}=4096M",
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
            )
            # A client has made the daemon start a server: later limits reach it too.
            proc = await asyncio.create_subprocess_exec(
                fake_control_path(), stdin=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHON": sys.executable,
                     "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
                     "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log")},
            )  # fmt: skip
            await proc.communicate(b"start_server -uid 0\n")
            assert proc.returncode == 0
            (server_pid,) = node.fake_state(GPU1)["legacy"]["servers"]

            pid = await daemon_pid(client, GPU1)
            await client.ensure_share(
                GPU1, "share-b", claim_uid="claim-b", memory_limit_bytes=2 * GIB,
                active_thread_percentage=60, uid=0,
            )  # fmt: skip
            assert await daemon_pid(client, GPU1) == pid
            assert held_limits(node, GPU1) == {"default": ("4096M", 60)}
            assert node.fake_state(GPU1)["legacy"]["servers"][server_pid]["pct"] == 60

            with pytest.raises(MpsAgentError, match="one UID at a time") as err:
                await client.ensure_share(
                    GPU1, "share-c", claim_uid="claim-c", memory_limit_bytes=GIB,
                    active_thread_percentage=10, uid=1000,
                )  # fmt: skip
            assert err.value.kind == "conflict"

            await client.release_share(GPU1, "share-a")
            assert held_limits(node, GPU1) == {"default": ("2048M", 60)}
            await client.release_share(GPU1, "share-b")
            assert pid is not None and not alive(pid)
            assert node.modes.history == [(GPU1, "EXCLUSIVE_PROCESS"), (GPU1, "DEFAULT")]

    asyncio.run(scenario())


# -- daemon death ---------------------------------------------------------------------


def test_killed_daemon_is_restarted_with_every_share_restored(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dra_driver.mpsagent")

    async def scenario() -> None:
        async with agent_running(node.config):
            client = node.client()
            for name, size, pct in (("share-a", 3 * GIB, 30), ("share-b", GIB, 20)):
                await client.ensure_share(
                    GPU0, name, claim_uid=f"claim-{name}", memory_limit_bytes=size,
                    active_thread_percentage=pct,
                )  # fmt: skip
            before = held_limits(node, GPU0)
            old = await daemon_pid(client, GPU0)
            assert old is not None
            os.kill(old, signal.SIGKILL)

            async def restarted() -> bool:
                status = await client.status()
                return status.daemons[0].restarts == 1 and status.daemons[0].running

            await eventually(restarted)
            new = await daemon_pid(client, GPU0)
            assert new is not None and new != old and alive(new)
            assert node.fake_state(GPU0)["daemon_pid"] == new
            assert held_limits(node, GPU0) == before  # re-created by the agent
            starts = [r for r in node.records(GPU0) if r.get("event") == "start"]
            assert [s["daemon_pid"] for s in starts] == [old, new]
            assert len(await client.list_shares()) == 2

    asyncio.run(scenario())
    lost = [r.getMessage() for r in caplog.records if "died unasked" in r.getMessage()]
    assert len(lost) == 1
    assert "share share-a (claim claim-share-a" in lost[0] and "3072M" in lost[0]
    assert "share share-b" in lost[0]


# -- the plugin going away, and the agent restarting ----------------------------------

PLUGIN = """
import socket, sys, time
from dra_driver.mpsagent import protocol as wire
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(wire.encode_request(wire.EnsureShare(sys.argv[2], "share-p", "claim-p", 1 << 30, 40)))
line = s.makefile("rb").readline()
print(line.decode().strip(), flush=True)
time.sleep(60)  # killed here, connection still open
"""


def test_plugin_killed_while_shares_live_leaves_daemon_and_clients_untouched(
    v3_node: Node,
) -> None:
    node = v3_node
    # The agent going away leaves the daemon running (as after an agent crash).
    live = replace(node.config, stop_daemons_on_exit=False)

    async def scenario() -> None:
        async with agent_running(live):
            plugin = await asyncio.create_subprocess_exec(
                sys.executable, "-c", PLUGIN, node.config.socket_path, GPU0,
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            assert plugin.stdout is not None
            reply = wire.parse_response(await plugin.stdout.readline())
            assert isinstance(reply, dict) and reply["share"]["share_id"] == "share-p"
            client = node.client()
            pid = await daemon_pid(client, GPU0)
            assert pid is not None
            plugin.send_signal(signal.SIGKILL)
            await plugin.wait()

            # A new plugin process (a new client) sees the live share; the daemon and
            # what it holds are untouched, and nothing but queries reached it.
            fresh = node.client()
            (share,) = await fresh.list_shares()
            assert (share.share_id, share.claim_uid) == ("share-p", "claim-p")
            assert await daemon_pid(fresh, GPU0) == pid and alive(pid)
            assert held_limits(node, GPU0) == {namespace_name("share-p"): ("1024M", 40)}
            assert not any(r.get("argv") == ["-q"] for r in node.records(GPU0))

        # The next agent adopts the running daemon and its recorded shares.
        assert alive(pid)
        async with agent_running(live):
            client = node.client()
            assert await daemon_pid(client, GPU0) == pid
            assert [s.share_id for s in await client.list_shares()] == ["share-p"]
            # ...and with the daemon gone too, the next agent re-creates it.
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: asyncio.sleep(0, result=not alive(pid)))
        async with agent_running(node.config):
            client = node.client()
            new = await daemon_pid(client, GPU0)
            assert new is not None and new != pid
            assert held_limits(node, GPU0) == {namespace_name("share-p"): ("1024M", 40)}

    asyncio.run(scenario())


# -- bad input, missing agent, failing daemon -----------------------------------------


def test_bad_requests_get_errors_and_the_agent_keeps_serving(v3_node: Node) -> None:
    node = v3_node

    async def scenario() -> None:
        async with agent_running(node.config):
            reader, writer = await asyncio.open_unix_connection(node.config.socket_path)
            answers = []
            for line in (
                b"garbage\n",
                b'{"v":1,"op":"explode"}\n',
                b'{"v":9,"op":"status"}\n',
                b'{"v":1,"op":"ensure_share","args":{"gpu_uuid":"GPU-1"}}\n',
                b'{"v":1,"op":"status"}\n',
            ):
                writer.write(line)
                await writer.drain()
                answers.append(wire.parse_response(await reader.readline()))
            kinds = [a.kind if isinstance(a, wire.ErrorReply) else "ok" for a in answers]
            assert kinds == [
                "invalid_request", "invalid_request", "unsupported_version",
                "invalid_request", "ok",
            ]  # fmt: skip
            writer.write(b"x" * (wire.MAX_LINE_BYTES + 10) + b"\n")
            await writer.drain()
            too_long = wire.parse_response(await reader.readline())
            assert isinstance(too_long, wire.ErrorReply) and "over" in too_long.message
            assert await reader.readline() == b""  # that connection is closed
            writer.close()
            assert (await node.client().status()).daemons == ()

    asyncio.run(scenario())


def test_daemon_that_cannot_start_is_an_error_and_restores_the_compute_mode(
    v3_node: Node,
) -> None:
    broken = replace(v3_node.config, control_binary="/nonexistent/nvidia-cuda-mps-control")

    async def scenario() -> None:
        async with agent_running(broken):
            with pytest.raises(MpsAgentError, match="cannot start the MPS control daemon") as err:
                await v3_node.client().ensure_share(
                    GPU0, "share-a", claim_uid="c", memory_limit_bytes=GIB,
                    active_thread_percentage=10,
                )  # fmt: skip
            assert err.value.kind == "daemon_failed"
            assert v3_node.modes.modes[GPU0] == "DEFAULT"
            assert await v3_node.client().list_shares() == []

    asyncio.run(scenario())


def test_client_without_an_agent_names_the_socket_and_the_daemonset() -> None:
    client = MpsAgentClient("/tmp/no-such-dir/mps-agent.sock", timeout=1)
    with pytest.raises(MpsAgentUnavailableError) as err:
        asyncio.run(client.status())
    assert "/tmp/no-such-dir/mps-agent.sock" in str(err.value)
    assert "mps-agent DaemonSet" in str(err.value)


# -- kept connections (the plugin's prepare path) -------------------------------------


def test_kept_connections_are_reused_and_survive_an_agent_restart(v3_node: Node) -> None:
    """Concurrent requests take connections of their own and leave them open for the
    next ones; after the agent restarts, the closed ones are dropped, not used."""
    node = v3_node

    async def scenario() -> None:
        client = MpsAgentClient(node.config.socket_path, timeout=20, keep_connections=4)
        try:
            async with agent_running(node.config):
                await asyncio.gather(*(client.status() for _ in range(3)))
                assert (client.connections_opened, client.kept_connections) == (3, 3)
                await asyncio.gather(*(client.status() for _ in range(3)))
                assert (client.connections_opened, client.kept_connections) == (3, 3)
            async with agent_running(node.config):
                assert (await client.status()).daemons == ()
                assert (client.connections_opened, client.kept_connections) == (4, 1)
        finally:
            await client.close()
        assert client.kept_connections == 0

    asyncio.run(scenario())


def test_a_kept_connection_closed_mid_request_is_retried_once_on_a_new_one(
    tmp_path: Path,
) -> None:
    """An agent that goes away between reading a request and answering it (a restart):
    the request is sent again on a new connection (every request is safe to repeat).
    On a connection of its own, the same silence is an error, not a retry."""
    path = str(tmp_path / "agent.sock")
    seen: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = len(seen)
        seen.append(number)
        answered = 0
        while await reader.readline():
            if (number == 0 and answered == 1) or number == 2:
                break  # connection 0's second request, and all of connection 2's: silence
            writer.write(wire.encode_result({"shares": []}))
            await writer.drain()
            answered += 1
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_unix_server(serve, path=path)
        client = MpsAgentClient(path, timeout=5, keep_connections=2)
        try:
            assert await client.list_shares() == []  # connection 0, kept
            assert await client.list_shares() == []  # 0 says nothing: again on 1
            assert client.connections_opened == 2
            alone = MpsAgentClient(path, timeout=5)  # one connection per request
            with pytest.raises(MpsAgentUnavailableError, match="without answering"):
                await alone.list_shares()  # connection 2: silence, no retry
            assert len(seen) == 3
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("version", "kept", "says"),
    [
        (2, True, "is of version 2, this agent writes version 1: reading the fields it knows"),
        ("one", False, "ignoring unreadable MPS agent state"),
    ],
)
def test_the_state_files_version_is_checked(
    v3_node: Node, caplog: pytest.LogCaptureFixture, version: object, kept: bool, says: str
) -> None:
    """A file another agent version wrote is read for what this one knows, and logged;
    one without an integer version is no state file of ours."""
    state_path = os.path.join(v3_node.config.state_dir, "mps-agent-state.json")

    async def scenario() -> list[str]:
        async with agent_running(v3_node.config):
            await v3_node.client().ensure_share(
                GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=GIB,
                active_thread_percentage=20,
            )  # fmt: skip
        with open(state_path, encoding="utf-8") as f:
            doc = json.load(f)
        doc["version"] = version
        with open(state_path, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        with caplog.at_level(logging.WARNING):
            async with agent_running(v3_node.config):
                return [s.share_id for s in await v3_node.client().list_shares()]

    shares = asyncio.run(scenario())
    assert says in caplog.text
    assert (shares == ["share-a"]) == kept, shares
