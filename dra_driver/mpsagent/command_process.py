"""One short-lived command run on the event loop, without a thread per child (I/O).

The control binary runs once per command (three per v3 share), so the cost of a
spawn is the agent's cost per share. asyncio's subprocess path builds a transport
and protocol per pipe and, on Python 3.11, starts a thread per child to wait for
it (``ThreadedChildWatcher``). Here the child is started with ``os.posix_spawn``
(glibc's clone-and-exec: the loop waits only for the exec, and none of
``subprocess.Popen``'s Python around it, about 0.2 ms of CPU a command), its pipes
are read with ``loop.add_reader`` and its exit is seen through a pidfd (Linux
5.3+), taken at its start: once its pipes are at end of file the child has mostly
exited, and is reaped then (a ``waitpid`` that does not wait); one still running
is watched through the pidfd, which becomes readable when it exits.
Where ``os.pidfd_open`` is missing or refused, the asyncio path runs instead.

``posix_spawn`` cannot close the parent's other descriptors as ``Popen`` does.
Every descriptor Python opens is close-on-exec already (PEP 446); what the agent
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

READ_CHUNK = 65536

Env = Mapping[bytes, bytes] | Mapping[str, str]


class Finished(NamedTuple):
    """A command that ran to its end."""

    returncode: int
    stdout: bytes
    stderr: bytes


def encode_env(env: Mapping[str, str]) -> dict[bytes, bytes]:
    """``env`` as bytes, once: ``Popen`` encodes a str mapping on every spawn."""
    return {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


@functools.cache
def pidfd_supported() -> bool:
    """Can this kernel and Python give a pidfd (asked once, of our own pid)?"""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return False
    try:
        os.close(pidfd_open(os.getpid()))
    except OSError as err:
        log.warning("os.pidfd_open refused (%s): control commands run on asyncio's path", err)
        return False
    return True


async def run_command(
    argv: Sequence[str], env: Env, stdin: bytes | None, timeout: float
) -> Finished:
    """Run ``argv`` in ``env`` with ``stdin`` (None: ``/dev/null``) to its end.

    A command still running after ``timeout`` seconds is killed, reaped, and
    :class:`TimeoutError` raised; one whose caller is cancelled is killed and
    reaped when it ends.
    """
    if not pidfd_supported():
        return await run_command_asyncio(argv, env, stdin, timeout)
    loop = asyncio.get_running_loop()
    child = _Child.spawn(argv, env, takes_input=stdin is not None)
    child.hold_pidfd()
    try:
        out = _read_to_end(loop, child, child.stdout)
        err = _read_to_end(loop, child, child.stderr)
        if child.stdin is not None:
            _write_all(loop, child, stdin or b"")
        async with asyncio.timeout(timeout):
            stdout, stderr = await out, await err
            # Shielded: a timeout here must leave the exit watch to reap the child.
            await asyncio.shield(child.watch_exit(loop))
    except TimeoutError:
        child.close_pipes(loop)
        child.kill()
        await child.watch_exit(loop)
        raise
    finally:
        child.close_pipes(loop)
        if child.returncode is None:  # cancelled (or failed): the exit watch reaps it
            child.watch_exit(loop)
            child.kill()
    return Finished(child.returncode or 0, stdout, stderr)


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


class _Child:
    """One spawned command: its pid, pidfd-watched exit and our ends of its pipes."""

    def __init__(self, pid: int, stdin: int | None, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self.pidfd: int | None = None
        self._exited: asyncio.Future[None] | None = None
        self._open = [fd for fd in (stdin, stdout, stderr) if fd is not None]
        self._watched: set[int] = set()
        """Our pipe ends the loop watches now (a reader, or the stdin's writer)."""

    @classmethod
    def spawn(cls, argv: Sequence[str], env: Env, *, takes_input: bool) -> _Child:
        """Start ``argv`` with its stdout and stderr on pipes of ours, stdin on a pipe
        (``takes_input``) or ``/dev/null``."""
        _inherited_made_cloexec()
        path = _executable(argv[0], env)
        ours: list[int] = []
        theirs: list[int] = []
        try:
            if takes_input:
                in_r, in_w = os.pipe()
                theirs.append(in_r)
                ours.append(in_w)
                first: tuple[object, ...] = (os.POSIX_SPAWN_DUP2, in_r, 0)
            else:
                first = (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
            out_r, out_w = os.pipe()
            ours.append(out_r)
            theirs.append(out_w)
            err_r, err_w = os.pipe()
            ours.append(err_r)
            theirs.append(err_w)
            actions = [first, (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
            pid = os.posix_spawn(path, list(argv), env, file_actions=actions)
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return cls(pid, ours[0] if takes_input else None, out_r, err_r)

    def hold_pidfd(self) -> None:
        """Take the child's pidfd at once, while it cannot have been reaped: through it
        :meth:`kill` never hits a reused pid. (Not watched yet: see :meth:`watch_exit`.)"""
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError as err:
            # Out of descriptors, say: its exit is waited for in a thread.
            log.warning("os.pidfd_open(%d) failed (%s): waiting for it in a thread", self.pid, err)

    def watch_exit(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done once the child has exited and been reaped (the same one on
        every call).

        Asked once its pipes are at end of file, the child has mostly exited: it is
        looked for (a ``waitpid`` that does not wait) and reaped at once, with no
        pidfd registered with the loop nor a turn of it to wait for its wake-up.
        One still running is watched through its pidfd, or without one by a thread
        (which alone then reaps it)."""
        if self._exited is not None:
            return self._exited
        exited: asyncio.Future[None] = loop.create_future()
        self._exited = exited
        self._reap(os.WNOHANG)
        if self.returncode is not None:
            self._drop_pidfd()
            exited.set_result(None)
            return exited
        pidfd = self.pidfd
        if pidfd is None:
            waited = asyncio.ensure_future(asyncio.to_thread(self._reap, 0))

            def on_waited(_: object) -> None:
                if not exited.done():
                    exited.set_result(None)

            waited.add_done_callback(on_waited)
            return exited

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            self._reap(os.WNOHANG)  # the pidfd is readable: the child is a zombie
            self._drop_pidfd()
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, on_exit)
        return exited

    def _drop_pidfd(self) -> None:
        """Reaped: the pidfd has served (closed only now, see :meth:`hold_pidfd`)."""
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
        """SIGKILL, through the pidfd while we hold it (a reaped pid may be reused)."""
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def watch(self, loop: asyncio.AbstractEventLoop, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` when ``fd`` (one of our ends) is ready: readable, or
        writable for the stdin); already watched, it stays as it is."""
        if fd in self._watched:
            return
        if fd == self.stdin:
            loop.add_writer(fd, callback)
        else:
            loop.add_reader(fd, callback)
        self._watched.add(fd)

    def unwatch(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        """Stop :meth:`watch`; a descriptor not watched costs the loop nothing."""
        if fd in self._watched:
            self._watched.discard(fd)
            if fd == self.stdin:
                loop.remove_writer(fd)
            else:
                loop.remove_reader(fd)

    def close_pipe(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        """Close one of our ends (unwatched first: a selector must not watch a closed
        descriptor)."""
        if fd in self._open:
            self._open.remove(fd)
            self.unwatch(loop, fd)
            os.close(fd)

    def close_pipes(self, loop: asyncio.AbstractEventLoop) -> None:
        for fd in list(self._open):
            self.close_pipe(loop, fd)

    def is_open(self, fd: int) -> bool:
        return fd in self._open


def _read_to_end(loop: asyncio.AbstractEventLoop, child: _Child, fd: int) -> asyncio.Future[bytes]:
    """A future with everything read from ``fd`` (one of ``child``'s pipes) up to end
    of file."""
    os.set_blocking(fd, False)
    done: asyncio.Future[bytes] = loop.create_future()
    chunks: list[bytes] = []

    def on_readable() -> None:
        # Read until the pipe is empty: a command's output and its end of file mostly
        # come together, and are then taken in one wake-up, not two.
        while True:
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError as err:
                child.unwatch(loop, fd)
                if not done.done():
                    done.set_exception(err)
                return
            if not data:
                break
            chunks.append(data)
        child.unwatch(loop, fd)
        if not done.done():
            done.set_result(b"".join(chunks))

    child.watch(loop, fd, on_readable)
    return done


def _write_all(loop: asyncio.AbstractEventLoop, child: _Child, data: bytes) -> None:
    """Write ``data`` to the child's stdin as it takes it, then close it (end of file
    for the child). A child that exits without reading it all ends the write, as
    ``communicate`` does."""
    fd = child.stdin
    assert fd is not None
    os.set_blocking(fd, False)
    view = memoryview(data)

    def write_some() -> None:
        nonlocal view
        if not child.is_open(fd):  # the command ended (or timed out) first
            return
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BlockingIOError:
            child.watch(loop, fd, write_some)
            return
        except (BrokenPipeError, ConnectionResetError):
            pass
        child.close_pipe(loop, fd)

    write_some()


async def run_command_asyncio(
    argv: Sequence[str], env: Env, stdin: bytes | None, timeout: float
) -> Finished:
    """:func:`run_command` on asyncio's subprocess path (no pidfd)."""
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
