"""One control command on the event loop (``mpsagent.command_process``): real child
processes, on the pidfd path (output into memfds, only the exit watched) and on
asyncio's (where no pidfd or no memfd can be had); a command that overruns is killed
and reaped, a missing binary is refused as before, and the pidfd path starts no
thread, watches one descriptor per command and leaves none behind."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.mpsagent import command_process
from dra_driver.mpsagent.command_process import Finished, encode_env, run_command
from dra_driver.mpsagent.commands import ControlCall
from dra_driver.mpsagent.daemon_control import DaemonControl
from dra_driver.mpsagent.daemon_files import DaemonError

ENV = encode_env({"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GREETING": "hello"})


@pytest.fixture(params=["pidfd", "asyncio"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test on both paths: the asyncio one as a kernel without pidfd_open gets."""
    if request.param == "asyncio":
        monkeypatch.setattr(command_process, "pidfd_supported", lambda: False)
    else:
        assert command_process.pidfd_supported(), "this Linux gives no pidfd"
    yield request.param


def run(argv: list[str], stdin: bytes | None = None, timeout: float = 10.0) -> Finished:
    return asyncio.run(run_command(argv, ENV, stdin, timeout))


def gone(pid: int) -> bool:
    """No such process, not even a zombie (a zombie still has its /proc entry)."""
    return not os.path.exists(f"/proc/{pid}")


def test_output_and_exit_status_come_back_apart(path: str) -> None:
    done = run(["sh", "-c", 'echo "out $GREETING"; echo err >&2; exit 3'])
    assert done == Finished(3, b"out hello\n", b"err\n")


def test_a_command_without_input_reads_end_of_file(path: str) -> None:
    assert run(["cat"]) == Finished(0, b"", b"")


def test_stdin_reaches_the_command(path: str) -> None:
    assert run(["cat"], b"get_server_list\n") == Finished(0, b"get_server_list\n", b"")


def test_input_larger_than_a_pipe_is_written_as_the_child_reads(path: str) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: far more than a pipe holds
    done = run(["cat"], data)
    assert (done.returncode, len(done.stdout), done.stdout == data) == (0, len(data), True)


def test_a_child_that_does_not_read_its_input_ends_normally(path: str) -> None:
    assert run(["sh", "-c", "exit 0"], b"x" * (1 << 20)) == Finished(0, b"", b"")


def test_a_command_killed_by_a_signal_reports_it(path: str) -> None:
    assert run(["sh", "-c", "kill -9 $$"]).returncode == -9


@pytest.mark.parametrize("stdin", [b"in\n", None], ids=["input", "no-input"])
def test_a_hung_command_is_killed_and_reaped(
    path: str, tmp_path: Path, stdin: bytes | None
) -> None:
    pidfile = tmp_path / "pid"
    fds = set(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], stdin, timeout=0.5)
    assert time.monotonic() - started < 5, "not killed at its timeout"
    pid = int(pidfile.read_text())
    assert gone(pid), f"pid {pid} left behind: {Path(f'/proc/{pid}/stat').read_text()}"
    assert set(os.listdir("/proc/self/fd")) <= fds, "a memfd, pipe or pidfd left open"


def test_a_cancelled_command_is_killed_and_reaped(path: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"

    async def scenario() -> int:
        task = asyncio.create_task(
            run_command(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], ENV, None, 30)
        )
        while not pidfile.exists() or not pidfile.read_text().strip():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        pid = int(pidfile.read_text())
        for _ in range(200):  # the exit watch reaps it when the kill lands
            if gone(pid):
                break
            await asyncio.sleep(0.01)
        return pid

    fds = set(os.listdir("/proc/self/fd"))
    pid = asyncio.run(scenario())
    assert gone(pid)
    assert set(os.listdir("/proc/self/fd")) <= fds, "a memfd, pipe or pidfd left open"


def test_the_pidfd_path_starts_no_thread_and_leaves_no_descriptor() -> None:
    """Sampled every millisecond while 40 commands run (20 at once, 20 in turn); a
    thread of an earlier test that ends meanwhile is no concern of this one."""
    assert command_process.pidfd_supported()
    earlier = set(threading.enumerate())
    started: set[str] = set()

    async def scenario() -> list[Finished]:
        loop = asyncio.get_running_loop()
        handle = None

        def sample() -> None:
            nonlocal handle
            started.update(t.name for t in threading.enumerate() if t not in earlier)
            handle = loop.call_later(0.001, sample)

        sample()
        try:
            together = await asyncio.gather(
                *(run_command(["sh", "-c", f"echo {i}"], ENV, None, 10) for i in range(20))
            )
            apart = [await run_command(["echo", str(i)], ENV, b"", 10) for i in range(20)]
        finally:
            assert handle is not None
            handle.cancel()
        return [*together, *apart]

    fds = set(os.listdir("/proc/self/fd"))
    results = asyncio.run(scenario())
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in (*range(20), *range(20))]
    assert started == set(), f"threads started for the commands: {sorted(started)}"
    assert set(os.listdir("/proc/self/fd")) <= fds, "a pipe or pidfd left open"


def test_a_missing_binary_is_refused_as_on_asyncios_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's DaemonError names the binary and the OS's error, as before."""
    missing = str(tmp_path / "nvidia-cuda-mps-control")
    control = DaemonControl(
        "GPU-0",
        missing,
        {"PATH": "/usr/bin:/bin"},
        "v3",
        shm_dir=str(tmp_path),
        shm_namespace=None,
        command_timeout=5,
        control_channel=False,
        channel_probe_timeout=1,
    )
    call = ControlCall(args=("-v",))

    def refusal() -> str:
        with pytest.raises(DaemonError) as caught:
            asyncio.run(control.run_process(call))
        return str(caught.value)

    lean = refusal()
    monkeypatch.setattr(command_process, "pidfd_supported", lambda: False)
    assert lean == refusal()
    assert lean == f"cannot run {missing!r}: [Errno 2] No such file or directory: {missing!r}"


def test_a_hung_control_command_is_reported_as_before(tmp_path: Path) -> None:
    hangs = tmp_path / "nvidia-cuda-mps-control"
    hangs.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    hangs.chmod(0o755)
    control = DaemonControl(
        "GPU-0",
        str(hangs),
        {"PATH": "/usr/bin:/bin"},
        "legacy",
        shm_dir=str(tmp_path),
        shm_namespace=None,
        command_timeout=0.3,
        control_channel=False,
        channel_probe_timeout=1,
    )
    with pytest.raises(DaemonError, match=r"^GPU GPU-0: `.*` timed out after 0.3s$"):
        asyncio.run(control.run_process(ControlCall(stdin="get_server_list\n")))


def test_a_command_gets_its_three_descriptors_and_nothing_else(path: str) -> None:
    """Not even one the agent inherited without close-on-exec (``posix_spawn`` closes
    nothing itself): a control command must not hold the agent's sockets or files."""
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    command_process._inherited_made_cloexec.cache_clear()  # as at the agent's start
    try:
        done = run(["sh", "-c", "ls /proc/$$/fd"])
    finally:
        os.close(leaked)
    assert done.returncode == 0, done
    assert sorted(done.stdout.split()) == [b"0", b"1", b"2"]


def large_output(tmp_path: Path) -> tuple[list[str], bytes, bytes]:
    """A command writing 1 MiB to stdout and another, unlike it, to stderr: far more
    than a pipe holds, in one write each as ``cat`` makes them."""
    out = bytes(range(256)) * 4096
    err = bytes(reversed(range(256))) * 4096
    (tmp_path / "out").write_bytes(out)
    (tmp_path / "err").write_bytes(err)
    return ["sh", "-c", f"cat {tmp_path / 'out'}; cat {tmp_path / 'err'} >&2"], out, err


def test_large_output_comes_back_whole_and_apart(path: str, tmp_path: Path) -> None:
    argv, out, err = large_output(tmp_path)
    done = run(argv)
    assert (done.returncode, len(done.stdout), len(done.stderr)) == (0, len(out), len(err))
    assert (done.stdout == out, done.stderr == err) == (True, True)


def test_output_interleaved_on_both_streams_stays_apart(path: str) -> None:
    script = 'i=0; while [ $i -lt 300 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done'
    done = run(["sh", "-c", script])
    assert done.stdout == b"".join(b"out %d\n" % i for i in range(300))
    assert done.stderr == b"".join(b"err %d\n" % i for i in range(300))


def run_noting_watches(
    argv: list[str], stdin: bytes | None = None, timeout: float = 10.0
) -> tuple[Finished, list[str]]:
    """The command's result, and what the loop was asked to watch, in order: each
    ``add_reader``/``add_writer`` as its kind and what the descriptor is."""
    watched: list[str] = []

    async def scenario() -> Finished:
        loop = asyncio.get_running_loop()
        add_reader, add_writer = loop.add_reader, loop.add_writer

        def what(fd: int) -> str:
            target = os.readlink(f"/proc/self/fd/{fd}")
            return "pidfd" if target == "anon_inode:[pidfd]" else target.split(":")[0]

        def noting_reader(fd: int, callback: Callable[..., object], *args: object) -> None:
            watched.append(f"reader {what(fd)}")
            add_reader(fd, callback, *args)

        def noting_writer(fd: int, callback: Callable[..., object], *args: object) -> None:
            watched.append(f"writer {what(fd)}")
            add_writer(fd, callback, *args)

        loop.add_reader = noting_reader  # type: ignore[method-assign,assignment]
        loop.add_writer = noting_writer  # type: ignore[method-assign,assignment]
        return await run_command(argv, ENV, stdin, timeout)

    return asyncio.run(scenario()), watched


@pytest.mark.parametrize(
    ("stdin", "expected"),
    [(None, ["reader pidfd"]), (b"x" * (1 << 20), ["reader pidfd", "writer pipe"])],
    ids=["no-input", "input-larger-than-a-pipe"],
)
def test_only_the_exit_is_watched(tmp_path: Path, stdin: bytes | None, expected: list[str]) -> None:
    """Output as large as a pipe's buffer many times over, yet one reader on the
    loop (the pidfd), and a writer only for an input the pipe cannot take at once."""
    argv, out, err = large_output(tmp_path)
    if stdin is not None:
        argv = ["sh", "-c", f"cat > /dev/null; {argv[2]}"]
    done, watched = run_noting_watches(argv, stdin)
    assert (done.returncode, done.stdout == out, done.stderr == err) == (0, True, True)
    assert watched == expected


def test_a_grandchild_holding_stdout_does_not_hold_the_call(tmp_path: Path) -> None:
    """The call ends at the child's exit, with what the child wrote: a grandchild
    that keeps stdout and stderr (and writes on) is no longer waited for, as it was
    while the output came through pipes read to end of file."""
    pidfile = tmp_path / "grandchild"
    script = f"echo child; echo oops >&2; (sleep 30; echo late) & echo $! > {pidfile}; exit 7"
    fds = set(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    try:
        done = run(["sh", "-c", script])
        took = time.monotonic() - started
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert done == Finished(7, b"child\n", b"oops\n")
    assert took < 5, f"{took:.1f} s: the call waited for the grandchild"
    assert set(os.listdir("/proc/self/fd")) <= fds, "a memfd or pidfd left open"


def test_a_child_that_closes_its_output_and_runs_on_is_waited_for(tmp_path: Path) -> None:
    """Its output closed, the child still runs: the call waits for its exit (through
    the pidfd), with what it wrote before and its status; it is reaped."""
    pidfile = tmp_path / "pid"
    argv = ["sh", "-c", f"echo $$ > {pidfile}; echo early; exec >&- 2>&-; sleep 0.3; exit 5"]
    started = time.monotonic()
    done = run(argv)
    assert time.monotonic() - started >= 0.3
    assert done == Finished(5, b"early\n", b"")
    assert gone(int(pidfile.read_text()))


def test_a_child_that_closes_its_output_and_hangs_is_killed_and_reaped(tmp_path: Path) -> None:
    """Its output closed, the child still runs: the timeout kills it through the
    pidfd held since its start, and the watch reaps it."""
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run(["sh", "-c", f"echo $$ > {pidfile}; exec >&- 2>&-; exec sleep 30"], timeout=0.5)
    assert time.monotonic() - started < 5, "not killed at its timeout"
    pid = int(pidfile.read_text())
    assert gone(pid), f"pid {pid} left behind"


@pytest.fixture
def probes_again() -> Iterator[None]:
    """The kernel asked afresh, before and after: the answers are cached per process."""
    command_process.memfd_supported.cache_clear()
    command_process.pidfd_supported.cache_clear()
    yield
    command_process.memfd_supported.cache_clear()
    command_process.pidfd_supported.cache_clear()


def refuse_memfd(*_: object) -> int:
    """What a seccomp filter that refuses the call makes of ``memfd_create``."""
    raise PermissionError(1, "Operation not permitted")


@pytest.mark.parametrize("how", ["refused", "missing"])
def test_without_memfd_commands_run_on_asyncios_path_with_one_warning(
    how: str,
    probes_again: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if how == "refused":
        monkeypatch.setattr(os, "memfd_create", refuse_memfd)
    else:
        monkeypatch.delattr(os, "memfd_create")
    on_asyncio: list[list[str]] = []
    asyncio_path = command_process.run_command_asyncio

    async def noting(argv: list[str], *args: Any) -> Finished:
        on_asyncio.append(argv)
        return await asyncio_path(argv, *args)

    monkeypatch.setattr(command_process, "run_command_asyncio", noting)
    with caplog.at_level(logging.WARNING, logger=command_process.__name__):
        done = [run(["echo", str(i)]) for i in range(2)]
    assert done == [Finished(0, b"0\n", b""), Finished(0, b"1\n", b"")]
    assert on_asyncio == [["echo", "0"], ["echo", "1"]]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "memfd_create" in warnings[0] and "asyncio's path" in warnings[0]
