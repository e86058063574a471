"""One control command on the event loop (``mpsagent.command_process``): real child
processes, on the pidfd path and on asyncio's (where no pidfd can be had); a command
that overruns is killed and reaped, a missing binary is refused as before, and the
pidfd path starts no thread and leaves no descriptor behind."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

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


def test_a_hung_command_is_killed_and_reaped(path: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"], b"in\n", timeout=0.5)
    pid = int(pidfile.read_text())
    assert gone(pid), f"pid {pid} left behind: {Path(f'/proc/{pid}/stat').read_text()}"


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

    pid = asyncio.run(scenario())
    assert gone(pid)


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


def run_noting_pidfd_watches(argv: list[str], timeout: float = 10.0) -> tuple[Finished, int]:
    """The command's result, and how many pidfds the loop was asked to watch."""
    watched: list[int] = []

    async def scenario() -> Finished:
        loop = asyncio.get_running_loop()
        add_reader = loop.add_reader

        def noting(fd: int, callback: Callable[..., object], *args: object) -> None:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[pidfd]":
                watched.append(fd)
            add_reader(fd, callback, *args)

        loop.add_reader = noting  # type: ignore[method-assign,assignment]
        return await run_command(argv, ENV, None, timeout)

    return asyncio.run(scenario()), len(watched)


def test_a_child_exited_when_its_pipes_close_is_reaped_with_no_pidfd_watch() -> None:
    """Its pipes held open by a grandchild, the command has long exited when they
    reach end of file: it is reaped then, its status kept, the loop never asked to
    watch its pidfd, and nothing left open."""
    fds = set(os.listdir("/proc/self/fd"))
    done, watches = run_noting_pidfd_watches(["sh", "-c", "(sleep 0.3) & exit 7"])
    assert done == Finished(7, b"", b"")
    assert watches == 0
    assert set(os.listdir("/proc/self/fd")) <= fds, "a pipe or pidfd left open"


def test_a_child_that_closes_its_pipes_and_runs_on_is_waited_for_by_its_pidfd(
    tmp_path: Path,
) -> None:
    """End of file on both pipes is not the exit: a child still running then is
    watched through its pidfd, and its status comes from there."""
    pidfile = tmp_path / "pid"
    argv = ["sh", "-c", f"echo $$ > {pidfile}; exec >&- 2>&-; sleep 0.3; exit 5"]
    done, watches = run_noting_pidfd_watches(argv)
    assert (done, watches) == (Finished(5, b"", b""), 1)
    assert gone(int(pidfile.read_text()))


def test_a_child_that_closes_its_pipes_and_hangs_is_killed_and_reaped(tmp_path: Path) -> None:
    """Its pipes at end of file, the child still runs: the timeout kills it through
    the pidfd held since its start, and the watch reaps it."""
    pidfile = tmp_path / "pid"
    with pytest.raises(TimeoutError):
        run(["sh", "-c", f"echo $$ > {pidfile}; exec >&- 2>&-; exec sleep 30"], timeout=0.5)
    pid = int(pidfile.read_text())
    assert gone(pid), f"pid {pid} left behind"
