"""A daemon's supervisor lives as long as its daemon: one that dies stops the agent,
with the shutdown a signal gives it (so the daemons fare as on SIGTERM)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import replace

import pytest

from dra_driver.app.agent import run_agent
from dra_driver.app.tasks import BackgroundTaskFailed
from dra_driver.cli import main
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentError
from dra_driver.mpsagent.daemon import MpsDaemon
from dra_driver.mpsagent.procs import alive
from tests.support.mps import GIB, GPU0, Node, agent_running, daemon_pid

_wait_exit = MpsDaemon.wait_exit


def _supervisor_explodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first wait for a daemon's exit (its supervisor's) raises; later ones (the
    agent's stop) wait as ever."""
    raised: list[bool] = []

    async def wait_exit(self: MpsDaemon) -> int | None:
        if not raised:
            raised.append(True)
            raise RuntimeError("the supervisor exploded")
        return await _wait_exit(self)

    monkeypatch.setattr(MpsDaemon, "wait_exit", wait_exit)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def _ensure(node: Node) -> None:
    await node.client().ensure_share(
        GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=GIB, active_thread_percentage=50
    )


async def _daemon_of_a_first_agent(node: Node, live: AgentConfig) -> int | None:
    """A first agent starts GPU0's daemon for a share and exits; the daemon's pid."""
    async with agent_running(live):
        await _ensure(node)
        return await daemon_pid(node.client(), GPU0)


def test_a_dying_supervisor_stops_the_agent_as_a_signal_does(
    v3_node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = v3_node
    # Daemons left running on exit: the failure must leave them so too.
    live = replace(node.config, stop_daemons_on_exit=False)

    async def scenario() -> int | None:
        pid = await _daemon_of_a_first_agent(node, live)
        assert pid is not None and alive(pid)
        _supervisor_explodes(monkeypatch)
        ready = asyncio.Event()
        agent = asyncio.create_task(run_agent(live, install_signal_handlers=False, ready=ready))
        with pytest.raises(BackgroundTaskFailed) as raised:
            await asyncio.wait_for(agent, 20)
        failure = raised.value
        assert failure.task_name == f"mps-watch-{GPU0}"
        assert isinstance(failure.cause, RuntimeError)
        assert "so the mps-agent stops" in str(failure)
        return pid

    pid = asyncio.run(scenario())
    assert pid is not None and alive(pid)  # the adopted daemon and its clients untouched
    assert not os.path.exists(node.config.socket_path)
    errors = _errors(caplog)
    assert any(f"MPS daemon supervisor mps-watch-{GPU0} failed" in m for m in errors), errors
    assert any("so the mps-agent stops" in m for m in errors), errors


def test_the_mps_agent_command_exits_with_an_error(
    v3_node: Node, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = v3_node
    live = replace(node.config, stop_daemons_on_exit=False)

    pid = asyncio.run(_daemon_of_a_first_agent(node, live))
    assert pid is not None and alive(pid)
    _supervisor_explodes(monkeypatch)
    argv = [
        "mps-agent",
        f"--socket={node.config.socket_path}",
        f"--state-dir={node.config.state_dir}",
        "--mps-control=fake",
        "--mps-protocol=v3",
    ]
    assert main(argv) == 2
    # The command's shutdown, as on SIGTERM: its daemons quit with it.
    assert not alive(pid)
    assert not os.path.exists(node.config.socket_path)
    errors = _errors(caplog)
    assert any(f"mps-watch-{GPU0} failed" in m and "mps-agent stops" in m for m in errors), errors


def test_a_request_in_flight_when_the_agent_stops_gets_an_answer_or_an_error(
    v3_node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The share's supervisor dies at once; the plugin's ensure_share never hangs."""
    node = v3_node
    _supervisor_explodes(monkeypatch)

    async def scenario() -> None:
        ready = asyncio.Event()
        agent = asyncio.create_task(
            run_agent(node.config, install_signal_handlers=False, ready=ready)
        )
        await asyncio.wait_for(ready.wait(), 20)
        with contextlib.suppress(MpsAgentError):
            await asyncio.wait_for(_ensure(node), 20)
        with pytest.raises(BackgroundTaskFailed, match=f"mps-watch-{GPU0} failed"):
            await asyncio.wait_for(agent, 20)

    asyncio.run(scenario())
