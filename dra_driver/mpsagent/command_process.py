"""One short-lived command run on the event loop, without a thread per child (I/O).

The control binary runs once per command (three per v3 share), so the cost of a
spawn is the agent's cost per share. asyncio's subprocess path builds a transport
and protocol per pipe and, on Python 3.11, starts a thread per child to wait for
it (``ThreadedChildWatcher``). Here the child is a plain :class:`subprocess.Popen`
(vfork and exec, every other descriptor closed), its pipes are read with
``loop.add_reader`` and its exit is seen through a pidfd (Linux 5.3+): the pidfd
becomes readable when the child exits, and the callback reaps it. Where
``os.pidfd_open`` is missing or refused, the asyncio path runs instead.

Errors are those of the asyncio path: :class:`OSError` from ``Popen`` when the
binary cannot start, :class:`TimeoutError` once a command that overran its time
has been killed and reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, NamedTuple

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
    proc = _spawn(argv, env, takes_input=stdin is not None)
    exited = _watch_exit(loop, proc)
    assert proc.stdout is not None and proc.stderr is not None
    pipes = [proc.stdout, proc.stderr]
    out = _read_to_end(loop, proc.stdout)
    err = _read_to_end(loop, proc.stderr)
    if proc.stdin is not None:
        pipes.append(proc.stdin)
        _write_all(loop, proc.stdin, stdin or b"")
    try:
        async with asyncio.timeout(timeout):
            stdout, stderr = await out, await err
            # Shielded: a timeout here must leave the exit watch to reap the child.
            await asyncio.shield(exited)
    except TimeoutError:
        _close(loop, pipes)
        _kill(proc)
        await exited
        raise
    finally:
        _close(loop, pipes)
        if not exited.done():  # cancelled: the exit watch reaps it once it ends
            _kill(proc)
    return Finished(proc.returncode or 0, stdout, stderr)


def _close(loop: asyncio.AbstractEventLoop, pipes: Sequence[IO[bytes]]) -> None:
    """Close our ends of the child's pipes (unwatched first: a selector must not
    watch a closed descriptor)."""
    for pipe in pipes:
        if not pipe.closed:
            loop.remove_reader(pipe.fileno())
            loop.remove_writer(pipe.fileno())
            pipe.close()


def _spawn(argv: Sequence[str], env: Env, *, takes_input: bool) -> subprocess.Popen[bytes]:
    """Start ``argv`` (vfork and exec: the loop waits only for the exec)."""
    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE if takes_input else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
        bufsize=0,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _watch_exit(
    loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes]
) -> asyncio.Future[None]:
    """A future done once ``proc`` has exited and been reaped."""
    exited: asyncio.Future[None] = loop.create_future()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError as err:
        # Out of descriptors, say: wait in a thread for this one child.
        log.warning("os.pidfd_open(%d) failed (%s): waiting for it in a thread", proc.pid, err)
        waited = asyncio.ensure_future(asyncio.to_thread(proc.wait))

        def on_waited(_: object) -> None:
            if not exited.done():
                exited.set_result(None)

        waited.add_done_callback(on_waited)
        return exited

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc.poll()  # the pidfd is readable: the child is a zombie, so this reaps it
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, on_exit)
    return exited


def _read_to_end(loop: asyncio.AbstractEventLoop, pipe: IO[bytes]) -> asyncio.Future[bytes]:
    """A future with everything read from ``pipe`` up to end of file."""
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    done: asyncio.Future[bytes] = loop.create_future()
    chunks: list[bytes] = []

    def on_readable() -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError as err:
            loop.remove_reader(fd)
            if not done.done():
                done.set_exception(err)
            return
        if data:
            chunks.append(data)
            return
        loop.remove_reader(fd)
        if not done.done():
            done.set_result(b"".join(chunks))

    loop.add_reader(fd, on_readable)
    return done


def _write_all(loop: asyncio.AbstractEventLoop, pipe: IO[bytes], data: bytes) -> None:
    """Write ``data`` to ``pipe`` as it takes it, then close it (end of file for
    the child). A child that exits without reading it all ends the write, as
    ``communicate`` does."""
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)

    def write_some() -> None:
        nonlocal view
        if pipe.closed:  # the command ended (or timed out) first
            return
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BlockingIOError:
            loop.add_writer(fd, write_some)
            return
        except (BrokenPipeError, ConnectionResetError):
            pass
        loop.remove_writer(fd)
        pipe.close()

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
