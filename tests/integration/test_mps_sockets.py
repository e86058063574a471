"""Real unix sockets in MPS pipe directories (issue 26, findings 1 and 10).

The fake ``nvidia-cuda-mps-control`` binds sockets where the real daemon and
server do, so a path the kernel refuses fails here too; a daemon is alive when
its control socket answers, never because a recorded pid names a live process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from types import FrameType

import pytest

from dra_driver.fakes.mps_control import PID_FILE, STATE_FILE, fake_control_path
from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import layout
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.daemon import MpsDaemon
from dra_driver.mpsagent.daemon_files import PREVIOUS_MODE_FILE
from dra_driver.mpsagent.sockets import answers
from tests.support.eventually import eventually_sync
from tests.support.mps import GIB, GPU0, Node, agent_running, cleanup, gpu_dir, make_node

ENV = {**os.environ, "PYTHON": sys.executable}


@pytest.fixture
def root() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="sk-", dir="/tmp")
    yield path
    for pid_file in _glob_pid_files(path):
        with open(pid_file) as f:
            pid = int(f.read())
        if pid not in (os.getpid(), 1):  # the stale files below name these
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def _glob_pid_files(path: str) -> list[str]:
    found = []
    for folder, _, files in os.walk(path):
        found += [os.path.join(folder, f) for f in files if f == PID_FILE]
    return found


def _fake(args: list[str], pipe: str, logs: str) -> subprocess.Popen[str]:
    env = {**ENV, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": logs}
    return subprocess.Popen(
        [fake_control_path(), *args], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _run(args: list[str], pipe: str, logs: str) -> tuple[int, str]:
    proc = _fake(args, pipe, logs)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out + err


def _is_socket(path: str) -> bool:
    return stat.S_ISSOCK(os.lstat(path).st_mode)


# -- the fake binds what the real daemon and server bind ---------------------------------


def test_a_daemon_whose_control_socket_does_not_fit_exits_as_the_kernel_refuses(root: str) -> None:
    pipe = os.path.join(root, "p" * (layout.UNIX_PATH_MAX - len(root) - len("/control")))
    assert len(os.path.join(pipe, "control")) == layout.UNIX_PATH_MAX + 1
    code, output = _run(["-f", "-p", "3"], pipe, os.path.join(root, "log"))
    assert code == 1
    assert "AF_UNIX path too long" in output and os.path.join(pipe, "control") in output
    assert not os.path.lexists(os.path.join(pipe, "control"))


def test_v3_sockets_are_real_and_an_over_long_namespace_is_refused(root: str) -> None:
    # The daemon's and the server's sockets fit; a namespace's does not.
    pipe = os.path.join(root, "p" * (70 - len(root) - 1))  # namespace sockets: 100, 108
    logs = os.path.join(root, "log")
    daemon = _fake(["-f", "-p", "3", "-m"], pipe, logs)
    try:
        control = os.path.join(pipe, "control")
        eventually_sync(lambda: answers(control), "the fake daemon's control socket")
        assert _is_socket(control) and answers(control)
        assert _run(["server", "create", "shares"], pipe, logs) == (0, "")
        assert _is_socket(os.path.join(pipe, "shares", "control"))
        assert _is_socket(os.path.join(pipe, "shares", "default", "control"))
        fits = "s_" + "a" * 12
        assert _run(["namespace", "create", fits, "--server=shares"], pipe, logs)[0] == 0
        assert _is_socket(os.path.join(pipe, "shares", fits, "control"))
        too_long = "s_" + "b" * 20
        code, output = _run(["namespace", "create", too_long, "--server=shares"], pipe, logs)
        assert code == 1 and "AF_UNIX path too long" in output
        with open(os.path.join(pipe, STATE_FILE)) as f:
            spaces = json.load(f)["servers"]["shares"]["namespaces"]
        assert set(spaces) == {fits}  # the refused one was not made
        assert _run(["-q"], pipe, logs)[0] == 0  # quit goes over the socket
        assert daemon.wait(timeout=10) == 0
        assert not os.path.lexists(control)
    finally:
        daemon.kill()
        daemon.communicate()


def test_the_agent_under_a_state_dir_as_long_as_the_charts_binds_every_socket() -> None:
    node = make_node("v3")
    try:
        # As long as the chart's /run/fractional-gpu-dra/mps (27 bytes).
        state_dir = node.root + "/" + "s" * (27 - len(node.root) - 1)
        assert len(state_dir) == len("/run/fractional-gpu-dra/mps")
        config = replace(node.config, state_dir=state_dir)

        async def scenario() -> None:
            async with agent_running(config):
                share = await Node(node.root, config, node.modes).client().ensure_share(
                    GPU0, "7d3f52c1-9b1e-4a57-8d8e-2f0c6f1a9b10", claim_uid="claim-a",
                    memory_limit_bytes=GIB, active_thread_percentage=25,
                )  # fmt: skip
                control = os.path.join(share.pipe_dir, "control")
                # Before: 127 bytes at <state>/GPU-<uuid>/pipe/shares/s_<uid>/control.
                assert _is_socket(control) and len(control.encode()) <= layout.UNIX_PATH_MAX

        asyncio.run(scenario())
        sockets: list[str] = []
        files: list[str] = []
        for folder, _, names in os.walk(state_dir):
            for name in names:
                path = os.path.join(folder, name)
                (sockets if _is_socket(path) else files).append(path)
        assert sockets and all(len(p.encode()) <= layout.UNIX_PATH_MAX for p in sockets)
        assert not [f for f in files if os.path.basename(f) == "control"]
    finally:
        cleanup(node)


def test_the_agent_refuses_a_state_dir_that_leaves_sockets_no_room() -> None:
    node = make_node("v3")
    try:
        config = replace(node.config, state_dir="/tmp/" + "s" * layout.MAX_STATE_DIR_BYTES)

        async def scenario() -> None:
            async with agent_running(config):
                pass

        with pytest.raises(layout.StateDirTooLong, match="--state-dir"):
            asyncio.run(scenario())
        assert not os.path.exists(config.state_dir)  # refused before anything was made
    finally:
        cleanup(node)


# -- a daemon that died in another PID namespace (finding 10) -----------------------------


def _stale_pipe_dir(pipe: str, pid: int) -> None:
    """What a fake daemon of an earlier agent container leaves: a pid file and a state
    naming ``pid`` (written in its PID namespace), and its socket, nobody listening."""
    os.makedirs(pipe, exist_ok=True)
    with open(os.path.join(pipe, PID_FILE), "w") as f:
        f.write(f"{pid}\n")
    with open(os.path.join(pipe, STATE_FILE), "w") as f:
        json.dump({"daemon_pid": pid, "protocol": 3, "multiuser": True, "servers": {},
                   "next_pid": 100, "legacy": {}}, f)  # fmt: skip
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(os.path.join(pipe, "control"))  # bound, then closed: nobody listens
    os.makedirs(os.path.join(pipe, "shares", "s_old"))
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(os.path.join(pipe, "shares", "s_old", "control"))


@pytest.mark.parametrize("stale_pid", ["the test itself", "pid 1"])
def test_the_stale_dir_of_a_daemon_dead_in_another_pid_namespace_is_cleared(
    root: str, stale_pid: str
) -> None:
    pid = os.getpid() if stale_pid == "the test itself" else 1
    signals: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        signals.append(signum)

    daemon = MpsDaemon(
        GPU0, os.path.join(root, "state"), fake_control_path(), "v3", FakeComputeMode(),
        base_env=ENV, control_channel=False, ready_timeout=10,
    )  # fmt: skip
    _stale_pipe_dir(daemon.dirs.pipe, pid)
    with open(os.path.join(daemon.dirs.root, "daemon.json"), "w") as f:
        json.dump({"pid": pid, "start_time": 1, "cmdline": ["nvidia-cuda-mps-control"]}, f)
    old = signal.signal(signal.SIGTERM, record)

    async def scenario() -> None:
        # Nothing answers on the socket: nothing to adopt, whatever the pid names.
        assert await daemon.adopt() is False
        assert not daemon.running
        await daemon.start()  # clears the leftovers; the new daemon starts
        try:
            assert daemon.pid is not None and daemon.pid != pid
            assert answers(daemon.dirs.control)
            await daemon.restore([cmd.ShareLimits("share-a", GIB, 25)])
        finally:
            await daemon.stop()

    try:
        asyncio.run(scenario())
    finally:
        signal.signal(signal.SIGTERM, old)
    assert signals == []  # the unrelated process (this test) was never signalled
    assert not os.path.lexists(os.path.join(daemon.dirs.pipe, "shares", "s_old", "control"))
    assert os.path.isdir(os.path.join(daemon.dirs.pipe, "shares", "s_old"))  # dirs stay


def test_an_adopted_daemon_whose_pid_is_unverified_is_never_signalled(root: str) -> None:
    """A live daemon answers, but the record of who started it names another process:
    it is adopted (its socket answers) and its pid is not taken."""
    state_dir = os.path.join(root, "state")
    first = MpsDaemon(
        GPU0, state_dir, fake_control_path(), "v3", FakeComputeMode(), base_env=ENV,
        control_channel=False,
    )  # fmt: skip

    async def scenario() -> None:
        await first.start()
        real_pid = first.pid
        assert real_pid is not None
        with open(first.dirs.record, "w") as f:  # an earlier container's record
            json.dump({"pid": os.getpid(), "start_time": 1, "cmdline": ["x"]}, f)
        second = MpsDaemon(
            GPU0, state_dir, fake_control_path(), "v3", FakeComputeMode(), base_env=ENV,
            control_channel=False,
        )  # fmt: skip
        assert await second.adopt() is True
        assert second.running and second.pid is None  # alive by its socket, pid unknown
        await second.stop()  # quit over the socket: no signal needed
        assert not second.running
        await first.stop()

    asyncio.run(scenario())


def test_an_old_layout_gpu_dir_is_migrated_keeping_the_compute_mode() -> None:
    node = make_node("v3")
    try:
        old = os.path.join(node.config.state_dir, GPU0)
        gone = subprocess.Popen(["true"])  # its pid names no process (cleanup kills it)
        gone.wait()
        _stale_pipe_dir(os.path.join(old, "pipe"), gone.pid)
        with open(os.path.join(old, PREVIOUS_MODE_FILE), "w") as f:
            f.write("PROHIBITED\n")

        async def scenario() -> None:
            async with agent_running(node.config):
                share = await node.client().ensure_share(
                    GPU0, "share-a", claim_uid="claim-a", memory_limit_bytes=GIB,
                    active_thread_percentage=25,
                )  # fmt: skip
                assert share.pipe_dir.startswith(gpu_dir(node.config.state_dir, GPU0) + "/")
                assert await node.client().release_share(GPU0, "share-a")

        asyncio.run(scenario())
        assert not os.path.exists(old)
        assert os.path.isdir(os.path.join(node.config.state_dir, "retired-" + GPU0))
        assert node.modes.modes[GPU0] == "PROHIBITED"  # the mode before MPS, restored
    finally:
        cleanup(node)
