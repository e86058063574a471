"""The opt-in persistent control channel: one control shell per legacy MPS daemon, real
processes (the fake ``nvidia-cuda-mps-control``), restarted when it dies or hangs, and
a fallback to one process per command when a shell does not answer as expected; off
by default, and never for a v3 daemon (MPS v3 documents no shell)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator

import pytest

from dra_driver.fakes.mps_control import DELAY_ENV, fake_control_path
from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent.commands import ControlCall, ShareLimits
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.daemon import MpsDaemon
from dra_driver.mpsagent.daemon_files import DaemonError
from tests.support.eventually import eventually
from tests.support.mps import gpu_dir

GPU = "GPU-00000000-1111-2222-3333-444444444444"
GIB = 1 << 30


@pytest.fixture
def state_dir() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="mpsch-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def daemon(
    state_dir: str, protocol: str = "legacy", binary: str = "", channel: bool = True, **kw: object
) -> MpsDaemon:
    """A daemon on the fake; ``channel``: opted in to the persistent channel."""
    env = {**os.environ, "PYTHON": sys.executable, **kw.pop("env", {})}  # type: ignore[dict-item]
    return MpsDaemon(
        GPU,
        state_dir,
        binary or fake_control_path(),
        "v3" if protocol == "v3" else "legacy",
        FakeComputeMode(),
        base_env=env,
        control_channel=channel,
        **kw,  # type: ignore[arg-type]
    )


SERVER_LIST = ControlCall(stdin="get_server_list\n")


def records(state_dir: str) -> list[dict[str, object]]:
    with open(os.path.join(gpu_dir(state_dir, GPU), "log", "fake-mps-commands.jsonl")) as f:
        return [json.loads(line) for line in f]


def fake_state(state_dir: str) -> dict[str, object]:
    with open(os.path.join(gpu_dir(state_dir, GPU), "pipe", "fake-mps-state.json")) as f:
        state: dict[str, object] = json.load(f)
    return state


def test_legacy_commands_share_one_long_lived_shell_when_opted_in(state_dir: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir)
        await d.start()
        try:
            shell, starts = d.channel.pid, d.channel.starts
            assert shell is not None
            shares = [ShareLimits(f"share-{i}", GIB, 10 + i) for i in range(10)]
            before = len(records(state_dir))
            for i, share in enumerate(shares):
                await d.apply(share, shares[: i + 1])
            assert d.channel.pid == shell and d.channel.starts == starts
            # Every command of the applies ran in that one shell: no process per command.
            ran = records(state_dir)[before:]
            assert len(ran) >= len(shares), ran
            assert {r["control_pid"] for r in ran} == {shell}, ran
            legacy = fake_state(state_dir)["legacy"]
            assert isinstance(legacy, dict) and legacy["default_pct"] == 19
        finally:
            await d.stop()
        assert not d.channel.open

    asyncio.run(scenario())


def test_the_channel_is_off_by_default(state_dir: str) -> None:
    async def scenario() -> None:
        d = MpsDaemon(
            GPU, state_dir, fake_control_path(), "legacy", FakeComputeMode(),
            base_env={**os.environ, "PYTHON": sys.executable},
        )  # fmt: skip
        await d.start()
        try:
            share = ShareLimits("share-a", GIB, 50)
            await d.apply(share, [share])
            assert not d.channel_usable and d.channel.starts == 0
        finally:
            await d.stop()

    asyncio.run(scenario())


def test_a_v3_daemon_never_opens_a_shell_even_when_opted_in(
    state_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    """MPS v3 "replaces the interactive shell" (docs:mpsv3-interface): every command is
    a process with its arguments, nothing on stdin."""

    async def scenario() -> None:
        d = daemon(state_dir, "v3", channel=True)
        await d.start()
        try:
            shares = [ShareLimits("share-a", GIB, 50), ShareLimits("share-b", 2 * GIB, 25)]
            await d.apply(shares[0], shares[:1])
            await d.apply(shares[1], shares)
            await d.remove(shares[0], shares[1:])
            assert not d.channel_usable and d.channel.starts == 0
        finally:
            await d.stop()
        commands = [r for r in records(state_dir) if "event" not in r]
        assert commands and all(r.get("ok") for r in commands), commands
        assert all("stdin" not in r and r["argv"] for r in commands), commands

    with caplog.at_level(logging.WARNING, logger="dra_driver.mpsagent.daemon_control"):
        asyncio.run(scenario())
    assert "persistent control channel is for legacy MPS only" in caplog.text


def test_a_dead_shell_is_restarted_at_the_next_command(state_dir: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir)
        await d.start()
        try:
            first, starts = d.channel.pid, d.channel.starts
            assert first is not None
            os.kill(first, 9)
            # Once the loop has seen the shell's exit; a command sent before that
            # meets the dying shell and fails (the one after it starts a new shell).
            await eventually(lambda: not d.channel.open, "the channel to see its shell gone")
            await d.run(SERVER_LIST)
            assert d.channel.pid not in (None, first) and d.channel.starts == starts + 1
        finally:
            await d.stop()

    asyncio.run(scenario())


def test_a_command_that_hangs_times_out_and_the_channel_recovers(state_dir: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir)
        await d.start()
        try:
            starts = d.channel.starts
            # From now on the shell's daemon takes a minute per command; we wait 0.3 s,
            # so "no answer" (not an answer a minute later) is the timeout's doing.
            d.channel.env[DELAY_ENV] = "60"
            d.channel.timeout = 0.3
            await d.channel.close()
            with pytest.raises(DaemonError, match="no answer"):
                await d.run(ControlCall(stdin="set_default_active_thread_percentage 40\n"))
            assert not d.channel.open
            del d.channel.env[DELAY_ENV]
            d.channel.timeout = 5.0
            assert cmd.parse_legacy_server_list(await d.run(SERVER_LIST)) == []
            assert d.channel.starts == starts + 2
        finally:
            await d.stop()

    asyncio.run(scenario())


def test_a_shell_that_does_not_frame_answers_falls_back_to_processes(state_dir: str) -> None:
    """A control binary whose shell answers only once stdin closes (the real one's
    framing is documented nowhere): the channel never gets an answer, a process does;
    the daemon notices at its first probe."""
    script = os.path.join(state_dir, "buffered-shell")
    # One process (exec): it reads all of stdin, then becomes the fake with it.
    replay = (
        "import os, sys; data = sys.stdin.buffer.read(); r, w = os.pipe(); "
        "os.write(w, data); os.close(w); os.dup2(r, 0); os.execv(sys.argv[1], sys.argv[1:])"
    )
    with open(script, "w") as f:
        f.write(
            "#!/bin/sh\n"
            f'[ $# -eq 0 ] && exec "$PYTHON" -c \'{replay}\' "{fake_control_path()}"\n'
            f'exec "{fake_control_path()}" "$@"\n'
        )
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)

    async def scenario() -> None:
        d = daemon(state_dir, binary=script, channel_probe_timeout=0.3)
        await d.start()
        try:
            assert not d.channel_usable
            share = ShareLimits("share-a", GIB, 50)
            await d.apply(share, [share])
            legacy = fake_state(state_dir)["legacy"]
            assert isinstance(legacy, dict) and legacy["default_pct"] == 50
        finally:
            await d.stop()

    asyncio.run(scenario())


def test_pipelined_commands_answer_in_order_and_the_first_failure_raises(state_dir: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir)
        await d.start()
        try:
            share = ShareLimits("share-a", GIB, 50)
            answers = await d.run_all(
                [*cmd.render_legacy_apply(GPU, [share], []), SERVER_LIST, SERVER_LIST]
            )
            assert answers == ["50\n", "", "", ""]
            # The first runs, the second is refused (0 %): the error names the command.
            with pytest.raises(DaemonError, match=r"set_active_thread_percentage 999 0"):
                await d.run_all(
                    [
                        ControlCall(stdin="set_default_active_thread_percentage 30\n"),
                        ControlCall(stdin="set_active_thread_percentage 999 0\n"),
                    ]
                )
            legacy = fake_state(state_dir)["legacy"]
            assert isinstance(legacy, dict) and legacy["default_pct"] == 30
        finally:
            await d.stop()

    asyncio.run(scenario())
