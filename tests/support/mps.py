"""Running the mps-agent in a test's event loop; a scratch node for it (:func:`make_node`);
the plugin runtime that talks to it (:func:`mps_runtime`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from dra_driver.app.agent import run_agent
from dra_driver.app.plugin import PluginParts
from dra_driver.core.settings import NodeSettings
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.daemon_files import PID_FILE, DaemonDirs
from dra_driver.mpsagent.metrics import AgentMetrics
from tests.support.eventually import eventually
from tests.support.node import NODE, NodeDirs


def fake_agent_config(
    plugin_dir: str, root: str, extra_env: Mapping[str, str] | None = None
) -> AgentConfig:
    """An MPS v3 agent on the packaged fake control, its socket in ``plugin_dir``, its
    state under ``root``; ``extra_env`` reaches the fake daemons (e.g. a command delay)."""
    return AgentConfig(
        socket_path=os.path.join(plugin_dir, "mps-agent.sock"),
        state_dir=os.path.join(root, "mps"),
        control_binary=fake_control_path(),
        protocol="v3",
        compute_mode=FakeComputeMode(),
        daemon_env={**os.environ, "PYTHON": sys.executable, **(extra_env or {})},
    )


@asynccontextmanager
async def agent_running(
    config: AgentConfig, metrics: AgentMetrics | None = None
) -> AsyncIterator[None]:
    """The agent serving until the block ends; ``metrics``: its metrics, kept current."""
    ready = asyncio.Event()
    task = asyncio.create_task(
        run_agent(config, install_signal_handlers=False, ready=ready, metrics=metrics)
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        await task  # raises why the agent could not start
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def gpu_dir(state_dir: str, gpu: str) -> str:
    """The directory of ``gpu``'s daemon under ``state_dir`` (a short name, not the UUID)."""
    return DaemonDirs.for_gpu(state_dir, gpu).root


GPU0 = "GPU-00000000-1111-2222-3333-444444444444"
GPU1 = "GPU-11111111-1111-2222-3333-444444444444"
GIB = 1 << 30


@dataclass
class Node:
    root: str
    config: AgentConfig
    modes: FakeComputeMode

    def client(self) -> MpsAgentClient:
        return MpsAgentClient(self.config.socket_path, timeout=20)

    def fake_state(self, gpu: str) -> dict[str, Any]:
        with open(
            os.path.join(gpu_dir(self.config.state_dir, gpu), "pipe", "fake-mps-state.json")
        ) as f:
            state: dict[str, Any] = json.load(f)
        return state

    def records(self, gpu: str) -> list[dict[str, Any]]:
        path = os.path.join(gpu_dir(self.config.state_dir, gpu), "log", "fake-mps-commands.jsonl")
        with open(path) as f:
            return [json.loads(line) for line in f]


def make_node(protocol: str) -> Node:
    # Short paths: unix socket paths are limited to 107 bytes.
    root = tempfile.mkdtemp(prefix="mps-", dir="/tmp")
    modes = FakeComputeMode()
    config = AgentConfig(
        socket_path=os.path.join(root, "plugin", "mps-agent.sock"),
        state_dir=os.path.join(root, "state"),
        control_binary=fake_control_path(),
        protocol=protocol,
        compute_mode=modes,
        daemon_env={**os.environ, "PYTHON": sys.executable},
        restart_backoff_s=0.05,
    )
    return Node(root, config, modes)


def with_env(node: Node, **env: str) -> Node:
    """``node`` whose daemons and commands also get ``env``."""
    daemon_env = {**(node.config.daemon_env or {}), **env}
    return dataclasses.replace(node, config=dataclasses.replace(node.config, daemon_env=daemon_env))


def refusing(node: Node, verb: str, flag: str) -> Node:
    """``node`` whose control binary refuses ``namespace <verb>`` while the file
    ``flag`` exists (a wrapper of the fake, as a daemon refusing would answer)."""
    wrapper = os.path.join(node.root, "nvidia-cuda-mps-control")
    with open(wrapper, "w") as f:
        f.write(
            "#!/bin/sh\n"
            f'if [ "$1 $2" = "namespace {verb}" ] && [ -e "$REFUSE_FLAG" ]; then\n'
            f'  echo "Error: namespace {verb} refused (test)" >&2; exit 1\n'
            "fi\n"
            f'exec "{fake_control_path()}" "$@"\n'
        )
    os.chmod(wrapper, 0o755)
    made = with_env(node, REFUSE_FLAG=flag)
    return dataclasses.replace(
        made, config=dataclasses.replace(made.config, control_binary=wrapper)
    )


def cleanup(node: Node) -> None:
    """Kill any fake daemon a failed test left behind, then remove the node's files."""
    for pid_file in glob.glob(os.path.join(node.config.state_dir, "*", "pipe", PID_FILE)):
        with contextlib.suppress(OSError, ValueError), open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGKILL)
    shutil.rmtree(node.root, ignore_errors=True)


async def daemon_pid(client: MpsAgentClient, gpu: str) -> int | None:
    for daemon in (await client.status()).daemons:
        if daemon.gpu_uuid == gpu:
            return daemon.pid
    return None


async def until_shares(
    client: MpsAgentClient, claim_uids: Collection[str], timeout: float = 20.0
) -> None:
    """Until the agent's shares are those of ``claim_uids``: an MPS v3 share an
    unprepare released goes once the plugin's calls pause (plugin/deferred_releases)."""
    want = sorted(claim_uids)

    async def holds() -> bool:
        return sorted(s.claim_uid for s in await client.list_shares()) == want

    await eventually(holds, f"the agent's shares to be those of claims {want}", timeout=timeout)


def agent_config(dirs: NodeDirs) -> AgentConfig:
    """:func:`fake_agent_config` in the dirs of the ``node_dirs`` fixture."""
    return fake_agent_config(dirs.plugin, dirs.root)


def mps_parts(dirs: NodeDirs, source: InMemoryClaimSource) -> PluginParts:
    """A plugin on one fake H100 whose shares go to the agent of :func:`agent_config`."""
    config = dataclasses.replace(
        dirs.config(),
        settings=NodeSettings(),
        mps_agent_socket=os.path.join(dirs.plugin, "mps-agent.sock"),
    )
    return PluginParts(config, FakeGpuBackend("h100-80gb:1", NODE), source)
