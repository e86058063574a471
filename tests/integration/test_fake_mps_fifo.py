"""The fake ``nvidia-cuda-mps-control``'s FIFO clients over the daemon's FIFO slots, the
sh launcher and the native (C) one alike: they answer as the Python client does, free their
slot however they end, find no daemon where there is none, and give way (native to sh, sh to
Python) where they cannot serve."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import pytest

from dra_driver.fakes import mps_control
from dra_driver.fakes.mps_control import fake_control_path, shell_control_path
from dra_driver.fakes.mps_fifo import (
    DAEMON_FILE,
    SLOT_COUNT,
    SLOTS_DIR,
    FifoAnswer,
    encode_answer,
)
from tests.integration.test_fake_mps_control import GPU, Fake, _daemon
from tests.support.fake_mps_clients import BUILD_SCRIPT, NativeBuild

NO_PYTHON = {"PYTHON": "/bin/false"}
"""A command that reaches the Python client fails: what works went over the FIFOs."""
NO_DAEMON = "Cannot find MPS control daemon process: the daemon closed the connection\n"
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.fixture
def v3() -> Iterator[Fake]:
    with _daemon("-p", "3", "-m") as fake:
        _wait_for_slots(fake)
        fake.ok("server", "create", "shares")
        yield fake


def _slots(fake: Fake) -> str:
    return os.path.join(fake.env["CUDA_MPS_PIPE_DIRECTORY"], SLOTS_DIR)


def _holds_request_fifo(pid: int) -> bool:
    """Has the FIFO client ``pid`` opened its slot's request FIFO?"""
    try:
        return any(
            os.readlink(f"/proc/{pid}/fd/{fd}").endswith(".req")
            for fd in os.listdir(f"/proc/{pid}/fd")
        )
    except OSError:
        return False


def _wait_for_slots(fake: Fake) -> None:
    """Until the daemon serves its FIFO slots: it answers on its control socket a
    moment before (the start's probe may have gone there), and a test that forbids
    the Python client must not race that."""
    _wait_for(lambda: os.path.exists(os.path.join(_slots(fake), DAEMON_FILE)))


def _fifo_only(fake: Fake, control: str | None = None) -> Fake:
    """``fake``'s commands through ``control`` (default: its own), with no Python client."""
    return Fake({**fake.env, **NO_PYTHON}, fake.root, fake.daemon, control or fake.control)


def _locks(fake: Fake) -> list[str]:
    return glob.glob(os.path.join(_slots(fake), "*.lock"))


def _wait_for(condition: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("answer", "shell", "framed"),
    [
        (FifoAnswer(True, "a\nb\n", False), False, b"oa\nob\nk\n"),
        (FifoAnswer(False, "Error: x\n", True), False, b"eError: x\nf\n"),
        (FifoAnswer(True, "no newline", False), False, b"Ono newline\nk\n"),
        (FifoAnswer(True, "", False), False, b"k\n"),
        (FifoAnswer(True, "", False, stop=True), True, b"K\n"),
        (FifoAnswer(False, "x\n", False, stop=True), True, b"ox\nF\n"),
        (FifoAnswer(True, "", False, stop=True), False, b"k\n"),  # stop is the shell's
    ],
    ids=[
        "stdout",
        "stderr",
        "partial-line",
        "empty",
        "shell-stop",
        "shell-stop-failed",
        "argv-ignores-stop",
    ],
)
def test_an_answer_is_framed_line_by_line(answer: FifoAnswer, shell: bool, framed: bytes) -> None:
    assert encode_answer(answer, shell) == framed


def _python_client(fake: Fake, *args: str) -> subprocess.CompletedProcess[str]:
    """The Python client (over the control socket), as the launcher ran it before."""
    return subprocess.run(
        [sys.executable, "-S", "-m", "dra_driver.fakes.mps_control", *args],
        env={**fake.env, "PYTHONPATH": os.getcwd()},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


AGENT_COMMANDS = [
    ("namespace", "create", "a", "--server=shares"),
    ("namespace", "set", "a", "--server=shares", "--pinned-memory-limit=4G",
     "--active-thread-percentage=25"),
    ("namespace", "list", "--format=csv"),
    ("namespace", "list", "--server=shares"),
    ("namespace", "get", "a", "shares", "pinned-memory-limit"),
    ("server", "list"),
    ("server", "list", "--format=csv,noheader"),
    ("namespace", "create", "a", "--server=shares"),  # refused: it exists
    ("namespace", "delete", "nope", "--server=shares"),
    ("server", "bogus"),
    ("namespace", "delete", "a", "--server=shares"),
]  # fmt: skip
"""The agent's v3 commands and refusals; the daemon's state ends as it began."""


def _answers_and_records(
    fake: Fake, run: Callable[[tuple[str, ...]], subprocess.CompletedProcess[str]]
) -> tuple[list[tuple[int, str, str]], list[dict[str, object]]]:
    """:data:`AGENT_COMMANDS` through ``run``: each exit status, stdout and stderr, and
    the command record's entries they made."""
    log = os.path.join(fake.root, "log", "fake-mps-commands.jsonl")
    with open(log) as f:
        before = len(f.readlines())
    answers = []
    for args in AGENT_COMMANDS:
        done = run(args)
        answers.append((done.returncode, done.stdout, done.stderr))
    with open(log) as f:
        records = [json.loads(line) for line in f.readlines()[before:]]
    kept = ("argv", "ok", "reply", "protocol", "daemon_pid")
    return answers, [{k: r.get(k) for k in kept} for r in records]


def test_each_fifo_client_answers_as_the_python_client(fifo_client: str) -> None:
    """The agent's commands through the FIFO client and through the Python client, to
    the same daemon in turn: the same output, exit statuses and record."""
    with _daemon("-p", "3", "-m") as fake:
        _wait_for_slots(fake)
        fake.ok("server", "create", "shares")
        fifo = _fifo_only(fake, fifo_client)
        over_fifos = _answers_and_records(fake, lambda args: fifo.run(*args))
        _wait_for(lambda: not _locks(fake))  # every slot freed (just after each reply)
        over_socket = _answers_and_records(fake, lambda args: _python_client(fake, *args))
    assert over_fifos == over_socket
    assert [code for code, _, _ in over_fifos[0]] == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert "shares" in over_fifos[0][5][1]


def test_a_client_killed_mid_command_frees_its_slot_and_leaves_no_reply_behind(
    v3: Fake, fifo_client: str
) -> None:
    slow = Fake({**v3.env, **NO_PYTHON, "FAKE_MPS_COMMAND_DELAY_S": "0.5"}, v3.root)
    proc = subprocess.Popen(
        [fifo_client, "server", "list"], env=slow.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Killed once it holds the request FIFO: killed between its lock and that open, a
    # client leaves the slot taken until the daemon restarts (said in the script).
    _wait_for(lambda: _holds_request_fifo(proc.pid))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _wait_for(lambda: not _locks(v3))  # freed once the daemon saw the client's end close
    # Every slot, taken in turn, answers its own command only.
    fifo = _fifo_only(v3, fifo_client)
    for i in range(2 * SLOT_COUNT):
        assert fifo.ok("namespace", "create", f"n{i}", "--server=shares") == ""
        assert fifo.ok("namespace", "get", f"n{i}", "shares", "name") == f"n{i}\n"


def test_a_daemon_killed_mid_command_ends_the_command_with_no_daemon(
    v3: Fake, fifo_client: str
) -> None:
    slow = Fake({**v3.env, **NO_PYTHON, "FAKE_MPS_COMMAND_DELAY_S": "30"}, v3.root)
    proc = subprocess.Popen(
        [fifo_client, "server", "list"], env=slow.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Once its FIFOs are open (before that, a daemon that dies can leave the client's
    # open of the reply FIFO waiting: the window the script names).
    _wait_for(lambda: _holds_request_fifo(proc.pid))
    assert v3.daemon is not None
    v3.daemon.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=10)  # not the 30 s of the delay: no hang
    assert proc.returncode == 1
    assert err == NO_DAEMON


def test_with_every_slot_taken_the_python_client_serves(v3: Fake, fifo_client: str) -> None:
    _wait_for(lambda: not _locks(v3))  # the daemon frees the fixture's slot just after
    for n in range(SLOT_COUNT):
        with open(os.path.join(_slots(v3), f"{n}.lock"), "x"):
            pass
    assert _fifo_only(v3, fifo_client).run("server", "list").returncode != 0
    assert "shares" in v3.through(fifo_client).ok("server", "list")


def test_after_quit_a_fifo_client_finds_no_daemon(v3: Fake, fifo_client: str) -> None:
    _fifo_only(v3, fifo_client).ok("-q")
    assert v3.daemon is not None and v3.daemon.wait(10) == 0
    assert not os.path.exists(_slots(v3))
    done = v3.through(fifo_client).run("server", "list")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr


def test_the_legacy_shell_over_fifos_answers_line_by_line(fifo_client: str) -> None:
    """No arguments: the interactive shell, which the native client hands to the sh one."""
    with _daemon(probe=()) as legacy:
        _wait_for_slots(legacy)
        done = _fifo_only(legacy, fifo_client).run(
            stdin="set_default_active_thread_percentage 10\n\nbogus\n"
            "get_default_active_thread_percentage"  # a last line without its newline
        )
        assert done.returncode == 1  # one line failed
        lines = done.stdout.splitlines()
        assert lines[0] == "10" or lines[0].startswith("10"), done.stdout
        assert "unknown command 'bogus'" in lines[1]
        assert lines[-1] == "10.0"
        assert _fifo_only(legacy, fifo_client).run(stdin="quit\n").returncode == 0
        assert legacy.daemon is not None and legacy.daemon.wait(10) == 0


# -- the native client: what it hands over, what it does better, which build is used ----


def _no_daemon_here(fake: Fake) -> Fake:
    """``fake``'s commands with a pipe directory no daemon serves."""
    return fake.elsewhere(os.path.join(fake.root, "nothing-here"))


def _every_slot_taken(fake: Fake) -> Fake:
    _wait_for(lambda: not _locks(fake))
    for n in range(SLOT_COUNT):
        with open(os.path.join(_slots(fake), f"{n}.lock"), "x"):
            pass
    return fake


HANDED_OVER: dict[str, tuple[tuple[str, ...], str | None, Callable[[Fake], Fake]]] = {
    "no-arguments": ((), "server list\n", lambda f: f),  # the (v3-refused) shell
    "version": (("-v",), None, lambda f: f),
    "version-long": (("server", "list", "--version"), None, lambda f: f),
    "daemon-flag": (("-d",), None, lambda f: f),  # answered: one is running
    "newline-argument": (("server", "create", "a\nb"), None, lambda f: f),
    "bad-protocol-env": (("server", "list"), None,
                         lambda f: Fake({**f.env, "CUDA_MPS_PROTOCOL_VERSION": "3x"}, f.root)),
    "bad-delay-env": (("server", "list"), None,
                      lambda f: Fake({**f.env, "FAKE_MPS_COMMAND_DELAY_S": "1.2.3"}, f.root)),
    "lone-dot-delay-env": (("server", "list"), None,
                           lambda f: Fake({**f.env, "FAKE_MPS_COMMAND_DELAY_S": "."}, f.root)),
    "no-daemon": (("server", "list"), None, _no_daemon_here),
    "every-slot-taken": (("server", "list"), None, _every_slot_taken),
}  # fmt: skip
"""What the native client does not serve itself: arguments, stdin, and how the case is
made from a running v3 daemon."""


@pytest.mark.parametrize("case", list(HANDED_OVER))
@pytest.mark.parametrize("python", ["with-python", "no-python"])
def test_what_the_native_client_hands_over_answers_as_the_sh_client(
    v3: Fake, native_build: NativeBuild, case: str, python: str
) -> None:
    """The same exit status, stdout and stderr as the sh client, with the Python client
    there and without it (then what went to Python fails alike: it was handed over)."""
    if native_build.path is None:
        pytest.skip(f"no native client: {native_build.why_not}")
    args, stdin, make = HANDED_OVER[case]
    fake = make(v3)
    if python == "no-python":
        fake = _fifo_only(fake)
    seen = []
    for control in (shell_control_path(), native_build.path):
        done = fake.through(control).run(*args, stdin=stdin)
        seen.append((done.returncode, done.stdout, done.stderr))
    assert seen[0] == seen[1]
    if python == "no-python" and case != "no-arguments":  # the shell is sh's own
        assert seen[1] == (1, "", ""), seen[1]  # it reached the Python client: /bin/false
    if python == "with-python" and case == "every-slot-taken":
        assert "shares" in seen[1][1]


def test_the_native_client_runs_the_sh_client_from_its_own_place(
    v3: Fake, native_build: NativeBuild, tmp_path: str
) -> None:
    """A moved build finds the sh client relative to itself; one with no sh client beside
    it says so instead of failing silently."""
    if native_build.path is None:
        pytest.skip(f"no native client: {native_build.why_not}")
    moved = os.path.join(str(tmp_path), "fakes", "native", "build", "nvidia-cuda-mps-control")
    os.makedirs(os.path.dirname(moved))
    shutil.copy2(native_build.path, moved)
    done = v3.through(moved).run("-v")
    assert done.returncode == 1 and "cannot run the sh client" in done.stderr, done.stderr
    assert v3.through(moved).ok("server", "list")  # the fast path needs no sh client
    os.symlink(os.path.dirname(shell_control_path()), os.path.join(str(tmp_path), "fakes", "bin"))
    assert "(fake" in v3.through(moved).ok("-v")


def test_a_daemon_gone_before_the_native_client_opens_its_fifos_is_no_hang(
    native_build: NativeBuild,
) -> None:
    """Slots that pass the liveness proof (this process holds the directory open and is
    named in the daemon file) but have no daemon behind their FIFOs: as if the daemon
    died between the proof and the client's open. The sh client would wait forever in
    that open (said in its script); the native one reads end of file: no daemon."""
    if native_build.path is None:
        pytest.skip(f"no native client: {native_build.why_not}")
    root = tempfile.mkdtemp(prefix="fkmps-", dir="/tmp")
    slots = os.path.join(root, "pipe", SLOTS_DIR)
    os.makedirs(slots, 0o700)
    for n in range(SLOT_COUNT):
        for suffix in ("req", "res"):
            os.mkfifo(os.path.join(slots, f"{n}.{suffix}"), 0o666)
    held = os.open(slots, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with open(os.path.join(slots, DAEMON_FILE), "w") as f:
            f.write(f"{os.getpid()} {held}\n")
        env = {**os.environ, **NO_PYTHON, "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe")}
        done = subprocess.run(
            [native_build.path, "server", "list"], env=env,
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        assert (done.returncode, done.stdout, done.stderr) == (1, "", NO_DAEMON)
        assert len(glob.glob(os.path.join(slots, "*.lock"))) == 1  # it got as far as a slot
    finally:
        os.close(held)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(
    os.getuid() != 0 or SYSTEM_PYTHON is None or shutil.which("setpriv") is None,
    reason="runs the daemon as another user: needs root, setpriv and a system python3",
)
def test_the_lock_files_owner_is_the_uid_the_daemon_takes(fifo_client: str) -> None:
    """The daemon runs as uid 4242, the client as root: a server created without
    ``--uid`` is root's, the owner of the lock file the client created (not the daemon's
    uid, nor anything the client says)."""
    root = tempfile.mkdtemp(prefix="fkmps-", dir="/tmp")
    os.chmod(root, 0o777)
    env = {
        **os.environ,
        "PYTHON": str(SYSTEM_PYTHON),
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log"),
        "CUDA_VISIBLE_DEVICES": GPU,
    }
    daemon = subprocess.Popen(
        ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups",
         shell_control_path(), "-f", "-p", "3", "-m"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        fake = Fake(env, root, daemon, fifo_client)
        _wait_for(lambda: daemon.poll() is not None or os.path.exists(
            os.path.join(_slots(fake), DAEMON_FILE)))  # fmt: skip
        assert daemon.poll() is None, "the daemon did not start as uid 4242"
        assert os.stat(_slots(fake)).st_uid == 4242
        _fifo_only(fake).ok("server", "create", "mine")
        rows = [r.split(",") for r in _fifo_only(fake).ok("server", "list", "--format=csv,noheader")
                .splitlines()]  # fmt: skip
        assert [row[:2] for row in rows] == [["mine", "0"]]
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def test_a_stale_native_build_is_not_chosen(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """fake_control_path() takes the native build only while it is an executable not
    older than its source; else the sh launcher."""
    source = os.path.join(str(tmp_path), "fifo_client.c")
    binary = os.path.join(str(tmp_path), "nvidia-cuda-mps-control")
    monkeypatch.setattr(mps_control, "NATIVE_SOURCE", source)
    monkeypatch.setattr(mps_control, "NATIVE_BUILD", binary)
    assert fake_control_path() == shell_control_path()  # nothing built
    for path in (source, binary):
        with open(path, "w") as f:
            f.write("x")
    os.chmod(binary, 0o755)
    os.utime(source, ns=(1_000_000_000, 1_000_000_000))
    os.utime(binary, ns=(1_000_000_000, 1_000_000_000))
    assert fake_control_path() == binary  # as new as its source
    os.utime(source, ns=(2_000_000_000, 2_000_000_000))
    assert fake_control_path() == shell_control_path()  # the source changed since
    os.utime(binary, ns=(3_000_000_000, 3_000_000_000))
    assert fake_control_path() == binary  # rebuilt
    os.chmod(binary, 0o644)
    assert fake_control_path() == shell_control_path()  # not executable
    os.chmod(binary, 0o755)
    os.unlink(source)
    assert fake_control_path() == shell_control_path()  # no source to judge it by


def run_build(out: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The build script into ``out`` with ``env`` added; it always exits 0."""
    done = subprocess.run(
        [BUILD_SCRIPT, out], env={**os.environ, **env},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done
    return done


def test_the_build_without_a_compiler_says_so_and_goes_on(tmp_path: str) -> None:
    out = os.path.join(str(tmp_path), "nvidia-cuda-mps-control")
    done = run_build(out, CC="no-such-cc")
    assert done.stderr.count("\n") == 1 and "no C compiler" in done.stderr, done.stderr
    assert not os.path.exists(out)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")
def test_the_build_of_a_broken_source_says_so_and_keeps_no_file(tmp_path: str) -> None:
    out = os.path.join(str(tmp_path), "nvidia-cuda-mps-control")
    done = run_build(out, CFLAGS="-DNOT_A_FLAG -include /nonexistent.h")
    assert done.stderr.count("\n") == 1 and "failed" in done.stderr, done.stderr
    assert os.listdir(str(tmp_path)) == []  # neither the output nor a temporary file
