"""A fake ``nvidia-cuda-mps-control`` for tests and ``--backend fake`` (stdlib only).

Run through the shipped ``dra_driver/fakes/bin/nvidia-cuda-mps-control``: a
POSIX sh client that starts as a native binary does and reaches the daemon over
the FIFO slots it serves (:mod:`.mps_fifo`), running this module (``python -m
dra_driver.fakes.mps_control``, the Python client, over the control socket) for
the daemon itself and whatever it cannot frame. Where a C compiler built it
(``hack/build-fake-mps-client.sh``), a native client (``fakes/native/fifo_client.c``)
speaks the sh client's fast path for a command line and hands the rest to the sh
one (:func:`fake_control_path` picks it). All clients end in the same
code in the daemon (:func:`_one`), so they answer and record alike. It speaks both
protocols as the NVIDIA docs describe them (docs.nvidia.com/deploy/mps, release
615/620: "Legacy MPS v2 Interface", "MPS v3 Interface", "MPS v3 Namespaces"):

* ``-d`` / ``-f``: the control daemon (background / foreground). ``-p 3`` or
  ``CUDA_MPS_PROTOCOL_VERSION=3`` (the variable wins) selects v3. Multiuser mode
  is each protocol's own flag: ``-m``/``--multiuser`` for v3
  (docs:mpsv3-interface "Control Daemon Options"), ``-multiuser-server`` for
  legacy (docs:mpsv2-interface; dra-facts 10.1); the other protocol's flag is
  refused (exit 1). ``-S``/``--static-partitioning`` (docs:mpsv2-interface)
  allows ``sm_partition``. It listens on a unix socket ``control`` in the pipe
  directory and writes ``nvidia-cuda-mps-control.pid`` there, and keeps its
  state (servers, namespaces, limits, clients) in ``fake-mps-state.json`` there
  (tests read it). A daemon that starts finds no state from a dead predecessor:
  like the real one, what it held dies with it.

The control socket is the daemon's interface, as for the real one: a
command connects to ``$CUDA_MPS_PIPE_DIRECTORY/control`` (the pipe directory
*it* was given), sends its command line (or shell line) over that socket, and
the daemon runs it against its own state in its own pipe directory and
answers. (The FIFO slots beside it, ``fifo-control/``, mode 0700, are the same
power by another door, for the shell client: the caller's UID comes from the
kernel there too, as the owner of the slot's lock file it created.) So whoever
reaches that socket, by any path (a link, a bind mount),
commands the daemon: quit, set limits, terminate clients, list every server
(dra-facts 10.1 "Isolation": "a user with sufficient permissions", and
multiuser mode disregards isolation between users); a copy of the pipe
directory without the socket commands nothing. The daemon takes the connecting
user from the kernel (``SO_PEERCRED`` on the socket), never from the command.
The wire format between the fake's command and its daemon is the fake's own.

Sockets: the fake binds real unix sockets where the real daemon and server do
(dra-facts 10.1; docs:mpsv3-namespaces "Namespace Routing"): the daemon's
``<pipe>/control``, and in v3 ``<pipe>/<server>/control``,
``<pipe>/<server>/default/control`` and ``<pipe>/<server>/<namespace>/control``.
So a path over 107 bytes fails as the kernel fails it (``OSError: AF_UNIX path
too long``): the daemon exits 1 with the error on stderr, a ``server create`` or
``namespace create`` is refused and creates nothing. How the real daemon and
server report a socket they cannot bind is not documented; these replies are
the fake's. The fake has no server processes: a server's and a namespace's
sockets are bound by the command that creates them and nobody listens on them
(a client connecting is refused); only the daemon's ``control`` accepts.

Liveness, as NVIDIA's clients judge it: a daemon runs when its ``control``
socket accepts a connection (nvidia-cuda-mps-control(1): the CUDA driver
"attempts to connect to the MPS control daemon"), never by a recorded pid, which
may have been written in another PID namespace. A command finds no daemon when
the socket does not answer; ``quit`` (``-q``) is sent over the socket, and the
daemon ends itself. A daemon refuses to start while ``<pipe>/control`` exists:
"An instance of this daemon is already running" when it answers, and a
leftover-socket error when it does not (what the real daemon does with a dead
predecessor's socket is not documented; the fake refuses, so whoever starts it
must clear what a dead daemon left).
* without ``-d``/``-f``: a command. Like the real tool, an invocation follows
  the running daemon's protocol (docs:mpsv3-interface "Enabling MPS v3").
  v3: exactly the documented ``<module> <verb> [args]`` forms on the command
  line (``server``, ``namespace`` and ``client``; the other documented modules
  are refused as not modelled), ``-q`` to quit, one command per process.
  ``server create [<name>] [--uid=<uid>]`` (the name optional, as
  docs:quick-start runs ``server create --uid=$UID``; an unnamed server is
  called ``server_<pid>`` here, the real name is not documented): without
  ``--uid`` the server is the connecting user's (docs:mpsv3-interface
  "Server"). The default namespace is the server's own ("Every server has an
  implicit default namespace", docs:mpsv3-namespaces): it is listed and read,
  its limits are ``server set``'s, and ``namespace set default`` is refused (no
  documented form sets it by name). ``namespace delete`` and ``server delete``
  are refused while clients are connected to what they delete, unless
  ``--force``, which terminates those clients (docs:mpsv3-interface ``delete
  ... [--force]``); ``client list|get|terminate`` see the clients connected with
  ``--fake-client`` (below). Stdin
  is refused, since v3 "replaces the interactive shell" (docs:mpsv3-interface;
  what the real tool does with stdin under v3 is not documented). ``list``
  prints as documented: a padded table by default, ``--format=csv[,noheader]``
  comma-separated, percentages with two decimals (``30.00``) and memory as set
  (``20G``), as NVIDIA's Dynamo guide shows. Legacy: without arguments, the
  interactive shell, which reads commands from stdin one line at a time and
  answers each (flushed) before it reads the next, until stdin closes (``echo
  quit | nvidia-cuda-mps-control``, docs:appendix-tools-and-interface-reference).
  One shell can serve many commands; it exits when the daemon is gone. An
  unknown command is answered ``Error: unknown command '<the line>' ...``.
  The legacy commands of docs:mpsv2-interface are modelled: ``get_server_list``,
  ``get_server_status``, ``start_server -uid``, ``get_client_list <PID>`` (client
  PIDs, one a line), ``get_device_client_list``, ``ps``, ``quit``, the
  ``set_``/``get_`` forms of the default and per-server active thread percentage
  and device pinned memory limit, ``set_default_client_priority <0|1>`` and
  ``get_default_client_priority``, ``terminate_client <server PID> <client
  PID>``, ``device_query``, and with ``-S`` ``sm_partition add <device>
  <chunks>``, ``sm_partition rm <ID>`` and ``lspart``. Where the docs show no
  output format (``terminate_client``, the priority commands, ``device_query``,
  ``sm_partition``, ``lspart``), the fake's is minimal and said at the command.
* ``FAKE_MPS_COMMAND_DELAY_S`` (fake only): each accepted command takes that many
  seconds, standing in for a slow daemon in tests; refusals stay instant.

Every invocation is recorded as a JSON line in ``fake-mps-commands.jsonl`` in the
log directory (``CUDA_MPS_LOG_DIRECTORY`` of the command), with the pid of the
control process that ran it (``control_pid``). Error texts and exit statuses are
this fake's own choice: the real tool's are not documented.

Like the real daemon it writes ``control.log`` in the log directory, in the
documented format (docs:appendix-logging "Control Log"): ``[<date> <time> Control
<pid>] Starting new server <pid> for user <uid>``, ``NEW SERVER <pid>: Ready``,
``Server <pid> exited with status 0``, ``NEW CLIENT <pid> from user <uid>: <text>``.
The text after a NEW CLIENT line's colon is the fake's choice for a client that
must wait for another UID's server (the docs do not show that case).

Clients, a fake-only invocation standing in for a CUDA process that connects or
exits: ``--fake-client connect|exit --uid <uid> [--namespace <name> [--server
<name>]]``. Under v3 a client names the namespace whose socket it connected
through (docs:mpsv3-namespaces "Namespace Routing"; ``default`` for the
server's own), ``connect`` prints its PID, and it stays until it exits, is
terminated, or a forced delete drops it. Under legacy MPS the daemon serves
one UID at a time as documented (docs:mpsv2-interface,
nvidia-cuda-mps-control(1)): a client of another UID is queued until the running
server's clients have all exited; then the server exits and one for the queued
UID starts. Clients are logged with PID 0, as a real daemon logs a client in
another PID namespace (a container); each gets a PID of the fake's own, which
``get_client_list`` prints and ``terminate_client`` takes.

The daemon records the identity (device, inode) of the ``/dev/shm`` it sees in
its state (``shm``), so tests can check which shm directory it runs with.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dra_driver.fakes.mps_fifo import FifoAnswer, FifoRequest, FifoSlots
from dra_driver.mpsagent.sockets import answers, is_socket

_FAKES = os.path.dirname(__file__)
NATIVE_SOURCE = os.path.join(_FAKES, "native", "fifo_client.c")
"""The native client's source (``fakes/native/``; not in the wheel)."""
NATIVE_BUILD = os.path.join(_FAKES, "native", "build", "nvidia-cuda-mps-control")
"""Where ``hack/build-fake-mps-client.sh`` puts the native client (gitignored)."""


def fake_control_path() -> str:
    """The control binary the mps-agent runs with ``--mps-control fake``: the native
    client where a current build exists (:func:`native_control_path`), else the sh
    launcher (:func:`shell_control_path`). Both hand what they do not serve on: native
    to sh, sh to the Python client."""
    return native_control_path() or shell_control_path()


def shell_control_path() -> str:
    """The launcher of this fake, ``fakes/bin/nvidia-cuda-mps-control``: the POSIX sh
    client over the daemon's FIFO slots, which runs the Python client for the rest."""
    return os.path.join(_FAKES, "bin", "nvidia-cuda-mps-control")


def native_control_path(binary: str | None = None, source: str | None = None) -> str | None:
    """``binary`` (default :data:`NATIVE_BUILD`: the native client,
    ``fakes/native/fifo_client.c``) when it is an executable file not older than
    ``source`` (default :data:`NATIVE_SOURCE`); None otherwise: not built (no compiler),
    or built from an older source (a stale build must not answer for the new one)."""
    binary = binary or NATIVE_BUILD
    source = source or NATIVE_SOURCE
    try:
        built, written = os.stat(binary), os.stat(source)
    except OSError:
        return None
    if built.st_mtime_ns < written.st_mtime_ns or not os.access(binary, os.X_OK):
        return None
    return binary


PID_FILE = "nvidia-cuda-mps-control.pid"
STATE_FILE = "fake-mps-state.json"
LOCK_FILE = ".fake-mps.lock"
RECORD_FILE = "fake-mps-commands.jsonl"
MAX_REQUEST = 1 << 20
"""The longest request the fake daemon reads from its control socket."""
DELAY_ENV = "FAKE_MPS_COMMAND_DELAY_S"
"""Fake only: seconds each accepted command takes (a slow daemon, for tests)."""
V3_MODULES = ("server", "namespace", "client")
LEGACY_COMMANDS = frozenset(
    {
        "get_server_list", "start_server", "get_server_status", "get_client_list",
        "get_device_client_list", "ps", "set_default_active_thread_percentage",
        "get_default_active_thread_percentage", "set_active_thread_percentage",
        "get_active_thread_percentage", "set_default_device_pinned_mem_limit",
        "get_default_device_pinned_mem_limit", "set_device_pinned_mem_limit",
        "get_device_pinned_mem_limit", "set_default_client_priority",
        "get_default_client_priority", "terminate_client", "device_query", "sm_partition",
        "lspart",
    }
)  # fmt: skip
"""What the legacy shell knows; a word neither protocol knows is refused at once."""

_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_V3_MEM = re.compile(r"^\d+[KMG]$")
_LEGACY_MEM = re.compile(r"^\d+[MG]$")


class CommandError(Exception):
    pass


DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"


def _dirs() -> tuple[str, str]:
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG_DIRECTORY
    return pipe, logs


def _record(logs: str, entry: dict[str, Any]) -> None:
    entry = {"t": round(time.time(), 3), **entry}
    _append(os.path.join(logs, RECORD_FILE), (json.dumps(entry) + "\n").encode())


def _append(path: str, data: bytes) -> None:
    """``data`` at the end of ``path`` in one write (its directory made if missing).
    Plain descriptors: the daemon appends a line per command of every client."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(pipe: str) -> Iterator[None]:
    os.makedirs(pipe, exist_ok=True)
    fd = os.open(os.path.join(pipe, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_state(pipe: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(pipe, STATE_FILE)) as f:
            state: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return state


def _replace_whole(path: str, data: bytes, tmp: str) -> None:
    """``path`` replaced by ``data`` through ``tmp`` beside it and a rename: a reader
    sees the old file or the new one, whole, never half of it."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


_STATE_JSON = json.JSONEncoder(separators=(",", ":"))
"""The state file's encoder, made once (``json.dumps`` with options makes one a call)."""


class _DaemonState:
    """The daemon's state: in its memory, and mirrored into :data:`STATE_FILE` after
    every change (tests read the file). Commands run one at a time on the state in
    memory; one that fails (refused, or a bug of the fake) gets the state back from
    the text of the last one that worked, so a refused command changes nothing.

    Why not a fresh copy per command (``json.loads`` of the text, as this did): the
    daemon answers every command of every MPS share, on the prepare's path, and the
    parse was about 20 us of its 0.35 ms per command (issue 35, the 2-core machine).
    What a command may store is what JSON holds (lists, string keys: what the copy
    had); the tests hold the state in memory to the file's text after each command."""

    def __init__(self, pipe: str, state: dict[str, Any]) -> None:
        self.pipe = pipe
        self.lock = threading.Lock()
        self._path = os.path.join(pipe, STATE_FILE)
        self._tmp = f"{self._path}.{os.getpid()}.tmp"
        self._text = ""
        self._save(state)
        self._state: dict[str, Any] = json.loads(self._text)

    def _save(self, state: dict[str, Any]) -> None:
        # encode (dumps), not dump: json.dump encodes in pure Python, dumps in C.
        text = _STATE_JSON.encode(state)
        if text != self._text:  # a query changes nothing: no write
            _replace_whole(self._path, text.encode(), self._tmp)
            self._text = text

    def command(self, request: dict[str, Any], uid: int) -> dict[str, Any]:
        """Run one request; the answer's ``quit``: the daemon ends once the answer is
        sent."""
        argv = [str(a) for a in request.get("argv") or []]
        line = request.get("line")
        with self.lock:
            state = self._state
            answer: dict[str, Any] = {"daemon_pid": state.get("daemon_pid"),
                                      "protocol": state.get("protocol")}  # fmt: skip
            quitting = (line is None and argv in (["-q"], ["--quit"])) or (
                line is not None and line.split() == ["quit"] and state.get("protocol") != 3
            )
            try:
                reply = "" if quitting else _execute(state, self.pipe, argv, line, uid)
                self._save(state)
                answer.update(ok=True, reply=reply, quit=quitting)
            except CommandError as err:
                self._state = json.loads(self._text)  # what it changed before it failed
                answer.update(ok=False, reply=f"{err}\n")
            except BaseException:
                self._state = json.loads(self._text)
                raise
        return answer

    def stop(self) -> None:
        """The daemon is going: its state says so."""
        with self.lock:
            self._state["stopped"] = True
            self._save(self._state)


def _control_log(logs: str, pid: int, text: str) -> None:
    """One control.log line in the documented format."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    with open(os.path.join(logs, "control.log"), "a") as f:
        f.write(f"[{stamp} Control {pid}] {text}\n")


def _shm_identity() -> list[int] | None:
    try:
        st = os.stat("/dev/shm")
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _bind(path: str) -> socket.socket:
    """A unix socket bound at ``path`` (its directory made); OSError as the kernel
    raises it (``AF_UNIX path too long``, ``Address already in use``)."""
    directory = os.path.dirname(path)
    try:
        os.mkdir(directory)  # one call where the parent exists (a namespace's socket)
    except OSError:
        os.makedirs(directory, exist_ok=True)  # its parents, or it exists: as it was
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    return sock


def _bind_for_server(path: str, what: str) -> None:
    """A server's or namespace's socket (nobody listens: the fake has no server
    process); a failure is the command's error, naming the path."""
    try:
        _bind(path).close()
    except OSError as err:
        raise CommandError(f"Error: cannot create the socket of {what} at {path}: {err}") from err


def _peer_uid(conn: socket.socket) -> int:
    """The UID of the process at the other end of ``conn``, as the kernel reports it
    (SO_PEERCRED): the connecting user, whatever the command claims."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _serve_control(listener: socket.socket, store: _DaemonState) -> None:
    """The daemon's control socket: each connection (a probe, a command) on its own
    thread; a probe sends nothing and closes."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed: the daemon is exiting
        threading.Thread(target=_serve_connection, args=(conn, store), daemon=True).start()


def _read_line(conn: socket.socket, limit: int | None = None) -> bytes:
    """Bytes up to and including a newline (or the peer's close, or ``limit``)."""
    data = b""
    while not data.endswith(b"\n") and (limit is None or len(data) < limit):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _serve_connection(conn: socket.socket, store: _DaemonState) -> None:
    """One request: a JSON line ``{"argv": [...]}`` (a command line) or ``{"line": "..."}``
    (a line of the legacy shell), answered with one JSON line; a bare ``quit`` line is
    taken too. The daemon runs the command against its own state in its own pipe
    directory, so whoever reaches this socket, by whatever path, commands the daemon
    (dra-facts 10.1 "Isolation": the pipe directory's ``control`` socket is the power)."""
    with conn:
        conn.settimeout(5)
        try:
            data = _read_line(conn, MAX_REQUEST)
            uid = _peer_uid(conn)
        except OSError:
            return
        if not data.strip():
            return  # a liveness probe
        if data.strip() == b"quit":
            os.kill(os.getpid(), signal.SIGTERM)  # our own pid; sigwait takes it
            return
        try:
            request = json.loads(data)
            answer = store.command(request, uid)
        except Exception as err:  # a fake's bug must still answer
            answer = {"ok": False, "reply": f"Error: the fake daemon failed: {err!r}\n"}
        quitting = answer.pop("quit", False)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(answer).encode() + b"\n")
        if quitting:
            os.kill(os.getpid(), signal.SIGTERM)


# -- the daemon -----------------------------------------------------------------------


def run_daemon(protocol: int, multiuser: bool, static: bool = False) -> int:
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    pipe, logs = _dirs()
    os.makedirs(logs, exist_ok=True)
    control = os.path.join(pipe, "control")
    with _locked(pipe):
        if answers(control):
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        if os.path.lexists(control):
            kind = "socket nobody listens on" if is_socket(control) else "file"
            print(
                f"Error: {control} exists (a {kind}: left by a daemon that died?); "
                "remove it before starting the daemon",
                file=sys.stderr,
            )
            return 1
        try:
            listener = _bind(control)
        except OSError as err:
            print(f"Error: cannot create the control socket {control}: {err}", file=sys.stderr)
            return 1
        listener.listen(64)
        state: dict[str, Any] = {
            "daemon_pid": os.getpid(),
            "protocol": protocol,
            "multiuser": multiuser,
            "static_partitioning": static,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "next_pid": 100000 + os.getpid() % 100000 * 10,
            # v3: name -> {uid, pid, limits, namespaces{name: limits},
            #              clients{pid: {uid, namespace}}}
            "servers": {},
            # legacy servers: pid -> {uid, pct, mem, clients (a count), client_pids};
            # pending: queued client UIDs; partitions: static SM partitions (-S)
            "legacy": {
                "default_pct": None,
                "default_mem": {},
                "default_priority": 0,
                "servers": {},
                "pending": [],
                "partitions": {},
            },
            "shm": _shm_identity(),
        }
        store = _DaemonState(pipe, state)
        # The way in for the shell client (fakes/bin/nvidia-cuda-mps-control), open
        # before the control socket answers: a start probe that got its answer on the
        # socket finds the slots there too (else the next commands took the slower
        # Python client). Blocked signals are inherited: SIGTERM still reaches sigwait.
        slots = FifoSlots.open(pipe, functools.partial(_fifo_command, store))
        with open(os.path.join(pipe, PID_FILE), "w") as f:
            f.write(f"{os.getpid()}\n")
        threading.Thread(target=_serve_control, args=(listener, store), daemon=True).start()
    _record(logs, {"event": "start", "daemon_pid": os.getpid(), "protocol": protocol,
                   "multiuser": multiuser,
                   "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})  # fmt: skip
    _control_log(logs, os.getpid(), f"Starting control daemon using socket {pipe}/control")
    _control_log(
        logs,
        os.getpid(),
        f"To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}",
    )
    print(f"To connect CUDA applications to this daemon, set CUDA_MPS_PIPE_DIRECTORY={pipe}",
          flush=True)  # fmt: skip

    # Asleep until SIGTERM or SIGINT, as the real daemon is (a polling loop here
    # woke every fake daemon 50 times a second: CPU the benchmark charged to the
    # node). Blocked from the start, then waited for: none can be missed.
    signal.sigwait(stop_signals)
    listener.close()
    with _locked(pipe):
        on_disk = _read_state(pipe) or {}
        if on_disk.get("daemon_pid") == os.getpid():  # not taken over by another daemon
            slots.close()
            for name in (PID_FILE, "control"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(pipe, name))
            store.stop()
    _record(logs, {"event": "exit", "daemon_pid": os.getpid()})
    return 0


def spawn_background(argv: list[str]) -> int:
    """``-d``: run ourselves with ``-f`` in a new session and wait for the pid file."""
    import subprocess  # noqa: PLC0415 (only -d needs it; every start pays for imports)

    pipe, _ = _dirs()
    fg = ["-f" if a in ("-d", "--daemon") else a for a in argv]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_driver.fakes.mps_control", *fg],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = _read_state(pipe)
        if state and state.get("daemon_pid") == proc.pid and not state.get("stopped"):
            return 0
        if proc.poll() is not None:
            return proc.returncode or 1
        time.sleep(0.02)
    return 1


NO_DAEMON = "Cannot find MPS control daemon process"
V3_NO_SHELL = (
    "Error: this daemon runs MPS v3, which has no interactive shell: run one command per "
    "process, on the command line: nvidia-cuda-mps-control <module> <verb> [arguments] "
    "(-q to quit)"
)


def _new_pid(state: dict[str, Any]) -> int:
    pid = int(state["next_pid"])
    state["next_pid"] = pid + 1
    return pid


# -- MPS v3 commands ------------------------------------------------------------------


class _Args:
    """``[positional] [--key=value | key=value] [--flag]`` (docs:mpsv3-interface)."""

    def __init__(self) -> None:
        self.positional: list[str] = []
        self.options: dict[str, str] = {}
        self.flags: set[str] = set()
        self.fmt = "table"
        self.fmt_given = False

    @classmethod
    def split(cls, args: list[str]) -> _Args:
        out = cls()
        for arg in args:
            key, eq, value = arg.removeprefix("--").partition("=")
            if eq:
                out.options[key] = value
            elif arg.startswith("--"):
                out.flags.add(key)
            else:
                out.positional.append(arg)
        out.fmt_given = "format" in out.options
        out.fmt = out.options.pop("format", "table")
        return out


# The documented forms, module by module (docs:mpsv3-interface "Server", "Namespace",
# "Client"): (module, verb) -> (positional arguments min, max; options; flags; usage).
# A command outside them is refused, as a fake must refuse what the real tool would
# not be documented to take. What the real tool answers to an undocumented form is
# not documented: this fake's refusal texts and exit status 1 are its own.
_V3_FORMS: dict[tuple[str, str], tuple[int, int, frozenset[str], frozenset[str], str]] = {
    ("server", "create"): (0, 1, frozenset({"uid", "allowed-devices", "locality-domains"}),
                           frozenset(), "server create [<name>] [--uid=<n>] "
                           "[--allowed-devices=<devices>] [--locality-domains=<true|false>]"),
    ("server", "delete"): (1, 1, frozenset(), frozenset({"force"}),
                           "server delete <name> [--force]"),
    ("server", "list"): (0, 1, frozenset({"format"}), frozenset(),
                         "server list [<name>] [--format=<table|csv>[,noheader]]"),
    ("server", "set"): (1, 1, frozenset({"uid", "pinned-memory-limit", "active-thread-percentage",
                                         "locality-domains", "client-priority"}), frozenset(),
                        "server set <name> [--uid=<n>] [--pinned-memory-limit=<limit>] "
                        "[--active-thread-percentage=<pct>] [--locality-domains=<true|false>] "
                        "[--client-priority=<priority>]"),
    ("server", "get"): (2, 2, frozenset(), frozenset(), "server get <name> <field>"),
    ("namespace", "create"): (1, 1, frozenset({"server"}), frozenset(),
                              "namespace create <name> --server=<s>"),
    ("namespace", "delete"): (1, 1, frozenset({"server"}), frozenset({"force"}),
                              "namespace delete <name> --server=<s> [--force]"),
    ("namespace", "list"): (0, 1, frozenset({"server", "format"}), frozenset(),
                            "namespace list [<name>] [--server=<s>] "
                            "[--format=<table|csv>[,noheader]]"),
    ("namespace", "set"): (1, 1, frozenset({"server", "pinned-memory-limit",
                                            "active-thread-percentage", "client-priority"}),
                           frozenset(), "namespace set <name> --server=<s> "
                           "[--pinned-memory-limit=<limit>] [--active-thread-percentage=<pct>] "
                           "[--client-priority=<priority>]"),
    ("namespace", "get"): (3, 3, frozenset(), frozenset(), "namespace get <name> <server> <field>"),
    ("client", "list"): (0, 0, frozenset({"server", "format"}), frozenset({"all"}),
                         "client list [--server=<s>] [--all] [--format=<table|csv>[,noheader]]"),
    ("client", "get"): (2, 2, frozenset(), frozenset(), "client get <pid> <field>"),
    ("client", "terminate"): (1, 1, frozenset(), frozenset(), "client terminate <pid>"),
}  # fmt: skip
_V3_UNMODELLED = ("device", "sm-partition", "feature", "memacct", "context-share")
"""Documented v3 modules this fake does not model (the agent sends them none)."""
_FORMAT = re.compile(r"^(table|csv)(,noheader)?$")


def _usage(module: str, verb: str | None = None) -> str:
    forms = [u for (m, v), (*_, u) in _V3_FORMS.items() if m == module and verb in (None, v)]
    return "".join(f"nvidia-cuda-mps-control {u}\n" for u in forms)


def _check_form(module: str, verb: str, args: _Args) -> None:
    """Refuse anything but a documented form of ``module verb`` (see :data:`_V3_FORMS`)."""
    form = _V3_FORMS.get((module, verb))
    if form is None:
        raise CommandError(f"Error: unknown command {module} {verb}; usage:\n{_usage(module)}")
    low, high, options, flags, usage = form
    if not low <= len(args.positional) <= high:
        raise CommandError(f"Error: usage: nvidia-cuda-mps-control {usage}")
    given = set(args.options) | ({"format"} if args.fmt_given else set())
    unknown = sorted(given - options) + sorted(f"--{f}" for f in args.flags - flags)
    if unknown:
        raise CommandError(
            f"Error: {module} {verb} does not take {', '.join(unknown)}; usage: "
            f"nvidia-cuda-mps-control {usage}"
        )
    if not _FORMAT.match(args.fmt):
        raise CommandError(f"Error: --format must be table or csv, optionally ',noheader', "
                           f"got {args.fmt!r}")  # fmt: skip


def _limits(options: dict[str, str], allowed: set[str]) -> dict[str, Any]:
    unknown = set(options) - allowed
    if unknown:
        raise CommandError(f"Error: unknown option(s) {sorted(unknown)}")
    out: dict[str, Any] = {}
    if "pinned-memory-limit" in options:
        value = options["pinned-memory-limit"]
        if not _V3_MEM.match(value):
            raise CommandError(f"Error: invalid pinned memory limit {value!r} (use 4G, 512M)")
        out["pinned_memory_limit"] = value
    if "active-thread-percentage" in options:
        value = options["active-thread-percentage"]
        if not value.isdigit() or not 1 <= int(value) <= 100:
            raise CommandError(f"Error: active thread percentage must be 1-100, got {value!r}")
        out["active_thread_percentage"] = int(value)
    if "client-priority" in options:
        value = options["client-priority"]
        if value not in ("0", "1"):
            raise CommandError(f"Error: client priority must be 0 (normal) or 1 (below normal), "
                               f"got {value!r}")  # fmt: skip
        out["client_priority"] = int(value)
    return out


def _need_name(positional: list[str], what: str) -> str:
    if not positional:
        raise CommandError(f"Error: {what} name required")
    if not _NAME.match(positional[0]):
        raise CommandError(
            f"Error: invalid {what} name {positional[0]!r}: lowercase letters, digits and "
            "underscores only, up to 64 characters"
        )
    return positional[0]


def _server(state: dict[str, Any], options: dict[str, str]) -> tuple[str, dict[str, Any]]:
    name = options.get("server")
    if not name:
        raise CommandError("Error: --server=<s> required")
    if name not in state["servers"]:
        raise CommandError(f"Error: server {name!r} not found")
    server: dict[str, Any] = state["servers"][name]
    return name, server


def _v3(state: dict[str, Any], pipe: str, args: list[str], caller: int) -> str:
    if args[:1] and args[0] in _V3_UNMODELLED:
        raise CommandError(f"Error: the MPS v3 module {args[0]!r} is documented but this fake "
                           "does not model it")  # fmt: skip
    if not args or args[0] not in V3_MODULES:
        raise CommandError(
            f"Error: unknown module {args[0] if args else ''!r}; usage: nvidia-cuda-mps-control "
            f"<module> <verb> [arguments], modules: {', '.join(V3_MODULES + _V3_UNMODELLED)}"
        )
    if len(args) < 2 or args[1] == "help" or args[-1] == "help":
        # "<module> help or <module> <verb> help prints detailed usage" (docs:mpsv3-interface).
        return _usage(args[0], args[1] if len(args) > 2 else None)
    module, verb, rest = args[0], args[1], _Args.split(args[2:])
    _check_form(module, verb, rest)
    if module == "server":
        if verb in ("list", "get"):
            return _v3_server_query(state, pipe, verb, rest)
        return _v3_server(state, pipe, verb, rest, caller)
    if module == "namespace":
        if verb in ("list", "get"):
            return _v3_namespace_query(state, pipe, verb, rest)
        return _v3_namespace(state, pipe, verb, rest)
    return _v3_client(state, verb, rest)


_CLIENT_FIELDS = ["pid", "server", "device", "namespace", "cmd"]
"""``client list`` columns (docs:mpsv3-interface "Client"); the header words and the
``client get`` field names are this fake's guess in the documented style."""


def _v3_client(state: dict[str, Any], verb: str, args: _Args) -> str:
    """``client list|get|terminate`` over the clients connected with ``--fake-client``."""
    rows = {
        pid: [pid, sname, state.get("visible_devices") or "-", client["namespace"], "-"]
        for sname, server in sorted(state["servers"].items())
        for pid, client in sorted(server.get("clients", {}).items())
        if args.options.get("server", sname) == sname
    }
    if verb == "list":
        return _table([f.upper() for f in _CLIENT_FIELDS], list(rows.values()), args.fmt)
    pid = args.positional[0]
    if pid not in rows:
        raise CommandError(f"Error: no client with PID {pid!r}")
    if verb == "get":
        wanted = args.positional[1]
        if wanted not in _CLIENT_FIELDS:
            raise CommandError(
                f"Error: unknown field {wanted!r}; fields: {', '.join(_CLIENT_FIELDS)}"
            )
        cell: str = rows[pid][_CLIENT_FIELDS.index(wanted)]
        return cell + "\n"
    for server in state["servers"].values():  # terminate: the client is gone
        server.get("clients", {}).pop(pid, None)
    return ""


def _v3_server(state: dict[str, Any], pipe: str, verb: str, args: _Args, caller: int) -> str:
    positional, options = args.positional, args.options
    servers: dict[str, Any] = state["servers"]
    if verb == "create":
        pid = _new_pid(state)
        # The name is optional ("server create --uid=$UID", docs:quick-start); what
        # the real daemon calls an unnamed server is not documented: here server_<pid>.
        name = _need_name(positional, "server") if positional else f"server_{pid}"
        if name in servers:
            raise CommandError(f"Error: server {name!r} already exists")
        # Without --uid the server is the connecting user's (docs:mpsv3-interface
        # "Server"): the UID the kernel reports for the command's end of the control
        # socket. Any UID may be named: whoever reaches the control socket commands
        # the daemon (dra-facts 10.1 "Isolation"; multiuser mode disregards isolation
        # between users). No rule of the docs limits --uid in multiuser mode.
        uid_text = options.pop("uid", str(caller))
        if not uid_text.isdigit():
            raise CommandError(f"Error: --uid must be a numeric user ID, got {uid_text!r}")
        uid = int(uid_text)
        options.pop("allowed-devices", None)
        options.pop("locality-domains", None)
        if options:
            raise CommandError(f"Error: unknown option(s) {sorted(options)}")
        _bind_for_server(os.path.join(pipe, name, "control"), f"server {name!r}")
        _bind_for_server(os.path.join(pipe, name, "default", "control"), f"server {name!r}")
        servers[name] = {"uid": uid, "pid": pid, "limits": {}, "namespaces": {}, "clients": {}}
        return ""
    if verb == "delete":
        name = _need_name(positional, "server")
        if name not in servers:
            raise CommandError(f"Error: server {name!r} not found")
        _drop_clients(servers[name], None, f"server {name!r}", "force" in args.flags)
        del servers[name]
        return ""
    if verb == "set":
        name = _need_name(positional, "server")
        if name not in servers:
            raise CommandError(f"Error: server {name!r} not found")
        limits = _limits(options, {"pinned-memory-limit", "active-thread-percentage",
                                   "client-priority", "uid", "locality-domains"})  # fmt: skip
        if not limits:
            raise CommandError("Error: at least one option is required")
        servers[name]["limits"].update(limits)
        return ""
    raise CommandError(f"Error: unknown command server {verb}")


def _v3_server_query(state: dict[str, Any], pipe: str, verb: str, args: _Args) -> str:
    positional, servers = args.positional, state["servers"]
    rows: dict[str, list[str]] = {
        n: [n, str(s["uid"]), str(s["pid"]), "Ready", os.path.join(pipe, n),
            state.get("visible_devices") or "-", "-"]
        for n, s in sorted(servers.items())
    }  # fmt: skip
    if verb == "list":
        # Columns as documented; the header's words are a guess in the style of the
        # documented namespace table (docs:mpsv3-interface shows none for servers).
        return _table(["NAME", "UID", "PID", "STATUS", "PIPE DIRECTORY", "ALLOWED DEVICES",
                       "CONTEXT IDS"],
                      [r for n, r in rows.items() if not positional or n == positional[0]],
                      args.fmt)  # fmt: skip
    if verb == "get":
        name, wanted = positional
        fields = ["name", "uid", "pid", "status", "pipe-directory", "allowed-devices"]
        if wanted not in fields:
            raise CommandError(f"Error: unknown field {wanted!r}; fields: {', '.join(fields)}")
        if name not in rows:
            raise CommandError(f"Error: server {name!r} not found")
        return rows[name][fields.index(wanted)] + "\n"
    raise CommandError(f"Error: unknown command server {verb}")


def _v3_namespace_query(state: dict[str, Any], pipe: str, verb: str, args: _Args) -> str:
    positional, options = args.positional, args.options
    if verb == "list":
        rows = []
        for sname, server in sorted(state["servers"].items()):
            if options.get("server", sname) != sname:
                continue
            everyone = {"default": server["limits"], **server["namespaces"]}
            for nname, lim in sorted(everyone.items()):
                if positional and nname != positional[0]:
                    continue
                rows.append(_namespace_row(pipe, sname, nname, lim))
        # The header as NVIDIA's Dynamo guide prints it (its table shows the first five
        # columns; the last two are the v3 page's, their header words a guess).
        return _table(["NAME", "SERVER", "SERVER STATUS", "PINNED MEMORY LIMIT",
                       "ACTIVE THREAD PERCENTAGE", "CLIENT PRIORITY", "PIPE DIRECTORY"],
                      rows, args.fmt)  # fmt: skip
    if verb == "get":
        name, sname, wanted = positional
        fields = ["name", "server", "server-status", "pinned-memory-limit",
                  "active-thread-percentage", "client-priority", "pipe-directory"]  # fmt: skip
        if wanted not in fields:
            raise CommandError(f"Error: unknown field {wanted!r}; fields: {', '.join(fields)}")
        server = state["servers"].get(sname)
        if server is None or (name != "default" and name not in server["namespaces"]):
            raise CommandError(f"Error: namespace {name!r} not found on server {sname!r}")
        lim = server["limits"] if name == "default" else server["namespaces"][name]
        # "Gets a single field value": the documented example prints ``4G``.
        return _namespace_row(pipe, sname, name, lim)[fields.index(wanted)] + "\n"
    raise CommandError(f"Error: unknown command namespace {verb}")


def _v3_namespace(state: dict[str, Any], pipe: str, verb: str, args: _Args) -> str:
    options = args.options
    name = _need_name(args.positional, "namespace")
    sname, server = _server(state, options)
    options.pop("server")
    spaces = server["namespaces"]
    if verb == "create":
        if name in spaces or name == "default":
            raise CommandError(f"Error: namespace {name!r} already exists")
        if options:
            raise CommandError(f"Error: unknown option(s) {sorted(options)}")
        _bind_for_server(os.path.join(pipe, sname, name, "control"), f"namespace {name!r}")
        spaces[name] = {}
        return ""
    if verb == "delete":
        if name not in spaces:
            raise CommandError(f"Error: namespace {name!r} not found")
        what = f"namespace {name!r} of server {sname!r}"
        _drop_clients(server, name, what, "force" in args.flags)
        del spaces[name]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(pipe, sname, name, "control"))
        return ""
    if verb == "set":
        if name == "default":
            # "Every server has an implicit default namespace" (docs:mpsv3-namespaces);
            # its limits are the server's (``server set``). No documented form sets it
            # by name, so the fake refuses one.
            raise CommandError(
                f"Error: the default namespace is the server's own: set its limits with "
                f"server set {sname} [--pinned-memory-limit=...] [--active-thread-percentage=...]"
            )
        target = spaces.get(name)
        if target is None:
            raise CommandError(f"Error: namespace {name!r} not found")
        limits = _limits(options, {"pinned-memory-limit", "active-thread-percentage",
                                   "client-priority"})  # fmt: skip
        if not limits:
            raise CommandError("Error: at least one option is required")
        target.update(limits)
        return ""
    raise CommandError(f"Error: unknown command namespace {verb}")


def _drop_clients(server: dict[str, Any], namespace: str | None, what: str, force: bool) -> None:
    """Before a delete: refuse while clients are connected (to ``namespace``, or to any
    of the server's), unless ``force``, which terminates them (docs:mpsv3-interface:
    ``delete ... [--force]``). The refusal's text is this fake's."""
    clients: dict[str, Any] = server.setdefault("clients", {})
    connected = [p for p, c in clients.items() if namespace in (None, c["namespace"])]
    if connected and not force:
        raise CommandError(
            f"Error: {what} has {len(connected)} connected client(s) (PIDs "
            f"{', '.join(connected)}); add --force to delete it and terminate them"
        )
    for pid in connected:
        del clients[pid]


def _namespace_row(pipe: str, server: str, name: str, lim: dict[str, Any]) -> list[str]:
    """A namespace's cells as ``namespace list`` prints them: memory as set (``20G``),
    the percentage with two decimals (``30.00``; both from NVIDIA's Dynamo guide).
    An unset limit prints ``-``, as ``server list`` prints an empty cell (how the
    real tool prints an unset namespace limit is not documented)."""
    pct = lim.get("active_thread_percentage")
    return [name, server, "Ready", lim.get("pinned_memory_limit", "-"),
            "-" if pct is None else f"{pct:.2f}", str(lim.get("client_priority", 0)),
            os.path.join(pipe, server, name)]  # fmt: skip


def _table(header: list[str], rows: list[list[str]], fmt: str) -> str:
    """``table``: columns padded to line up (as the documented examples do); ``csv``:
    cells joined by commas (``server list --format=csv,noheader`` in
    docs:mpsv3-interface), its header the table's words (undocumented)."""
    kind, _, extra = fmt.partition(",")
    lines = ([] if extra == "noheader" else [header]) + rows
    if kind == "csv":
        return "".join(",".join(cells) + "\n" for cells in lines)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))] if lines else []
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        + "\n"
        for cells in lines
    )


# -- legacy commands ------------------------------------------------------------------


def _need(cmd: str, args: list[str], n: int) -> None:
    if len(args) != n:
        raise CommandError(f"Error: {cmd} takes {n} argument(s)")


def _pct(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) <= 100:
        raise CommandError(f"Error: invalid active thread percentage {value!r}")
    return int(value)


def _mem(value: str) -> str:
    if not _LEGACY_MEM.match(value):
        raise CommandError(f"Error: invalid device pinned memory limit {value!r}")
    return value


def _legacy_server(state: dict[str, Any], pid: str) -> dict[str, Any]:
    servers: dict[str, Any] = state["legacy"]["servers"]
    if pid not in servers:
        raise CommandError(f"Error: no server with PID {pid}")
    found: dict[str, Any] = servers[pid]
    return found


_PER_SERVER = frozenset(
    {
        "get_server_status", "set_active_thread_percentage", "get_active_thread_percentage",
        "set_device_pinned_mem_limit", "get_device_pinned_mem_limit", "terminate_client",
        "get_client_list",
    }
)  # fmt: skip
"""Legacy commands that name a server by its PID first."""


def _legacy(state: dict[str, Any], line: str) -> str:  # noqa: PLR0911, PLR0912 (one per command)
    """One line of the legacy shell: the commands of docs:mpsv2-interface. Where the
    docs show no output for a command, the fake prints what it documents in the
    fewest words (noted at each)."""
    words = line.split()
    cmd, args = words[0], words[1:]
    legacy: dict[str, Any] = state["legacy"]
    servers: dict[str, Any] = legacy["servers"]
    if cmd in _PER_SERVER:
        return _legacy_per_server(state, cmd, args)
    if cmd == "get_server_list":
        return "".join(f"{pid}\n" for pid in servers)
    if cmd == "start_server":
        if len(args) < 2 or args[0] != "-uid" or not args[1].isdigit():
            raise CommandError("Error: usage: start_server -uid <uid>")
        if any(s["uid"] != int(args[1]) for s in servers.values()):
            raise CommandError("Error: a server for another user is running")
        _start_legacy_server(state, int(args[1]), clients=0)
        return ""
    if cmd == "set_default_active_thread_percentage":
        _need(cmd, args, 1)
        legacy["default_pct"] = _pct(args[0])
        return f"{legacy['default_pct']}\n"
    if cmd == "get_default_active_thread_percentage":
        _need(cmd, args, 0)
        return f"{legacy['default_pct'] or 100}.0\n"
    if cmd == "set_default_device_pinned_mem_limit":
        _need(cmd, args, 2)
        legacy["default_mem"][args[0]] = _mem(args[1])
        return ""
    if cmd == "get_default_device_pinned_mem_limit":
        _need(cmd, args, 1)
        return f"{legacy['default_mem'].get(args[0], '0M')}\n"
    if cmd == "set_default_client_priority":
        # 0 normal, 1 below normal, as CUDA_MPS_CLIENT_PRIORITY (docs:appendix-environment-
        # variables); for clients started afterwards. No output (none documented).
        _need(cmd, args, 1)
        if args[0] not in ("0", "1"):
            raise CommandError(f"Error: client priority must be 0 or 1, got {args[0]!r}")
        legacy["default_priority"] = int(args[0])
        return ""
    if cmd == "get_default_client_priority":
        _need(cmd, args, 0)
        return f"{legacy.get('default_priority', 0)}\n"
    if cmd == "device_query":
        # The devices the daemon sees; the real output's format is not documented: one
        # line per device, "<ordinal> <CUDA_VISIBLE_DEVICES entry>".
        _need(cmd, args, 0)
        visible = (state.get("visible_devices") or "0").split(",")
        return "".join(f"{i} {dev.strip()}\n" for i, dev in enumerate(visible))
    if cmd in ("sm_partition", "lspart"):
        return _legacy_partition(state, cmd, args)
    if cmd in ("get_device_client_list", "ps"):
        return ""
    raise CommandError(f"Error: unknown command {line.strip()!r}")


def _legacy_per_server(state: dict[str, Any], cmd: str, args: list[str]) -> str:  # noqa: PLR0911
    """The legacy commands of :data:`_PER_SERVER`."""
    if not args:
        raise CommandError(f"Error: {cmd} takes the server's PID first")
    server = _legacy_server(state, args[0])
    pids: list[str] = server.setdefault("client_pids", [])
    if cmd == "get_server_status":
        _need(cmd, args, 1)
        return "ACTIVE\n"
    if cmd == "set_active_thread_percentage":
        _need(cmd, args, 2)
        server["pct"] = _pct(args[1])
        return f"{args[1]}\n"
    if cmd == "get_active_thread_percentage":
        # "get_active_thread_percentage <PID>": printed as the default's getter prints.
        _need(cmd, args, 1)
        return f"{server['pct'] or 100}.0\n"
    if cmd == "set_device_pinned_mem_limit":
        _need(cmd, args, 3)
        server["mem"][args[1]] = _mem(args[2])
        return ""
    if cmd == "get_device_pinned_mem_limit":
        # "get_device_pinned_mem_limit <PID> <dev>": printed as the default's getter prints.
        _need(cmd, args, 2)
        return f"{server['mem'].get(args[1], '0M')}\n"
    if cmd == "get_client_list":
        # "lists the PIDs of client applications connected to" the server: one a line.
        _need(cmd, args, 1)
        return "".join(f"{pid}\n" for pid in pids)
    # terminate_client <server PID> <client PID>: the client's work is ended and it
    # leaves the server; no output (none documented).
    _need(cmd, args, 2)
    if args[1] not in pids:
        raise CommandError(f"Error: no client with PID {args[1]} on server {args[0]}")
    pids.remove(args[1])
    server["clients"] = len(pids)
    _switch_if_idle(state)
    return ""


def _legacy_partition(state: dict[str, Any], cmd: str, args: list[str]) -> str:
    """Static SM partitions of a daemon started with ``-S`` (docs:mpsv2-interface:
    ``sm_partition add <device> <chunks>``, ``sm_partition rm <partition>``,
    ``lspart``). The real output formats are not documented: ``add`` prints the new
    partition's ID, ``lspart`` one line per partition, ``<ID> <device> <chunks>``."""
    partitions: dict[str, Any] = state["legacy"].setdefault("partitions", {})
    if cmd == "lspart":
        if args:
            raise CommandError("Error: lspart takes no arguments")
        return "".join(f"{pid} {p['device']} {p['chunks']}\n" for pid, p in partitions.items())
    if not state.get("static_partitioning"):
        raise CommandError("Error: sm_partition needs a daemon started with -S "
                           "(--static-partitioning)")  # fmt: skip
    if args[:1] == ["add"] and len(args) == 3:
        device, chunks = args[1], args[2]
        visible = [d.strip() for d in (state.get("visible_devices") or "0").split(",")]
        if device not in visible and not (device.isdigit() and int(device) < len(visible)):
            raise CommandError(f"Error: device {device!r} is not one this daemon sees")
        if not chunks.isdigit() or int(chunks) < 1:
            raise CommandError(f"Error: the chunk count must be a positive integer, got {chunks!r}")
        pid = str(_new_pid(state))
        partitions[pid] = {"device": device, "chunks": int(chunks)}
        return f"{pid}\n"
    if args[:1] == ["rm"] and len(args) == 2:
        if partitions.pop(args[1], None) is None:
            raise CommandError(f"Error: no partition {args[1]!r}")
        return ""
    raise CommandError("Error: usage: sm_partition add <device> <chunk count> | "
                       "sm_partition rm <partition ID>")  # fmt: skip


def _start_legacy_server(state: dict[str, Any], uid: int, clients: int) -> str:
    legacy: dict[str, Any] = state["legacy"]
    pid = str(_new_pid(state))
    client_pids = [str(_new_pid(state)) for _ in range(clients)]
    legacy["servers"][pid] = {"uid": uid, "pct": legacy["default_pct"],
                              "mem": dict(legacy["default_mem"]), "clients": clients,
                              "client_pids": client_pids}  # fmt: skip
    _, logs = _dirs()
    _control_log(logs, int(state["daemon_pid"]), f"Starting new server {pid} for user {uid}")
    _control_log(logs, int(state["daemon_pid"]), f"NEW SERVER {pid}: Ready")
    return pid


class _FakeClientArgs:
    """``--fake-client connect|exit --uid <uid> [--namespace <name> [--server <name>]]``."""

    USAGE = ("Error: usage: --fake-client connect|exit --uid <uid> "
             "[--namespace <name> [--server <name>]]")  # fmt: skip

    def __init__(self, action: str, uid: int, namespace: str | None, server: str | None):
        self.action, self.uid, self.namespace, self.server = action, uid, namespace, server

    @classmethod
    def parse(cls, argv: list[str]) -> _FakeClientArgs:
        if len(argv) % 2 == 0 or argv[0] not in ("connect", "exit"):
            raise CommandError(cls.USAGE)
        pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
        if (
            set(pairs) - {"--uid", "--namespace", "--server"}
            or not pairs.get("--uid", "").isdigit()
        ):
            raise CommandError(cls.USAGE)
        if "--server" in pairs and "--namespace" not in pairs:
            raise CommandError(cls.USAGE)
        return cls(argv[0], int(pairs["--uid"]), pairs.get("--namespace"), pairs.get("--server"))


def _fake_client(state: dict[str, Any], pipe: str, args: _FakeClientArgs) -> str:
    """A CUDA client connects or exits: under v3 to a namespace (``--namespace``), under
    legacy MPS to the daemon (one server UID at a time)."""
    if state["protocol"] == 3:
        if args.namespace is None:
            raise CommandError("Error: a v3 fake client names its --namespace")
        return _v3_fake_client(state, args)
    if args.namespace is not None:
        raise CommandError("Error: namespaces are MPS v3's; this daemon runs legacy MPS")
    return _legacy_fake_client(state, args.action, args.uid)


def _v3_fake_client(state: dict[str, Any], args: _FakeClientArgs) -> str:
    """A client in a v3 namespace (it connected through that namespace's socket,
    docs:mpsv3-namespaces "Namespace Routing"); ``connect`` prints its PID."""
    servers: dict[str, Any] = state["servers"]
    holding = [n for n, s in sorted(servers.items())
               if args.namespace == "default" or args.namespace in s["namespaces"]]  # fmt: skip
    if args.server is not None:
        holding = [n for n in holding if n == args.server]
    if len(holding) != 1:
        where = "no server holds it" if not holding else f"servers {holding}: name --server"
        raise CommandError(f"Error: namespace {args.namespace!r}: {where}")
    clients: dict[str, Any] = servers[holding[0]].setdefault("clients", {})
    if args.action == "connect":
        pid = str(_new_pid(state))
        clients[pid] = {"uid": args.uid, "namespace": args.namespace}
        return f"{pid}\n"
    mine = [
        p for p, c in clients.items() if (c["uid"], c["namespace"]) == (args.uid, args.namespace)
    ]
    if not mine:
        raise CommandError(f"Error: no connected client of user {args.uid} in namespace "
                           f"{args.namespace!r}")  # fmt: skip
    del clients[mine[0]]
    return ""


def _legacy_fake_client(state: dict[str, Any], action: str, uid: int) -> str:
    """A CUDA client of ``uid`` connects or exits (legacy: one server UID at a time).

    A server stays when its last client exits, until a client of another UID
    needs the GPU: then it exits as soon as it has no clients, and a server for
    the queued UID starts (nvidia-cuda-mps-control(1)).
    """
    _, logs = _dirs()
    daemon = int(state["daemon_pid"])
    legacy: dict[str, Any] = state["legacy"]
    servers: dict[str, Any] = legacy["servers"]
    pending: list[int] = legacy.setdefault("pending", [])
    running = next(iter(servers.items()), None)
    if action == "connect":
        if running is not None and running[1]["uid"] == uid:
            running[1].setdefault("client_pids", []).append(str(_new_pid(state)))
            running[1]["clients"] = running[1].get("clients", 0) + 1
            _control_log(logs, daemon, f"NEW CLIENT 0 from user {uid}: Server already exists")
            return f"{running[0]}\n"
        if running is None:
            starts = "Server is not ready, push client to pending list"
            _control_log(logs, daemon, f"NEW CLIENT 0 from user {uid}: {starts}")
            return _start_legacy_server(state, uid, clients=1) + "\n"
        waits = f"Server of user {running[1]['uid']} is running, push client to pending list"
        _control_log(logs, daemon, f"NEW CLIENT 0 from user {uid}: {waits}")
        pending.append(uid)
        _switch_if_idle(state)
        return "pending\n"
    if running is None or running[1]["uid"] != uid or not running[1].get("clients"):
        raise CommandError(f"Error: no connected client of user {uid}")
    running[1]["clients"] -= 1
    with contextlib.suppress(IndexError):
        running[1].setdefault("client_pids", []).pop()
    _switch_if_idle(state)
    return ""


def _switch_if_idle(state: dict[str, Any]) -> None:
    """A server without clients gives way to the first queued UID."""
    legacy: dict[str, Any] = state["legacy"]
    servers: dict[str, Any] = legacy["servers"]
    pending: list[int] = legacy.setdefault("pending", [])
    running = next(iter(servers.items()), None)
    if running is None or running[1].get("clients") or not pending:
        return
    del servers[running[0]]
    _, logs = _dirs()
    _control_log(logs, int(state["daemon_pid"]), f"Server {running[0]} exited with status 0")
    queued = pending[0]
    legacy["pending"] = [u for u in pending if u != queued]
    _start_legacy_server(state, queued, clients=len(pending) - len(legacy["pending"]))


# -- entry point ----------------------------------------------------------------------


def _send(pipe: str, request: dict[str, Any]) -> dict[str, Any]:
    """``request`` to the daemon over ``<pipe>/control`` (the pipe directory this
    command was given, as the real tool connects), and its answer. A socket that
    does not answer: :data:`NO_DAEMON`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(120)  # many commands may queue for the daemon's state lock
        try:
            conn.connect(os.path.join(pipe, "control"))
        except OSError as err:
            raise CommandError(f"{NO_DAEMON}: {err}") from err
        try:
            conn.sendall(json.dumps(request).encode() + b"\n")
            data = _read_line(conn)
        except OSError as err:
            raise CommandError(f"{NO_DAEMON}: {err}") from err
    if not data.strip():
        raise CommandError(f"{NO_DAEMON}: the daemon closed the connection")
    answer: dict[str, Any] = json.loads(data)
    return answer


def _execute(
    state: dict[str, Any], pipe: str, argv: list[str], line: str | None, caller: int
) -> str:
    """One command (``argv``, or one ``line`` of the interactive shell) against
    ``state``, in the daemon; ``caller``: the connecting user's UID."""
    if line is None:
        if argv[:1] == ["--fake-client"]:
            return _fake_client(state, pipe, _FakeClientArgs.parse(argv[1:]))
        if state["protocol"] != 3:
            raise CommandError("Error: module verb commands need MPS protocol 3")
        return _v3(state, pipe, argv, caller)
    if state["protocol"] == 3:
        # MPS v3 "replaces the interactive shell of Legacy MPS v2 with a scriptable
        # module verb command syntax" (docs:mpsv3-interface): every documented v3
        # command, quitting included (-q), is one process with its arguments. What
        # the real tool does with stdin under v3 is not documented; this fake refuses.
        raise CommandError(V3_NO_SHELL)
    return _legacy(state, line)


Send = Callable[[dict[str, Any]], dict[str, Any]]
"""A request to the daemon and its answer: over the socket (:func:`_send`), or, in the
daemon serving a FIFO client, :meth:`_DaemonState.command` itself."""


def _one(
    logs: str, argv: list[str], line: str | None, delay: float, *, send: Send, control_pid: int
) -> tuple[bool, str, bool]:
    """Send one command to the daemon, record it; (worked, reply, the daemon quits)."""
    entry: dict[str, Any] = {"argv": argv} if line is None else {"stdin": line}
    entry["control_pid"] = control_pid  # which control process ran it (a shell runs many)
    word = line.split()[0] if line is not None else ""
    if line is not None and word not in LEGACY_COMMANDS and word != "quit":
        # The shell itself refuses it: no daemon state involved.
        reply = (
            f"Error: unknown command {line.strip()!r} (the interactive shell takes Legacy "
            "MPS v2 commands; MPS v3 takes <module> <verb> on the command line)\n"
        )
        entry.update(ok=False, reply=reply)
        _record(logs, entry)
        return False, reply, False
    quitting = False
    try:
        answer = send({"argv": argv} if line is None else {"line": line})
        entry["daemon_pid"] = answer.get("daemon_pid")
        entry["protocol"] = answer.get("protocol")
        ok, reply = bool(answer.get("ok")), str(answer.get("reply", ""))
        quitting = bool(answer.get("quit"))
    except CommandError as err:
        ok, reply = False, f"{err}\n"
    if ok and delay > 0:
        entry["busy_since"] = round(time.time(), 3)  # tests read the daemon's busy spans
        time.sleep(delay)  # a daemon that takes its time (tests); refusals stay instant
    entry.update(ok=ok, reply=reply)
    _record(logs, entry)
    return ok, reply, quitting


def _fifo_command(store: _DaemonState, request: FifoRequest) -> FifoAnswer:
    """In the daemon: one command of a shell client (:mod:`.mps_fifo`), run as the
    Python client runs it over the socket (:func:`_run_command`), its output framed for
    the client to print."""
    line = request.line
    if line is not None and not line.strip():
        return FifoAnswer(True, "", False)  # the shell skips blank lines
    logs = request.logs or DEFAULT_LOG_DIRECTORY
    argv = list(request.argv or ())
    ok, reply, quitting = _one(
        logs, argv, line, float(request.delay or 0),
        send=lambda sent: store.command(sent, request.uid), control_pid=request.control_pid,
    )  # fmt: skip
    stop = line is not None and line.split() == ["quit"]
    return FifoAnswer(ok, reply, to_stderr=line is None and not ok, stop=stop, quit=quitting)


def _run_command(argv: list[str]) -> int:
    """A command on the command line (v3, ``-q``), or the interactive shell on stdin.

    The (legacy) shell reads one command per line and answers each before it
    reads the next, until stdin closes, ``quit``, or the daemon is gone (then it
    exits too). Replies and complaints go to stdout in order, flushed per
    command, so a caller may keep one shell open for many commands (the
    mps-agent's opt-in persistent channel, :mod:`dra_driver.mpsagent.channel`).
    Under v3 every line is refused (:data:`V3_NO_SHELL`). The exit status is 1 if
    any command failed.
    """
    pipe, logs = _dirs()
    delay = float(os.environ.get(DELAY_ENV) or 0)
    send = functools.partial(_send, pipe)
    if argv:
        ok, reply, _ = _one(logs, argv, None, delay, send=send, control_pid=os.getpid())
        (sys.stdout if ok else sys.stderr).write(reply)
        return 0 if ok else 1
    all_ok = True
    for line in sys.stdin:
        if not line.strip():
            continue
        ok, reply, _ = _one(logs, [], line, delay, send=send, control_pid=os.getpid())
        all_ok = all_ok and ok
        sys.stdout.write(reply)
        sys.stdout.flush()
        if (not ok and reply.startswith(NO_DAEMON)) or line.split() == ["quit"]:
            break
    return 0 if all_ok else 1


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0912 (one branch per flag)
    args = list(sys.argv[1:] if argv is None else argv)
    protocol, daemon, foreground, static = 2, False, False, False
    multiuser: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-d", "--daemon"):
            daemon = True
        elif arg in ("-f", "--foreground"):
            foreground = True
        elif arg in ("-m", "--multiuser", "-multiuser-server"):
            multiuser = arg
        elif arg in ("-S", "--static-partitioning"):
            static = True
        elif arg in ("-p", "--protocol") and i + 1 < len(args):
            protocol = int(args[i + 1])
            i += 1
        elif arg in ("-v", "--version"):
            print("nvidia-cuda-mps-control (fake, dra_driver.fakes.mps_control)")
            return 0
        else:
            rest.append(arg)
        i += 1
    env_protocol = os.environ.get("CUDA_MPS_PROTOCOL_VERSION")
    if env_protocol:
        protocol = int(env_protocol)  # the variable wins over -p (docs:mpsv3-interface)
    if (daemon or foreground) and multiuser is not None:
        # Each protocol documents its own multiuser flag: v3 ``-m``/``--multiuser``
        # (docs:mpsv3-interface "Control Daemon Options"), legacy ``-multiuser-server``
        # (docs:mpsv2-interface; dra-facts 10.1). The other protocol's is refused.
        wanted = "-multiuser-server" if protocol != 3 else "-m or --multiuser"
        if (multiuser == "-multiuser-server") != (protocol != 3):
            print(f"Error: {multiuser} is not a protocol {protocol} option; its multiuser "
                  f"flag is {wanted}", file=sys.stderr)  # fmt: skip
            return 1
    if daemon:
        return spawn_background(args)
    if foreground:
        return run_daemon(protocol, multiuser is not None, static)
    return _run_command(rest)


if __name__ == "__main__":
    sys.exit(main())
