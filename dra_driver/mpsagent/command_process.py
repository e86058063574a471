"""One short-lived command run on the event loop, without a thread per child (I/O).

The control binary runs once per command (three per v3 share), so the cost of a
spawn is the agent's cost per share. asyncio's subprocess path builds a transport
and protocol per pipe and, on Python 3.11, starts a thread per child to wait for
it (``ThreadedChildWatcher``). Here the child is started with ``os.posix_spawn``
(glibc's clone-and-exec: the loop waits only for the exec, and none of
``subprocess.Popen``'s Python around it), its stdout and stderr are two memfds of
ours (``os.memfd_create``: anonymous files in memory), and only its exit is
watched, through a pidfd (Linux 5.3+) taken at its start: one reader on the loop
and one wake-up per command, where two pipes read to end of file cost a reader, a
wake-up and a read each (about 0.1 ms of the agent's CPU a command). Once the
pidfd is readable the child is reaped (a ``waitpid`` that does not wait) and both
files are read whole (``os.pread`` from their start) and closed.

What follows from reading at the exit, not to end of file:

* The call ends when the child exits. A grandchild it left holding stdout no
  longer holds the call (a pipe reached end of file only once every holder had
  closed it); what the child wrote is there, what a grandchild writes later is not.
* Output is not bounded in flight by a pipe's buffer: the child never blocks on a
  full pipe, and a large output comes back whole, at the end.
* Memory: the files' pages are charged as the child writes them, to the cgroup the
  agent and its commands share, and freed when the last holder closes them (we,
  after the read); the read chunks of the pipes were the agent's memory too.

stdin is ``/dev/null``, or (a legacy command's input) a pipe written as the child
takes it and closed once written or at the child's exit. Where ``os.pidfd_open``
or ``os.memfd_create`` is missing or refused (an old kernel, a seccomp filter),
the asyncio path runs instead, with one warning.

``posix_spawn`` cannot close the parent's other descriptors as ``Popen`` does.
Every descriptor Python opens is close-on-exec already (PEP 446), the memfds too
(``MFD_CLOEXEC``; their copies as 1 and 2 are the child's); what the agent
inherited at its start is made so once, before the first command
(:func:`_inherited_made_cloexec`), so a control command gets its three standard
descriptors and nothing else (a test lists the child's ``/proc/self/fd``).

Errors are those of the asyncio path: :class:`OSError` when the binary cannot
start (the same message as ``Popen``'s), :class:`TimeoutError` once a command that
overran its time has been killed and reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

log = logging.getLogger(__name__)

Env = Mapping[bytes, bytes] | Mapping[str, str]


class Finished(NamedTuple):
    """A command that ran to its end."""

    returncode: int
    stdout: bytes
    stderr: bytes


def encode_env(env: Mapping[str, str]) -> dict[bytes, bytes]:
    """``env`` as bytes, once: ``Popen`` encodes a str mapping on every spawn."""
    return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


def _kernel_gives(call: str, open_one: Callable[[], int]) -> bool:
    """Does ``os.<call>`` exist and give a descriptor here (one asked for, closed)?
    If not, one warning: the commands run on asyncio's path."""
    if getattr(os, call, None) is None:
        log.warning("this Python has no os.%s: control commands run on asyncio's path", call)
        return False
    try:
        os.close(open_one())
    except OSError as err:
        log.warning("os.%s refused (%s): control commands run on asyncio's path", call, err)
        return False
    return True


@functools.cache
def pidfd_supported() -> bool:
    """Can this kernel and Python give a pidfd (asked once, of our own pid)?"""
    return _kernel_gives("pidfd_open", lambda: os.pidfd_open(os.getpid()))


@functools.cache
def memfd_supported() -> bool:
    """Can this kernel and Python make a memfd (asked once; a seccomp filter may
    refuse ``memfd_create`` where ``pidfd_open`` is allowed)?"""
    return _kernel_gives("memfd_create", lambda: os.memfd_create("probe", os.MFD_CLOEXEC))


async def run_command(
    argv: Sequence[str], env: Env, stdin: bytes | None, timeout: float
) -> Finished:
    """Run ``argv`` in ``env`` with ``stdin`` (None: ``/dev/null``) to its end.

    A command still running after ``timeout`` seconds is killed, reaped, and
    :class:`TimeoutError` raised; one whose caller is cancelled is killed and
    reaped when it ends.
    """
    if not (pidfd_supported() and memfd_supported()):
        return await run_command_asyncio(argv, env, stdin, timeout)
    loop = asyncio.get_running_loop()
    child = _Child.spawn(argv, env, takes_input=stdin is not None)
    # The timeout is a timer that kills the child: the one future awaited stays the
    # exit's, and a child killed so is reaped by the watch before the error is raised.
    overran = loop.call_later(timeout, child.time_out)
    try:
        exited = child.watch_exit(loop)
        if stdin is not None:
            child.write_input(loop, stdin)
        await exited  # cancelled: the watch goes on, and reaps it once killed below
        if child.timed_out:
            raise TimeoutError
        stdout, stderr = child.read_outputs()
    finally:
        overran.cancel()
        child.close(loop)
        child.kill()  # cancelled (or failed): the exit watch reaps it; exited: nothing
    assert child.returncode is not None  # the watch sets it before ``exited`` is done
    return Finished(child.returncode, stdout, stderr)


@functools.cache
def _inherited_made_cloexec() -> None:
    """Mark every descriptor above 2 close-on-exec, once.

    Python opens its own close-on-exec (PEP 446); this covers what the agent's
    parent left it (a descriptor a container runtime or a shell passed on), so
    that ``posix_spawn``, which closes nothing, hands a command only its three.
    """
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own, closed by now
                os.set_inheritable(fd, False)


def _executable(name: str, env: Env) -> str:
    """``name``, or where ``env``'s PATH finds it, as ``Popen`` looks it up (in the
    child's PATH, not ours); not found: the :class:`FileNotFoundError` ``Popen``
    raises."""
    if os.sep in name:
        return name
    # Compared as they are (bytes or str): no decoding of every variable per spawn.
    path = next((os.fsdecode(v) for k, v in env.items() if k in (b"PATH", "PATH")), os.defpath)
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name)


def _read_whole(fd: int) -> bytes:
    """All of the file ``fd`` from its start (its size now: a grandchild may still be
    writing, and what it writes later is not the command's answer)."""
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    offset = 0
    while offset < size:
        data = os.pread(fd, size - offset, offset)
        if not data:  # truncated meanwhile (by a grandchild): what is there is all
            break
        chunks.append(data)
        offset += len(data)
    return b"".join(chunks)


class _Child:
    """One spawned command: its pid and pidfd, its output files and our end of its
    stdin pipe (a legacy command's input)."""

    def __init__(self, pid: int, pidfd: int | None, stdin: int | None, out: int, err: int) -> None:
        self.pid = pid
        self.pidfd = pidfd
        """Held from the start to the reaping: through it :meth:`kill` never hits a
        reused pid. None: ``pidfd_open`` failed (out of descriptors, say)."""
        self.stdin = stdin
        self.stdout = out
        self.stderr = err
        self.returncode: int | None = None
        self.timed_out = False
        self._exited: asyncio.Future[None] | None = None
        self._writing = False
        """The loop watches :attr:`stdin` for room (a large input, written as the
        child reads it)."""

    @classmethod
    def spawn(cls, argv: Sequence[str], env: Env, *, takes_input: bool) -> _Child:
        """Start ``argv`` with its stdout and stderr on two memfds of ours, its stdin
        on a pipe (``takes_input``) or ``/dev/null``."""
        _inherited_made_cloexec()
        path = _executable(argv[0], env)
        ours: list[int] = []
        theirs: list[int] = []
        try:
            out = os.memfd_create("command-stdout", os.MFD_CLOEXEC)
            ours.append(out)
            err = os.memfd_create("command-stderr", os.MFD_CLOEXEC)
            ours.append(err)
            stdin: int | None = None
            if takes_input:
                in_r, stdin = os.pipe()
                theirs.append(in_r)
                ours.append(stdin)
                first: tuple[object, ...] = (os.POSIX_SPAWN_DUP2, in_r, 0)
            else:
                first = (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
            actions = [first, (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
            pid = os.posix_spawn(path, list(argv), env, file_actions=actions)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        try:
            # At once, while it cannot have been reaped.
            pidfd: int | None = os.pidfd_open(pid)
        except OSError as failed:
            log.warning("os.pidfd_open(%d) failed (%s): waiting for it in a thread", pid, failed)
            pidfd = None
        return cls(pid, pidfd, stdin, out, err)

    def watch_exit(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done once the child has exited and been reaped (the same one on
        every call): its pidfd watched by the loop (readable at the exit), or without
        one a thread that waits for it."""
        if self._exited is not None:
            return self._exited
        exited: asyncio.Future[None] = loop.create_future()
        self._exited = exited
        pidfd = self.pidfd
        if pidfd is None:
            self._reap_in_thread(exited)
            return exited

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            self._reap(os.WNOHANG)  # readable: the child is a zombie
            self._drop_pidfd()
            if self.returncode is None:  # not found so (never seen): wait, not spin
                self._reap_in_thread(exited)
                return
            self._stop_writing(loop)  # its stdin pipe has no reader now
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        return exited

    def _reap_in_thread(self, exited: asyncio.Future[None]) -> None:
        waited = asyncio.ensure_future(asyncio.to_thread(self._reap, 0))

        def on_waited(_: object) -> None:
            if not exited.done():
                exited.set_result(None)

        waited.add_done_callback(on_waited)

    def _drop_pidfd(self) -> None:
        """Reaped: the pidfd has served."""
        pidfd, self.pidfd = self.pidfd, None
        if pidfd is not None:
            os.close(pidfd)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere: its status is lost (Popen says 0)
            self.returncode = 0
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def kill(self) -> None:
        """SIGKILL, through the pidfd while we hold it (a reaped pid may be reused);
        a reaped child is left alone."""
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def time_out(self) -> None:
        """Its time is up: kill it (the exit watch reaps it), noted for the caller."""
        if self.returncode is None:
            self.timed_out = True
            self.kill()

    def write_input(self, loop: asyncio.AbstractEventLoop, data: bytes) -> None:
        """Write ``data`` to the child's stdin as it takes it, then close it (end of
        file for the child). A child that exits without reading it all ends the
        write, as ``communicate`` does."""
        fd = self.stdin
        assert fd is not None
        os.set_blocking(fd, False)
        view = memoryview(data)

        def write_some() -> None:
            nonlocal view
            if self.stdin is None:  # closed: the command ended (or timed out) first
                return
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except BlockingIOError:
                if not self._writing:
                    loop.add_writer(fd, write_some)
                    self._writing = True
                return
            except (BrokenPipeError, ConnectionResetError):
                pass
            self._stop_writing(loop)

        write_some()

    def _stop_writing(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close our end of the stdin pipe (unwatched first: a selector must not watch
        a closed descriptor)."""
        fd, self.stdin = self.stdin, None
        if fd is None:
            return
        if self._writing:
            loop.remove_writer(fd)
            self._writing = False
        os.close(fd)

    def read_outputs(self) -> tuple[bytes, bytes]:
        """stdout and stderr as the child left them (asked once it has exited)."""
        return _read_whole(self.stdout), _read_whole(self.stderr)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close what is ours but the pidfd (the exit watch closes it once reaped):
        the stdin pipe, and the memfds (their pages freed once the child's copies,
        and any grandchild's, are closed too)."""
        self._stop_writing(loop)
        for fd in (self.stdout, self.stderr):
            if fd >= 0:
                os.close(fd)
        self.stdout = self.stderr = -1


async def run_command_asyncio(
    argv: Sequence[str], env: Env, stdin: bytes | None, timeout: float
) -> Finished:
    """:func:`run_command` on asyncio's subprocess path (no pidfd or no memfd)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    except asyncio.CancelledError:  # asyncio's child watcher reaps it once it ends
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        raise
    return Finished(proc.returncode or 0, out, err)
