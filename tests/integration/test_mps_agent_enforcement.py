"""The mps-agent with the fake control binary: the compute mode it restores, legacy MPS
clients of two UIDs, and the daemon's own /dev/shm."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.daemon_files import PREVIOUS_MODE_FILE
from dra_driver.mpsagent.procs import alive
from tests.support.eventually import eventually
from tests.support.mps import (
    GIB,
    GPU0,
    Node,
    agent_running,
    cleanup,
    daemon_pid,
    gpu_dir,
    make_node,
)


def _node(protocol: str, **config: Any) -> Iterator[Node]:
    made = make_node(protocol)
    made.config = replace(made.config, **config)
    yield made
    cleanup(made)


@pytest.fixture
def legacy_node() -> Iterator[Node]:
    """A legacy node whose agent looks for UID waits often."""
    yield from _node("legacy", uid_check_interval_s=0.05)


@pytest.fixture
def v3_node() -> Iterator[Node]:
    yield from _node("v3")


async def ensure(node: Node, share: str, gpu: str = GPU0) -> None:
    await node.client().ensure_share(
        gpu, share, claim_uid=f"claim-{share}", memory_limit_bytes=GIB,
        active_thread_percentage=50,
    )  # fmt: skip


# -- the compute mode -----------------------------------------------------------------


def test_the_compute_mode_before_mps_is_restored(v3_node: Node) -> None:
    node = v3_node
    node.modes.modes[GPU0] = "PROHIBITED"  # what an administrator had set
    previous = os.path.join(gpu_dir(node.config.state_dir, GPU0), PREVIOUS_MODE_FILE)

    async def scenario() -> None:
        async with agent_running(node.config):
            await ensure(node, "share-a")
            assert node.modes.modes[GPU0] == "EXCLUSIVE_PROCESS"
            with open(previous) as f:
                assert f.read().strip() == "PROHIBITED"
            await node.client().release_share(GPU0, "share-a")
            assert node.modes.history == [(GPU0, "EXCLUSIVE_PROCESS"), (GPU0, "PROHIBITED")]
            assert not os.path.exists(previous)
            # The next daemon reads the mode afresh.
            node.modes.modes[GPU0] = "DEFAULT"
            await ensure(node, "share-b")
            await node.client().release_share(GPU0, "share-b")
            assert node.modes.modes[GPU0] == "DEFAULT"

    asyncio.run(scenario())


def test_an_agent_restart_still_restores_the_first_mode(v3_node: Node) -> None:
    """The restarted agent adopts the daemon; the GPU is EXCLUSIVE_PROCESS by then, but
    the mode to restore is the one recorded before the first start."""
    node = v3_node
    node.modes.modes[GPU0] = "PROHIBITED"
    first = replace(node.config, stop_daemons_on_exit=False)

    async def scenario() -> None:
        async with agent_running(first):
            await ensure(node, "share-a")
            pid = await daemon_pid(node.client(), GPU0)
        assert pid is not None and alive(pid)  # left running, as in a crash
        # A new agent process: its compute-mode port sees the GPU as it is now.
        modes = FakeComputeMode({GPU0: "EXCLUSIVE_PROCESS"})
        async with agent_running(replace(node.config, compute_mode=modes)):
            assert await daemon_pid(node.client(), GPU0) == pid  # adopted
            await node.client().release_share(GPU0, "share-a")
            assert modes.history == [(GPU0, "PROHIBITED")]
            assert not alive(pid)

    asyncio.run(scenario())


def test_a_daemon_restart_keeps_the_first_mode(v3_node: Node) -> None:
    node = v3_node
    node.modes.modes[GPU0] = "PROHIBITED"

    async def scenario() -> None:
        async with agent_running(node.config):
            await ensure(node, "share-a")
            pid = await daemon_pid(node.client(), GPU0)
            assert pid is not None
            os.kill(pid, 9)

            async def restarted() -> bool:
                new = await daemon_pid(node.client(), GPU0)
                return new is not None and new != pid

            await eventually(restarted)
            await node.client().release_share(GPU0, "share-a")
            assert node.modes.modes[GPU0] == "PROHIBITED"

    asyncio.run(scenario())


# -- legacy MPS: one UID at a time ----------------------------------------------------


def client(node: Node, action: str, uid: int, gpu: str = GPU0) -> str:
    """A CUDA process of ``uid`` connecting to (or leaving) the GPU's fake daemon."""
    done = subprocess.run(
        [fake_control_path(), "--fake-client", action, "--uid", str(uid)],
        env={**os.environ, "PYTHON": sys.executable,
             "CUDA_MPS_PIPE_DIRECTORY": os.path.join(gpu_dir(node.config.state_dir, gpu), "pipe"),
             "CUDA_MPS_LOG_DIRECTORY": os.path.join(gpu_dir(node.config.state_dir, gpu), "log")},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def uid_checks(node: Node) -> int:
    """The ``get_server_list`` commands the GPU's daemon has had (after the shares'
    applies, only the agent's UID checks send it)."""
    return sum(r.get("stdin") == "get_server_list\n" for r in node.records(GPU0))


def test_a_client_waiting_on_another_uid_is_surfaced(
    legacy_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node = legacy_node
    caplog.set_level(logging.INFO, logger="dra_driver.mpsagent")

    async def waits() -> tuple[int | None, tuple[int, ...]]:
        (daemon,) = (await node.client().status()).daemons
        return daemon.server_uid, daemon.waiting_uids

    async def scenario() -> None:
        async with agent_running(node.config):
            await ensure(node, "share-a")
            await ensure(node, "share-b")
            assert client(node, "connect", 1000).isdigit()  # a server for UID 1000 starts
            checks = uid_checks(node)

            async def checked_since() -> bool:
                # Two more: the first of them may have been under way at the connect.
                return uid_checks(node) >= checks + 2

            await eventually(checked_since)
            assert await waits() == (None, ())  # one UID: nothing waits

            assert client(node, "connect", 0) == "pending"

            async def surfaced() -> bool:
                return await waits() == (1000, (0,))

            await eventually(surfaced)
            warning = next(r for r in caplog.records if "one UID at a time" in r.getMessage())
            assert warning.levelno == logging.WARNING
            text = warning.getMessage()
            assert GPU0 in text and "UID 1000" in text and "UID 0" in text
            assert "runAsUser" in text and "MPS v3" in text
            assert sum("one UID at a time" in r.getMessage() for r in caplog.records) == 1

            client(node, "exit", 1000)  # UID 1000's last client goes: UID 0 is served

            async def cleared() -> bool:
                return await waits() == (None, ())

            await eventually(cleared)
            assert "no MPS client waits on another UID's server now" in caplog.text
            (server,) = node.fake_state(GPU0)["legacy"]["servers"].values()
            assert server["uid"] == 0

    asyncio.run(scenario())


def test_v3_daemons_are_not_checked_for_uids(v3_node: Node) -> None:
    node = v3_node
    node.config = replace(node.config, uid_check_interval_s=0.05)

    async def scenario() -> None:
        async with agent_running(node.config):
            await ensure(node, "share-a")
            await asyncio.sleep(0.2)
            (daemon,) = (await node.client().status()).daemons
            assert (daemon.server_uid, daemon.waiting_uids) == (None, ())
        commands = [r.get("stdin") for r in node.records(GPU0)]
        assert "get_server_list\n" not in commands

    asyncio.run(scenario())


# -- the daemon's /dev/shm ------------------------------------------------------------

# In tests an unprivileged user namespace stands in for the agent's CAP_SYS_ADMIN.
TEST_UNSHARE = ("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private")


def _can_unshare() -> bool:
    try:
        return (
            subprocess.run(
                [*TEST_UNSHARE, "true"], capture_output=True, timeout=10, check=False
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def shm_identity(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino]


@pytest.fixture(params=["v3", "legacy"])
def shm_node(request: pytest.FixtureRequest) -> Iterator[Node]:
    if not _can_unshare():
        pytest.skip("this machine allows no unprivileged user and mount namespaces (unshare -rm)")
    yield from _node(request.param, shm_namespace=TEST_UNSHARE)


def test_the_daemon_sees_its_gpus_shm_directory_as_dev_shm(shm_node: Node) -> None:
    node = shm_node

    async def scenario() -> None:
        async with agent_running(node.config):
            await ensure(node, "share-a")
            info = (await node.client().list_shares())[0]
            # The daemon's /dev/shm is the directory the share's containers get.
            assert node.fake_state(GPU0)["shm"] == shm_identity(info.shm_dir)
            assert node.fake_state(GPU0)["shm"] != shm_identity("/dev/shm")
            assert os.stat(info.shm_dir).st_mode & 0o7777 == 0o1777
            await node.client().release_share(GPU0, "share-a")

    asyncio.run(scenario())


def test_without_a_namespace_the_daemon_uses_the_agents_dev_shm(v3_node: Node) -> None:
    """What the fake backend runs with (and what the real daemon did before)."""
    node = v3_node

    async def scenario() -> None:
        async with agent_running(node.config):
            await ensure(node, "share-a")
            assert node.fake_state(GPU0)["shm"] == shm_identity("/dev/shm")

    asyncio.run(scenario())
