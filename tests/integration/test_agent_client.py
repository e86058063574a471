"""The plugin's mps-agent client against agents that misbehave on a real unix socket.

Each test serves the socket with a small asyncio server of its own that answers
as the case needs (the real agent is in test_mps_agent.py), and checks that no
answer is ever read as another request's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.client import (
    MAX_ANSWER_BYTES,
    MpsAgentClient,
    MpsAgentError,
    MpsAgentUnavailableError,
)

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def answer(shares: int) -> bytes:
    """A list_shares answer that says how many shares it lists (which request it answers)."""
    share = {
        "gpu_uuid": "GPU-0",
        "share_id": "s",
        "claim_uid": "c",
        "memory_limit_bytes": 1 << 30,
        "active_thread_percentage": 100,
        "uid": None,
        "protocol": "v3",
        "namespace": "n",
        "pipe_dir": "/p",
        "shm_dir": "/s",
    }
    return wire.encode_result({"shares": [share] * shares})


def counting_server(slow: int, delay_s: float) -> Serve:
    """Answers request number N (over all connections) with N shares; request ``slow``
    only after ``delay_s``."""
    requests = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while await reader.readline():
            requests += 1
            if requests == slow:
                await asyncio.sleep(delay_s)
            writer.write(answer(requests))
            await writer.drain()
        writer.close()

    return serve


def run_against(tmp_path: Path, serve: Serve, scenario: Callable[[str], Awaitable[None]]) -> None:
    path = str(tmp_path / "agent.sock")

    async def main() -> None:
        server = await asyncio.start_unix_server(serve, path=path, limit=4 * MAX_ANSWER_BYTES)
        try:
            await scenario(path)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_two_lines_for_one_request_are_not_read_as_the_next_answer(tmp_path: Path) -> None:
    """An agent that answers one request twice: the connection is not kept, so the
    next request gets its own answer on a new connection."""
    requests = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while await reader.readline():
            requests += 1
            reply = answer(requests)
            writer.write(reply + reply if requests == 1 else reply)
            await writer.drain()
        writer.close()

    async def scenario(path: str) -> None:
        client = MpsAgentClient(path, timeout=5, keep_connections=2)
        try:
            assert len(await client.list_shares()) == 1
            assert len(await client.list_shares()) == 2  # not the first answer's copy
            assert client.connections_opened == 2
            assert len(await client.list_shares()) == 3  # the second connection was kept
            assert client.connections_opened == 2
        finally:
            await client.close()

    run_against(tmp_path, serve, scenario)


@pytest.mark.parametrize("size", [MAX_ANSWER_BYTES + 10, 80 * MAX_ANSWER_BYTES], ids=["80K", "5M"])
def test_an_answer_longer_than_the_limit_is_an_agent_error(tmp_path: Path, size: int) -> None:
    """Refused as the protocol refuses it, however long (the client stops reading at
    the limit and closes the connection)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):  # the client hangs up mid-answer
            while await reader.readline():
                writer.write(b"x" * size + b"\n")
                await writer.drain()
        writer.close()

    async def scenario(path: str) -> None:
        client = MpsAgentClient(path, timeout=5, keep_connections=2)
        try:
            with pytest.raises(
                MpsAgentError, match=f"response longer than {MAX_ANSWER_BYTES}"
            ) as err:
                await client.list_shares()
            assert err.value.kind == "internal"
            assert client.kept_connections == 0
        finally:
            await client.close()

    run_against(tmp_path, serve, scenario)


def test_an_answer_in_pieces_is_read_whole(tmp_path: Path) -> None:
    """A long answer arrives in several reads; the line is put together."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            reply = answer(200)
            for start in range(0, len(reply), 1000):
                writer.write(reply[start : start + 1000])
                await writer.drain()
                await asyncio.sleep(0.001)
        writer.close()

    async def scenario(path: str) -> None:
        client = MpsAgentClient(path, timeout=5, keep_connections=1)
        try:
            assert len(await client.list_shares()) == 200
            assert len(await client.list_shares()) == 200
            assert client.connections_opened == 1
        finally:
            await client.close()

    run_against(tmp_path, serve, scenario)


def test_a_late_answer_is_not_read_as_the_next_requests(tmp_path: Path) -> None:
    """A request that timed out closes its connection: its late answer goes nowhere."""
    serve = counting_server(slow=2, delay_s=0.5)  # past the client's deadline

    async def scenario(path: str) -> None:
        client = MpsAgentClient(path, timeout=0.2, keep_connections=2)
        try:
            assert len(await client.list_shares()) == 1
            with pytest.raises(MpsAgentUnavailableError, match="TimeoutError"):
                await client.list_shares()
            assert client.kept_connections == 0
            assert len(await client.list_shares()) == 3
        finally:
            await client.close()

    run_against(tmp_path, serve, scenario)


def test_a_cancelled_request_does_not_keep_its_connection(tmp_path: Path) -> None:
    """A caller that gives up (the kubelet's deadline): its connection is closed."""
    serve = counting_server(slow=1, delay_s=0.3)

    async def scenario(path: str) -> None:
        client = MpsAgentClient(path, timeout=5, keep_connections=2)
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await client.list_shares()
            assert client.kept_connections == 0
            assert len(await client.list_shares()) == 2
            assert client.connections_opened == 2
        finally:
            await client.close()

    run_against(tmp_path, serve, scenario)
