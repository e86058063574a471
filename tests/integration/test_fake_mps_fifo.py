"""The fake ``nvidia-cuda-mps-control``'s shell client over the daemon's FIFO slots: it
answers as the Python client does, frees its slot however it ends, finds no daemon where
there is none, and gives way to the Python client when it cannot serve."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.mps_fifo import (
    DAEMON_FILE,
    SLOT_COUNT,
    SLOTS_DIR,
    FifoAnswer,
    encode_answer,
)
from tests.integration.test_fake_mps_control import Fake, _daemon

NO_PYTHON = {"PYTHON": "/bin/false"}
"""A command that reaches the Python client fails: what works went over the FIFOs."""


@pytest.fixture
def v3() -> Iterator[Fake]:
    with _daemon("-p", "3", "-m") as fake:
        _wait_for_slots(fake)
        fake.ok("server", "create", "shares")
        yield fake


def _slots(fake: Fake) -> str:
    return os.path.join(fake.env["CUDA_MPS_PIPE_DIRECTORY"], SLOTS_DIR)


def _holds_request_fifo(pid: int) -> bool:
    """Has the shell client ``pid`` opened its slot's request FIFO (its fd 3)?"""
    try:
        return os.readlink(f"/proc/{pid}/fd/3").endswith(".req")
    except OSError:
        return False


def _wait_for_slots(fake: Fake) -> None:
    """Until the daemon serves its FIFO slots: it answers on its control socket a
    moment before (the start's probe may have gone there), and a test that forbids
    the Python client must not race that."""
    _wait_for(lambda: os.path.exists(os.path.join(_slots(fake), DAEMON_FILE)))


def _fifo_only(fake: Fake) -> Fake:
    return Fake({**fake.env, **NO_PYTHON}, fake.root, fake.daemon)


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


def test_the_shell_client_answers_as_the_python_client() -> None:
    """The same commands, through each client to a daemon of its own: the same output,
    the same exit statuses, the same record."""
    commands = [
        ("namespace", "create", "a", "--server=shares"),
        ("namespace", "set", "a", "--server=shares", "--pinned-memory-limit=4G"),
        ("namespace", "list", "--format=csv"),
        ("namespace", "get", "a", "shares", "pinned-memory-limit"),
        ("namespace", "create", "a", "--server=shares"),  # refused: it exists
        ("namespace", "delete", "nope", "--server=shares"),
        ("server", "bogus"),
        ("namespace", "delete", "a", "--server=shares"),
    ]
    seen = []
    for client in ("fifo", "python"):
        with _daemon("-p", "3", "-m") as fake:
            _wait_for_slots(fake)
            fake.ok("server", "create", "shares")
            answers = []
            for args in commands:
                done = (
                    _fifo_only(fake).run(*args) if client == "fifo" else _python_client(fake, *args)
                )
                answers.append((done.returncode, done.stdout, done.stderr))
            with open(os.path.join(fake.root, "log", "fake-mps-commands.jsonl")) as f:
                records = [json.loads(line) for line in f]
            kept = ("argv", "ok", "reply", "protocol")
            # From the first command above (the start probes vary in number).
            ours = [r for r in records if "argv" in r]
            ours = ours[[r["argv"] for r in ours].index(list(commands[0])) :]
            recorded = [{k: r.get(k) for k in kept} for r in ours]
            seen.append(json.loads(json.dumps((answers, recorded)).replace(fake.root, "<root>")))
            _wait_for(lambda: not _locks(fake))  # every slot freed (just after each reply)
    assert seen[0] == seen[1]
    assert [code for code, _, _ in seen[0][0]] == [0, 0, 0, 0, 1, 1, 1, 0]


def test_a_client_killed_mid_command_frees_its_slot_and_leaves_no_reply_behind(
    v3: Fake,
) -> None:
    slow = Fake({**v3.env, **NO_PYTHON, "FAKE_MPS_COMMAND_DELAY_S": "0.5"}, v3.root)
    proc = subprocess.Popen(
        [fake_control_path(), "server", "list"], env=slow.env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Killed once it holds the request FIFO: killed between its lock and that open, a
    # client leaves the slot taken until the daemon restarts (said in the script).
    _wait_for(lambda: _holds_request_fifo(proc.pid))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _wait_for(lambda: not _locks(v3))  # freed once the daemon saw the client's end close
    # Every slot, taken in turn, answers its own command only.
    fifo = _fifo_only(v3)
    for i in range(2 * SLOT_COUNT):
        assert fifo.ok("namespace", "create", f"n{i}", "--server=shares") == ""
        assert fifo.ok("namespace", "get", f"n{i}", "shares", "name") == f"n{i}\n"


def test_a_daemon_killed_mid_command_ends_the_command_with_no_daemon(v3: Fake) -> None:
    slow = Fake({**v3.env, **NO_PYTHON, "FAKE_MPS_COMMAND_DELAY_S": "30"}, v3.root)
    proc = subprocess.Popen(
        [fake_control_path(), "server", "list"], env=slow.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # Once its FIFOs are open (before that, a daemon that dies can leave the client's
    # open of the reply FIFO waiting: the window the script names).
    _wait_for(lambda: _holds_request_fifo(proc.pid))
    assert v3.daemon is not None
    v3.daemon.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=10)  # not the 30 s of the delay: no hang
    assert proc.returncode == 1
    assert "Cannot find MPS control daemon" in err


def test_with_every_slot_taken_the_python_client_serves(v3: Fake) -> None:
    _wait_for(lambda: not _locks(v3))  # the daemon frees the fixture's slot just after
    for n in range(SLOT_COUNT):
        with open(os.path.join(_slots(v3), f"{n}.lock"), "x"):
            pass
    assert _fifo_only(v3).run("server", "list").returncode != 0
    assert "shares" in v3.ok("server", "list")


def test_after_quit_the_shell_client_finds_no_daemon(v3: Fake) -> None:
    _fifo_only(v3).ok("-q")
    assert v3.daemon is not None and v3.daemon.wait(10) == 0
    assert not os.path.exists(_slots(v3))
    done = v3.run("server", "list")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr


def test_the_legacy_shell_over_fifos_answers_line_by_line() -> None:
    with _daemon(probe=()) as legacy:
        _wait_for_slots(legacy)
        done = _fifo_only(legacy).run(
            stdin="set_default_active_thread_percentage 10\n\nbogus\n"
            "get_default_active_thread_percentage"  # a last line without its newline
        )
        assert done.returncode == 1  # one line failed
        lines = done.stdout.splitlines()
        assert lines[0] == "10" or lines[0].startswith("10"), done.stdout
        assert "unknown command 'bogus'" in lines[1]
        assert lines[-1] == "10.0"
        assert _fifo_only(legacy).run(stdin="quit\n").returncode == 0
        assert legacy.daemon is not None and legacy.daemon.wait(10) == 0
