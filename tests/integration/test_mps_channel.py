"""The persistent control channel: one control shell per MPS daemon, real processes
(the fake ``nvidia-cuda-mps-control``), restarted when it dies or hangs, and a
fallback to one process per command when a shell does not answer as expected."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from dra_driver.fakes.mps_control import DELAY_ENV, fake_control_path
from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import listing
from dra_driver.mpsagent.commands import ShareLimits
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.daemon import DaemonError, MpsDaemon

GPU = "GPU-00000000-1111-2222-3333-444444444444"
GIB = 1 << 30


@pytest.fixture
def state_dir() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="mpsch-", dir="/tmp")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def daemon(state_dir: str, protocol: str = "v3", binary: str = "", **kw: object) -> MpsDaemon:
    env = {**os.environ, "PYTHON": sys.executable, **kw.pop("env", {})}  # type: ignore[dict-item]
    return MpsDaemon(
        GPU,
        state_dir,
        binary or fake_control_path(),
        "v3" if protocol == "v3" else "legacy",
        FakeComputeMode(),
        base_env=env,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("protocol", ["v3", "legacy"])
def test_commands_share_one_long_lived_shell(state_dir: str, protocol: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir, protocol)
        await d.start()
        try:
            shell, starts = d.channel.pid, d.channel.starts
            assert shell is not None
            shares = [ShareLimits(f"share-{i}", GIB, 10 + i) for i in range(10)]
            started = time.perf_counter()
            for i, share in enumerate(shares):
                await d.apply(share, shares[: i + 1])
            per_command = (time.perf_counter() - started) / len(shares)
            assert d.channel.pid == shell and d.channel.starts == starts
            # An interpreter start per command costs tens of ms; the shell, a few.
            assert per_command < 0.1, per_command
            if protocol == "v3":
                rows = listing.parse_v3_namespace_list(await d.run(cmd.v3_namespace_list())).rows
                held = {r.name: r.active_thread_percentage for r in rows}
                assert held[shares[3].namespace] == 13 and len(held) == 11  # + default
        finally:
            await d.stop()
        assert not d.channel.open

    asyncio.run(scenario())


def test_a_dead_shell_is_restarted_at_the_next_command(state_dir: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir)
        await d.start()
        try:
            first, starts = d.channel.pid, d.channel.starts
            assert first is not None
            os.kill(first, 9)
            await asyncio.sleep(0.05)
            await d.run(cmd.v3_server_list())
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
            # From now on the shell's daemon takes 1 s per command; we wait 0.3 s.
            d.channel.env[DELAY_ENV] = "1"
            d.channel.timeout = 0.3
            await d.channel.close()
            started = time.perf_counter()
            with pytest.raises(DaemonError, match="no answer"):
                await d.run(cmd.v3_server_create())
            assert time.perf_counter() - started < 0.9
            assert not d.channel.open
            del d.channel.env[DELAY_ENV]
            d.channel.timeout = 5.0
            assert cmd.SERVER_NAME in list(
                listing.parse_v3_server_names(await d.run(cmd.v3_server_list())).names
            )
            assert d.channel.starts == starts + 2
        finally:
            await d.stop()

    asyncio.run(scenario())


def test_a_shell_that_does_not_frame_answers_falls_back_to_processes(state_dir: str) -> None:
    """A control binary whose shell reads stdin but never answers (the real one's
    framing is gpu-unverified): the daemon notices at its first probe."""
    script = os.path.join(state_dir, "mute-shell")
    with open(script, "w") as f:
        f.write(
            f'#!/bin/sh\n[ $# -eq 0 ] && exec cat >/dev/null\nexec "{fake_control_path()}" "$@"\n'
        )
    os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR)

    async def scenario() -> None:
        d = daemon(state_dir, binary=script, channel_probe_timeout=0.3)
        await d.start()
        try:
            assert not d.channel_usable
            share = ShareLimits("share-a", GIB, 50)
            await d.apply(share, [share])
            rows = listing.parse_v3_namespace_list(await d.run(cmd.v3_namespace_list())).rows
            assert share.namespace in {r.name for r in rows}
        finally:
            await d.stop()

    asyncio.run(scenario())


def test_pipelined_commands_answer_in_order_and_the_first_failure_raises(state_dir: str) -> None:
    async def scenario() -> None:
        d = daemon(state_dir)
        await d.start()
        try:
            await d.run(cmd.v3_server_create())
            good, bad = ShareLimits("share-a", GIB, 50), ShareLimits("share-b", GIB, 0)
            answers = await d.run_all(
                [*cmd.render_v3_apply(good, False), cmd.v3_namespace_list(), cmd.v3_server_list()]
            )
            assert answers[:2] == ["", ""]
            assert good.namespace in {
                r.name for r in listing.parse_v3_namespace_list(answers[2]).rows
            }
            assert list(listing.parse_v3_server_names(answers[3]).names) == [cmd.SERVER_NAME]
            # create runs, set is refused (0 %): the error names the command that failed.
            with pytest.raises(DaemonError, match=r"namespace set s_share_b.*1-100"):
                await d.run_all(cmd.render_v3_apply(bad, False))
            rows = listing.parse_v3_namespace_list(await d.run(cmd.v3_namespace_list())).rows
            assert bad.namespace in {r.name for r in rows}
        finally:
            await d.stop()

    asyncio.run(scenario())
