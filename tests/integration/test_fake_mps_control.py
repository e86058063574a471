"""The fake ``nvidia-cuda-mps-control`` as NVIDIA documents the real one: in v3 mode
exactly the documented ``<module> <verb>`` forms, one command per process, and list
output in the documented format (docs:mpsv3-interface; NVIDIA Dynamo, "Per-GPU
Compute and Memory Limits with MPS")."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.mps_fifo import DAEMON_FILE, SLOTS_DIR
from dra_driver.mpsagent import listing

GPU = "GPU-00000000-1111-2222-3333-444444444444"


@dataclass
class Fake:
    env: dict[str, str]
    root: str = ""
    daemon: subprocess.Popen[bytes] | None = None
    control: str = field(default_factory=fake_control_path)
    """The control binary its commands run (the daemon is started with the packaged one)."""

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.control, *args],
            env=self.env,
            input=stdin or "",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def shell(self, *lines: str) -> subprocess.CompletedProcess[str]:
        """Legacy: ``lines`` on the interactive shell's stdin."""
        return self.run(stdin="".join(f"{line}\n" for line in lines))

    def shell_ok(self, *lines: str) -> str:
        done = self.shell(*lines)
        assert done.returncode == 0, (lines, done.stdout)
        return done.stdout

    def elsewhere(self, pipe: str) -> Fake:
        """This fake's commands run with ``pipe`` as their pipe directory."""
        return Fake({**self.env, "CUDA_MPS_PIPE_DIRECTORY": pipe}, self.root, self.daemon,
                    self.control)  # fmt: skip

    def through(self, control: str) -> Fake:
        """This fake's commands run through the control binary ``control``."""
        return Fake(self.env, self.root, self.daemon, control)


@contextlib.contextmanager
def _daemon(*flags: str, probe: tuple[str, ...] = ("server", "list")) -> Iterator[Fake]:
    """A fake daemon started with ``flags`` in a fresh pipe directory, until the block ends."""
    root = tempfile.mkdtemp(prefix="fkmps-", dir="/tmp")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log"),
        "CUDA_VISIBLE_DEVICES": GPU,
    }
    daemon = subprocess.Popen(
        [fake_control_path(), "-f", *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fake = Fake(env, root, daemon)
    deadline = time.monotonic() + 20
    while fake.run(*probe, stdin="get_server_list\n" if not probe else None).returncode != 0:
        assert time.monotonic() < deadline and daemon.poll() is None, "the fake did not start"
        time.sleep(0.05)
    try:
        yield fake
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def v3() -> Iterator[Fake]:
    with _daemon("-p", "3", "-m") as fake:
        yield fake


@pytest.fixture
def legacy() -> Iterator[Fake]:
    with _daemon(probe=()) as fake:
        yield fake


def test_v3_has_no_interactive_shell(v3: Fake) -> None:
    """MPS v3 "replaces the interactive shell of Legacy MPS v2" (docs:mpsv3-interface)."""
    for line in ("server list --format=csv,noheader\n", "get_server_list\n", "quit\n"):
        done = v3.run(stdin=line)
        assert done.returncode == 1, line
        assert "MPS v3" in done.stdout and "command line" in done.stdout, done.stdout
    assert v3.ok("server", "list") is not None  # the daemon is still there (no quit)


def test_namespace_list_prints_as_documented(v3: Fake) -> None:
    v3.ok("server", "create", "shares")
    v3.ok("server", "set", "shares", "--pinned-memory-limit=10G", "--active-thread-percentage=50")
    v3.ok("namespace", "create", "small", "--server=shares")
    # key=value without dashes is a documented form too.
    v3.ok("namespace", "set", "small", "server=shares", "pinned-memory-limit=20G",
          "--active-thread-percentage=30")  # fmt: skip
    table = v3.ok("namespace", "list", "--server=shares").splitlines()
    # The Dynamo guide's header and cells: "SERVER STATUS", "20G", "30.00".
    assert table[0].split()[:9] == [
        "NAME", "SERVER", "SERVER", "STATUS", "PINNED", "MEMORY", "LIMIT", "ACTIVE", "THREAD",
    ]  # fmt: skip
    assert table[2].split()[:5] == ["small", "shares", "Ready", "20G", "30.00"]
    assert table[1].split()[:5] == ["default", "shares", "Ready", "10G", "50.00"]
    csv = v3.ok("namespace", "list", "--server=shares", "--format=csv,noheader")
    assert csv.splitlines()[1].split(",")[:5] == ["small", "shares", "Ready", "20G", "30.00"]
    parsed = listing.parse_v3_namespace_list(csv)
    assert parsed.problems == () and [r.active_thread_percentage for r in parsed.rows] == [50, 30]
    assert v3.ok("namespace", "get", "small", "shares", "pinned-memory-limit") == "20G\n"
    assert v3.ok("server", "get", "shares", "status") == "Ready\n"


@pytest.mark.parametrize(
    "args",
    [
        ("namespace", "create", "a", "--server=shares", "--pinned-memory-limit=1G"),
        ("namespace", "delete", "a", "--server=shares", "--all"),
        ("namespace", "list", "--format=json"),
        ("namespace", "list", "a", "b"),
        ("namespace", "get", "default", "shares", "colour"),
        ("namespace", "set", "default", "--server=shares", "--client-priority=2"),
        ("server", "list", "--force"),
        ("server", "create", "shares", "--allowed-gpus=0"),
        ("server", "start", "shares"),
        ("namespace",),
        ("sm-partition", "list"),
        ("shares",),
    ],
    ids=" ".join,
)
def test_undocumented_v3_forms_are_refused(v3: Fake, args: tuple[str, ...]) -> None:
    v3.ok("server", "create", "shares")
    done = v3.run(*args)
    if args == ("namespace",):  # "<module> help" and a bare module print the usage
        assert done.returncode == 0 and "namespace create <name> --server=<s>" in done.stdout
        return
    assert done.returncode == 1, (args, done.stdout)
    assert done.stderr.startswith("Error:"), done.stderr


def test_the_documented_v3_forms_are_accepted(v3: Fake) -> None:
    v3.ok("server", "create", "shares", "--uid=0")
    v3.ok("server", "list", "shares", "--format=csv")
    v3.ok("namespace", "create", "a", "--server=shares")
    v3.ok("namespace", "set", "a", "--server=shares", "--client-priority=1")
    v3.ok("namespace", "list", "a", "--server=shares", "--format=table,noheader")
    v3.ok("client", "list", "--server=shares", "--all", "--format=csv,noheader")
    v3.ok("namespace", "delete", "a", "--server=shares", "--force")
    v3.ok("namespace", "help")
    v3.ok("server", "delete", "shares", "--force")
    v3.ok("-q")


def _server_rows(fake: Fake) -> dict[str, list[str]]:
    rows = [line.split(",") for line in fake.ok("server", "list", "--format=csv,noheader").split()]
    return {row[0]: row for row in rows}


# -- the control socket is the power (dra-facts 10.1 "Isolation") ------------------------


def test_whoever_reaches_the_v3_control_socket_commands_the_daemon(v3: Fake) -> None:
    """A command reaches the daemon through the ``control`` socket of the pipe directory it
    is given, whatever else that directory holds: here only a link to the socket, as a
    container given just the socket would have it. Through it: others' servers are
    listed, limits set, clients terminated, the daemon quit."""
    v3.ok("server", "create", "shares")
    v3.ok("namespace", "create", "a", "--server=shares")
    pid = v3.ok("--fake-client", "connect", "--uid", "1000", "--namespace", "a").strip()
    other = os.path.join(v3.root, "other")
    os.makedirs(other)
    os.symlink(os.path.join(v3.env["CUDA_MPS_PIPE_DIRECTORY"], "control"),
               os.path.join(other, "control"))  # fmt: skip
    there = v3.elsewhere(other)
    assert "shares" in _server_rows(there)
    there.ok("namespace", "set", "a", "--server=shares", "--active-thread-percentage=90")
    assert v3.ok("namespace", "get", "a", "shares", "active-thread-percentage") == "90.00\n"
    there.ok("client", "terminate", pid)
    assert pid not in v3.ok("client", "list")
    # The servers and namespaces live in the daemon's pipe directory, not the caller's.
    assert not os.path.exists(os.path.join(other, "shares"))
    there.ok("-q")
    assert v3.daemon is not None and v3.daemon.wait(10) == 0


def test_whoever_reaches_the_legacy_control_socket_commands_the_daemon(legacy: Fake) -> None:
    server = legacy.ok("--fake-client", "connect", "--uid", "0").strip()
    client = legacy.shell_ok(f"get_client_list {server}").strip()
    other = os.path.join(legacy.root, "other")
    os.makedirs(other)
    os.symlink(os.path.join(legacy.env["CUDA_MPS_PIPE_DIRECTORY"], "control"),
               os.path.join(other, "control"))  # fmt: skip
    there = legacy.elsewhere(other)
    there.shell_ok("set_default_active_thread_percentage 10", f"terminate_client {server} {client}")
    assert legacy.shell_ok("get_default_active_thread_percentage") == "10.0\n"
    assert legacy.shell_ok(f"get_client_list {server}") == ""
    there.shell_ok("quit")
    assert legacy.daemon is not None and legacy.daemon.wait(10) == 0


def _copy_as_cp_a(src: str, dst: str) -> None:
    """A file copied as ``cp -a`` copies it: a FIFO (the daemon's slots for the shell
    client) becomes a new FIFO, which nobody serves."""
    if stat.S_ISFIFO(os.lstat(src).st_mode):
        os.mkfifo(dst, 0o666)
    else:
        shutil.copy2(src, dst)


def test_without_the_control_socket_the_state_file_commands_nothing(
    v3: Fake, fifo_client: str
) -> None:
    """A copy of the daemon's files without its socket finds no daemon: not through
    the copied state, nor through copies of the FIFO slots (each FIFO client checks that
    the live daemon holds the directory it found)."""
    v3.ok("server", "create", "shares")
    # The daemon frees the command's slot (its lock file) just after the reply: a
    # copy made meanwhile would find the lock gone under it.
    slots = os.path.join(v3.env["CUDA_MPS_PIPE_DIRECTORY"], SLOTS_DIR)
    deadline = time.monotonic() + 10
    while any(name.endswith(".lock") for name in os.listdir(slots)):
        assert time.monotonic() < deadline, "a slot stayed taken"
        time.sleep(0.02)
    other = os.path.join(v3.root, "copy")
    shutil.copytree(
        v3.env["CUDA_MPS_PIPE_DIRECTORY"], other, ignore=shutil.ignore_patterns("control"),
        copy_function=_copy_as_cp_a,
    )  # fmt: skip
    assert os.path.exists(os.path.join(other, SLOTS_DIR, DAEMON_FILE))
    done = v3.elsewhere(other).through(fifo_client).run("server", "delete", "shares")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr
    assert "shares" in _server_rows(v3)


# -- v3 servers: name optional, the connecting user's ------------------------------------


def test_server_create_without_uid_is_the_connecting_users(v3: Fake) -> None:
    v3.ok("server", "create", "mine")
    assert _server_rows(v3)["mine"][1] == str(os.getuid())
    v3.ok("server", "create", "theirs", "--uid=4321")  # multiuser: any UID may be named
    assert _server_rows(v3)["theirs"][1] == "4321"


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")


@pytest.mark.skipif(
    os.getuid() != 0 or SYSTEM_PYTHON is None or shutil.which("setpriv") is None,
    reason="runs a command as another user: needs root, setpriv and a system python3",
)
def test_the_server_is_the_user_the_kernel_reports_for_the_socket(v3: Fake) -> None:
    """The owner is the peer's UID on the control socket (SO_PEERCRED), not the daemon's."""
    logs = os.path.join(v3.root, "guest-log")  # the command records itself there
    os.makedirs(logs)
    for folder, _, _ in os.walk(v3.root):
        os.chmod(folder, 0o777)
    os.chmod(os.path.join(v3.env["CUDA_MPS_PIPE_DIRECTORY"], "control"), 0o777)
    done = subprocess.run(
        ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups",
         fake_control_path(), "server", "create", "guest"],
        env={**v3.env, "PYTHON": str(SYSTEM_PYTHON), "CUDA_MPS_LOG_DIRECTORY": logs},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _server_rows(v3)["guest"][1] == "4242"


def test_server_create_without_a_name_as_the_quick_start_shows(v3: Fake) -> None:
    v3.ok("server", "create", "--uid=1234")  # "server create --uid=$UID"
    (name,) = [n for n, row in _server_rows(v3).items() if row[1] == "1234"]
    assert name.startswith("server_")
    assert v3.run("server", "create", "--uid=me").returncode == 1


# -- v3 namespaces: the default one is the server's; clients hold a namespace -----------


def test_namespace_set_default_is_refused(v3: Fake) -> None:
    v3.ok("server", "create", "shares")
    done = v3.run("namespace", "set", "default", "--server=shares", "--active-thread-percentage=5")
    assert done.returncode == 1 and "server set shares" in done.stderr
    v3.ok("server", "set", "shares", "--active-thread-percentage=5")
    assert v3.ok("namespace", "get", "default", "shares", "active-thread-percentage") == "5.00\n"


def test_namespace_delete_with_connected_clients_needs_force(v3: Fake) -> None:
    v3.ok("server", "create", "shares")
    v3.ok("namespace", "create", "busy", "--server=shares")
    v3.ok("namespace", "create", "idle", "--server=shares")
    first = v3.ok("--fake-client", "connect", "--uid", "1000", "--namespace", "busy").strip()
    second = v3.ok("--fake-client", "connect", "--uid", "1001", "--namespace", "busy",
                   "--server", "shares").strip()  # fmt: skip
    listed = v3.ok("client", "list", "--server=shares", "--format=csv,noheader").splitlines()
    assert sorted(row.split(",")[0] for row in listed) == sorted([first, second])
    assert v3.ok("client", "get", first, "namespace") == "busy\n"
    done = v3.run("namespace", "delete", "busy", "--server=shares")
    assert done.returncode == 1
    assert "'busy'" in done.stderr and "--force" in done.stderr and first in done.stderr
    assert "busy" in v3.ok("namespace", "list", "--server=shares")
    v3.ok("namespace", "delete", "idle", "--server=shares")  # no clients: no --force needed
    v3.ok("namespace", "delete", "busy", "--server=shares", "--force")
    assert v3.ok("client", "list", "--format=csv,noheader") == ""
    assert "busy" not in v3.ok("namespace", "list", "--server=shares")


def test_a_namespace_whose_clients_exited_deletes_without_force(v3: Fake) -> None:
    v3.ok("server", "create", "shares")
    v3.ok("namespace", "create", "a", "--server=shares")
    v3.ok("--fake-client", "connect", "--uid", "7", "--namespace", "a")
    v3.ok("--fake-client", "exit", "--uid", "7", "--namespace", "a")
    v3.ok("namespace", "delete", "a", "--server=shares")


def test_server_delete_with_connected_clients_needs_force(v3: Fake) -> None:
    v3.ok("server", "create", "shares")
    v3.ok("--fake-client", "connect", "--uid", "7", "--namespace", "default")
    done = v3.run("server", "delete", "shares")
    assert done.returncode == 1 and "--force" in done.stderr
    v3.ok("server", "delete", "shares", "--force")


@pytest.mark.parametrize(
    "args",
    [
        ("connect", "--uid", "7"),  # v3: a client connects through a namespace
        ("connect", "--uid", "7", "--namespace", "nowhere"),
        ("exit", "--uid", "7", "--namespace", "default"),  # nobody connected
        ("connect", "--uid", "x", "--namespace", "default"),
        ("leave", "--uid", "7", "--namespace", "default"),
    ],
    ids=" ".join,
)
def test_v3_fake_client_refusals(v3: Fake, args: tuple[str, ...]) -> None:
    v3.ok("server", "create", "shares")
    done = v3.run("--fake-client", *args)
    assert done.returncode == 1 and done.stderr.startswith("Error:"), done.stderr


def test_client_terminate_and_get_refuse_an_unknown_pid(v3: Fake) -> None:
    for args in (("client", "terminate", "99"), ("client", "get", "99", "pid")):
        assert v3.run(*args).returncode == 1


# -- legacy: the documented interactive commands -----------------------------------------


def test_documented_legacy_per_server_commands(legacy: Fake) -> None:
    server = legacy.ok("--fake-client", "connect", "--uid", "0").strip()
    legacy.ok("--fake-client", "connect", "--uid", "0")
    clients = legacy.shell_ok(f"get_client_list {server}").split()
    assert len(clients) == 2
    out = legacy.shell_ok(
        f"get_active_thread_percentage {server}",
        f"set_active_thread_percentage {server} 40",
        f"get_active_thread_percentage {server}",
        f"get_device_pinned_mem_limit {server} {GPU}",
        f"set_device_pinned_mem_limit {server} {GPU} 2G",
        f"get_device_pinned_mem_limit {server} {GPU}",
        f"terminate_client {server} {clients[0]}",
        f"get_client_list {server}",
    )
    assert out.splitlines() == ["100.0", "40", "40.0", "0M", "2G", clients[1]]


def test_legacy_default_client_priority(legacy: Fake) -> None:
    assert legacy.shell_ok("get_default_client_priority") == "0\n"
    assert legacy.shell_ok("set_default_client_priority 1", "get_default_client_priority") == "1\n"


def test_legacy_device_query_lists_the_daemons_devices(legacy: Fake) -> None:
    assert legacy.shell_ok("device_query") == f"0 {GPU}\n"


def test_legacy_static_partitions() -> None:
    with _daemon("-S", probe=()) as fake:
        part = fake.shell_ok(f"sm_partition add {GPU} 4").strip()
        assert fake.shell_ok("lspart") == f"{part} {GPU} 4\n"
        fake.shell_ok(f"sm_partition rm {part}")
        assert fake.shell_ok("lspart") == ""


def test_legacy_terminating_the_last_client_lets_a_waiting_user_in(legacy: Fake) -> None:
    server = legacy.ok("--fake-client", "connect", "--uid", "0").strip()
    assert legacy.ok("--fake-client", "connect", "--uid", "1000") == "pending\n"
    (client,) = legacy.shell_ok(f"get_client_list {server}").split()
    legacy.shell_ok(f"terminate_client {server} {client}")
    (new_server,) = legacy.shell_ok("get_server_list").split()
    assert (
        new_server != server and len(legacy.shell_ok(f"get_client_list {new_server}").split()) == 1
    )


@pytest.mark.parametrize(
    "line",
    [
        "get_active_thread_percentage 1",  # no such server
        "get_device_pinned_mem_limit 1 0",
        "terminate_client 1 2",
        "set_default_client_priority 2",
        "get_default_client_priority 0",
        "sm_partition add 0 4",  # the daemon was started without -S
        "sm_partition list",
        "lspart all",
        "device_query 0",
    ],
)
def test_legacy_refusals(legacy: Fake, line: str) -> None:
    done = legacy.shell(line)
    assert done.returncode == 1 and done.stdout.startswith("Error:"), done.stdout


def test_terminate_client_refuses_a_pid_that_is_not_the_servers_client(legacy: Fake) -> None:
    server = legacy.ok("--fake-client", "connect", "--uid", "0").strip()
    done = legacy.shell(f"terminate_client {server} 1")
    assert done.returncode == 1 and "no client with PID 1" in done.stdout


# -- the multiuser flag is each protocol's own --------------------------------------------


@pytest.mark.parametrize(
    "flags",
    [("-m",), ("--multiuser",), ("-p", "3", "-multiuser-server")],
    ids=" ".join,
)
def test_the_other_protocols_multiuser_flag_is_refused(flags: tuple[str, ...]) -> None:
    root = tempfile.mkdtemp(prefix="fkmps-", dir="/tmp")
    try:
        env = {**os.environ, "PYTHON": sys.executable,
               "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
               "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log")}  # fmt: skip
        done = subprocess.run([fake_control_path(), "-f", *flags], env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        assert done.returncode == 1 and "multiuser flag is" in done.stderr
        assert not os.path.exists(os.path.join(root, "pipe", "control"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_legacy_multiuser_flag_starts_a_multiuser_legacy_daemon() -> None:
    with _daemon("-multiuser-server", probe=()) as fake:
        with open(os.path.join(fake.env["CUDA_MPS_PIPE_DIRECTORY"], "fake-mps-state.json")) as f:
            state = json.load(f)
        assert (state["protocol"], state["multiuser"]) == (2, True)
