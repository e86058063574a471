"""The fake MPS control daemon's FIFO slots: how its shell client reaches it (stdlib only).

A command of the fake ``nvidia-cuda-mps-control`` is a POSIX ``sh`` script
(``fakes/bin/nvidia-cuda-mps-control``) so that it starts as a native process
does: dash cannot open a unix socket, so the daemon also serves named pipes.
(Where a compiler exists, a C client speaks the same protocol for a command line:
``fakes/native/fifo_client.c``.)
In its pipe directory it makes :data:`SLOTS_DIR` (mode 0700: only its own user,
and root, can enter it, the FIFO analogue of the ``SO_PEERCRED`` check on the
``control`` socket, which stays the daemon's interface for everything else).
The directory holds :data:`SLOT_COUNT` slots, each a request FIFO ``<n>.req`` and
a reply FIFO ``<n>.res``, and the file :data:`DAEMON_FILE`: the daemon's pid and
the number of a descriptor it holds open on this directory, so a client can
prove, with the shell's ``test -ef`` on ``/proc/<pid>/fd/<n>``, that the
directory it found is the live daemon's (a pid file alone may name a reused pid,
or come from another PID namespace; a copy of the directory is not the
directory). A client:

1. claims slot ``n`` by creating ``<n>.lock`` with ``O_EXCL`` (``set -C``). The
   file's owner is the client's effective UID as the kernel sets it: the daemon
   takes the caller's UID from there, never from what the client says;
2. opens ``<n>.res`` for reading (the daemon holds a writer on it from the start,
   so this returns at once) and ``<n>.req`` read-write (never blocks on Linux);
3. sends the request (below), reads the reply up to its end tag, and exits.

Each slot has a thread in the daemon, blocked in ``open(<n>.req, O_RDONLY)``
until a client opens it; it answers each request, and when the request FIFO
reads end of file (the client's end closed: it exited, or was killed), it drains
what the client left unread and removes the lock, freeing the slot.

Request (one item a line): :data:`MAGIC`, the client's pid, its
``CUDA_MPS_LOG_DIRECTORY``, its ``FAKE_MPS_COMMAND_DELAY_S``, then ``argv <count>``
and the arguments, or ``shell`` and then a line per stdin line, ``l<text>`` for a
line that ended in a newline, ``p<text>`` for a last line that did not. An
argument with a newline in it cannot be framed: the client runs the Python one
instead. Reply: a line per output line, ``o``/``e`` (stdout, stderr) or ``O``/``E``
(the same without a final newline), then the end tag: ``k``/``f`` (worked, failed)
and, in the shell, ``K``/``F`` for the same when the shell must stop.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import NamedTuple

SLOTS_DIR = "fifo-control"
"""In the daemon's pipe directory: its FIFO slots (mode 0700)."""
SLOT_COUNT = 32
"""Clients served at once over FIFOs; a client that finds every slot taken runs the
Python one (over the socket) instead."""
DAEMON_FILE = "daemon"
"""In :data:`SLOTS_DIR`: ``<pid> <fd>``, the daemon and its descriptor on the directory."""
MAGIC = "fake-mps-fifo 1"
REPLY_WRITE_TIMEOUT_S = 10.0
"""How long a reply waits for a client that stopped reading (killed mid-reply)."""


# NamedTuples, not dataclasses: the Python client imports this module on every start,
# and dataclasses (with inspect) would be most of its import time.
class FifoRequest(NamedTuple):
    """One command from a FIFO client: its argv, or one line of its stdin shell."""

    control_pid: int
    """The client's pid (what it says: for the record only)."""
    uid: int
    """The client's effective UID: the owner of the lock file it created."""
    logs: str
    """Its ``CUDA_MPS_LOG_DIRECTORY`` ("" when unset)."""
    delay: str
    """Its ``FAKE_MPS_COMMAND_DELAY_S`` ("" when unset)."""
    argv: tuple[str, ...] | None
    """The command line; None for a line of the interactive shell."""
    line: str | None
    """The shell's line, with its newline if it had one; None for a command line."""


class FifoAnswer(NamedTuple):
    ok: bool
    reply: str
    to_stderr: bool
    """The reply goes to stderr (a failed command line) instead of stdout."""
    stop: bool = False
    """The shell stops after this line (it was ``quit``)."""
    quit: bool = False
    """The daemon ends once this answer is sent."""


Handler = Callable[[FifoRequest], FifoAnswer]
"""Runs one request in the daemon; called on the slot's thread, several at once."""


class BadRequest(Exception):
    """A request that does not follow the framing above (not from our client)."""


def encode_answer(answer: FifoAnswer, shell: bool) -> bytes:
    """The reply's lines and its end tag (see the module docstring)."""
    tag = "e" if answer.to_stderr else "o"
    lines = answer.reply.split("\n")
    out = [f"{tag}{text}\n" for text in lines[:-1]]
    if lines[-1]:
        out.append(f"{tag.upper()}{lines[-1]}\n")
    end = "k" if answer.ok else "f"
    out.append(f"{end.upper() if shell and answer.stop else end}\n")
    return "".join(out).encode("utf-8", "surrogateescape")


class _Lines:
    """Lines from a FIFO's descriptor, read with plain ``os.read``. A request usually
    comes in one read: its lines are split once and taken in one call, not two
    Python calls and a search of the buffer per line (issue 35: the daemon's CPU per
    command is on every MPS prepare's path)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.partial = b""
        """The bytes after the last newline read so far."""
        self.ready: list[str] = []
        """Whole lines read so far (from the first not yet taken, after a read)."""
        self.taken = 0
        """How many of :attr:`ready` were taken."""

    def take(self, count: int) -> list[str]:
        """The next ``count`` lines, without their newlines; :class:`BadRequest` at end
        of file before them (the request ended early)."""
        end = self.taken + count
        while len(self.ready) < end:
            if not self._read():
                raise BadRequest("the request ended early")
        lines = self.ready[self.taken : end]
        self.taken = max(end, self.taken)
        return lines

    def next_line(self) -> str | None:
        """The next line, without its newline; None at end of file (the client is done)."""
        while len(self.ready) <= self.taken:
            if not self._read():
                return None
        self.taken += 1
        return self.ready[self.taken - 1]

    def _read(self) -> bool:
        """One read's whole lines added to :attr:`ready`; False at end of file."""
        chunk = os.read(self.fd, 65536)
        if not chunk:
            if self.partial:
                raise BadRequest("the request ended in the middle of a line")
            return False
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        del self.ready[: self.taken]  # a shell's lines: only those not answered yet stay
        self.taken = 0
        self.ready += [raw.decode("utf-8", "surrogateescape") for raw in lines]
        return True


class FifoSlots:
    """The slots of one daemon; :meth:`open` makes them and starts their threads."""

    def __init__(self, root: str, handler: Handler) -> None:
        self.root = root
        self.handler = handler
        self._dir_fd = -1
        self._reply_fds: list[int] = []

    @classmethod
    def open(cls, pipe: str, handler: Handler) -> FifoSlots:
        """Make the slots in ``pipe`` (replacing what a dead daemon left there: a
        daemon starts only where no other answers) and serve them."""
        import shutil  # noqa: PLC0415 (the daemon's start only; every client imports this)

        slots = cls(os.path.join(pipe, SLOTS_DIR), handler)
        shutil.rmtree(slots.root, ignore_errors=True)
        os.mkdir(slots.root, 0o700)
        os.chmod(slots.root, 0o700)  # whatever the umask
        for n in range(SLOT_COUNT):
            # The FIFOs are open to all: the directory's mode says who may reach them.
            for suffix in ("req", "res"):
                path = os.path.join(slots.root, f"{n}.{suffix}")
                os.mkfifo(path, 0o666)
                os.chmod(path, 0o666)
            # Held for the daemon's life: a client's open of the reply FIFO returns at
            # once, and when the daemon dies the client reads end of file (no hang).
            # Non-blocking, so a reply to a client that stopped reading cannot wedge
            # the slot's thread (see _write_all).
            res = os.open(os.path.join(slots.root, f"{n}.res"), os.O_RDWR | os.O_NONBLOCK)
            slots._reply_fds.append(res)
        slots._dir_fd = os.open(slots.root, os.O_RDONLY | os.O_DIRECTORY)
        for n in range(SLOT_COUNT):
            threading.Thread(
                target=slots._serve_slot, args=(n,), name=f"fifo-slot-{n}", daemon=True
            ).start()
        # Last: a client finds the slots only once they are served.
        tmp = os.path.join(slots.root, f".{DAEMON_FILE}.tmp")
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} {slots._dir_fd}\n")
        os.replace(tmp, os.path.join(slots.root, DAEMON_FILE))
        return slots

    def close(self) -> None:
        """Take the slots away: clients that have not found them yet use the socket
        (and find no daemon); a client in the middle of a command reads end of file
        when this process exits."""
        import shutil  # noqa: PLC0415 (the daemon's exit only)

        gone = f"{self.root}.gone.{os.getpid()}"
        with contextlib.suppress(OSError):
            os.rename(self.root, gone)  # at once: no client opens a FIFO in it after this
            shutil.rmtree(gone, ignore_errors=True)

    # -- a slot's thread ------------------------------------------------------------

    def _serve_slot(self, n: int) -> None:
        request_path = os.path.join(self.root, f"{n}.req")
        lock_path = os.path.join(self.root, f"{n}.lock")
        while True:
            try:
                # Blocks until a client opens the FIFO (the slot's idle state).
                fd = os.open(request_path, os.O_RDONLY)
            except OSError:
                return  # the slots were taken away: the daemon is going
            try:
                self._serve_client(n, _Lines(fd), lock_path)
                # The slot stays the client's until its end closes (it exits): else
                # the next open would find it still holding the FIFO.
                while os.read(fd, 65536):
                    pass
            finally:
                os.close(fd)
            self._drain(n)
            # Last: the slot is free only once nothing of this client is left in it.
            try:  # noqa: SIM105 (contextlib.suppress costs a microsecond a command, issue 35)
                os.unlink(lock_path)
            except FileNotFoundError:
                pass

    def _serve_client(self, n: int, requests: _Lines, lock_path: str) -> None:
        """The requests of one client until its end closes."""
        try:
            uid = os.stat(lock_path).st_uid
        except FileNotFoundError:
            return  # opened without claiming the slot: not our client; nothing answered
        try:
            magic, pid, logs, delay, mode = requests.take(5)
            if magic != MAGIC or not pid.isdigit():
                raise BadRequest(f"not a request of this fake's client: {magic!r}")
            if mode.startswith("argv "):
                argv = tuple(requests.take(int(mode.removeprefix("argv "))))
                request = FifoRequest(int(pid), uid, logs, delay, argv, None)
                self._answer(n, self.handler(request), shell=False)
                return
            if mode != "shell":
                raise BadRequest(f"unknown request mode {mode!r}")
            while (raw := requests.next_line()) is not None:
                kind, text = raw[:1], raw[1:]
                if kind not in ("l", "p"):
                    raise BadRequest(f"unknown shell line {raw!r}")
                line = text + "\n" if kind == "l" else text
                answer = self.handler(FifoRequest(int(pid), uid, logs, delay, None, line))
                self._answer(n, answer, shell=True)
                if answer.stop:
                    return
        except (BadRequest, ValueError) as err:
            refusal = FifoAnswer(False, f"Error: the fake daemon got a bad request: {err}\n", True)
            self._answer(n, refusal, shell=False)

    def _answer(self, n: int, answer: FifoAnswer, shell: bool) -> None:
        _write_all(self._reply_fds[n], encode_answer(answer, shell))
        if answer.quit:
            os.kill(os.getpid(), signal.SIGTERM)  # our own pid; the daemon's sigwait takes it

    def _drain(self, n: int) -> None:
        """Discard what a client left unread (it was killed mid-reply), so the next
        client of the slot reads only its own reply."""
        try:
            while os.read(self._reply_fds[n], 65536):
                pass
        except BlockingIOError:
            pass  # empty: what the client was sent, it read


def _write_all(fd: int, data: bytes) -> None:
    """``data`` into a non-blocking FIFO; a client that stops reading for
    :data:`REPLY_WRITE_TIMEOUT_S` loses the rest (it is gone or wedged)."""
    try:
        written = os.write(fd, data)  # a reply fits the FIFO's buffer: done at once
    except BlockingIOError:
        written = 0
    view = memoryview(data)[written:]
    if not view:
        return
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            if not poller.poll(REPLY_WRITE_TIMEOUT_S * 1000):
                return
