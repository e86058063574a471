"""A persistent control channel: one ``nvidia-cuda-mps-control`` shell per legacy daemon.

**Opt-in and unverified** (``mps-agent --mps-control-channel=persistent``; off by
default, where every command is a process of its own, the form of every NVIDIA
example). Legacy MPS only: MPS v3 "replaces the interactive shell of Legacy MPS
v2 with a scriptable module verb command syntax" (docs:mpsv3-interface), so
nothing documents a v3 shell, and :class:`.daemon_control.DaemonControl` never opens
one for a v3 daemon.

Run without arguments, the legacy ``nvidia-cuda-mps-control`` is the daemon's
interactive shell: it reads commands from stdin, one per line, until stdin
closes (docs:mpsv2-interface "The control daemon has an interactive shell",
docs:appendix-tools-and-interface-reference ``echo quit | nvidia-cuda-mps-control``).
Starting one process per command costs a process start each time; keeping one
shell open per daemon costs it once.

Framing. The shell prints each answer but no end-of-answer mark (none is
documented), so after every command the channel sends a sentinel, a word the
shell does not know (``fgd_end_<n>``), and the answer ends at the line that
names it. stderr is merged into stdout so that complaints stay in order.
Assumptions here, all **docs-unverified and gpu-unverified** (no real GPU has
run this channel yet): the shell answers commands in order and flushes each
answer; it answers an unknown command with a line that names it. When an
assumption fails, the daemon falls back to one process per command
(:class:`.daemon_control.DaemonControl`), which the docs do cover.

Several commands (a share's namespace create and set) can go at once
(:meth:`ControlChannel.call_many`): written together, answered in order, one
round trip.

A command that gets no framed answer within the timeout, or a shell that exits
(it does when its daemon goes away), ends the channel: the process is killed
and the command fails; the next command starts a new shell.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

SENTINEL_PREFIX = "fgd_end_"


class ChannelError(RuntimeError):
    """The shell died, or gave no framed answer in time; the channel is closed."""

    def __init__(self, message: str, *, exited: bool) -> None:
        super().__init__(message)
        self.exited = exited
        """True: the shell exited (e.g. no daemon yet); False: it timed out."""


class ControlChannel:
    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        timeout: float,
        label: str = "",
    ) -> None:
        """``argv``: the control binary without arguments (maybe wrapped, e.g. in
        ``unshare``); ``timeout``: seconds for one command's answer."""
        self.argv = list(argv)
        self.env = dict(env)
        self.timeout = timeout
        self.label = label
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._seq = 0
        self.starts = 0
        """How many shells this channel has started (1 while it lives)."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def open(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def _ensure(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        await self._discard()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                env=self.env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as err:
            raise ChannelError(f"cannot start {self.argv[0]!r}: {err}", exited=True) from err
        self.starts += 1
        return self._proc

    async def call(self, line: str, timeout: float | None = None) -> str:
        """Send one command line; return its answer (the lines before the sentinel's)."""
        (answer,) = await self.call_many([line], timeout)
        return answer

    async def call_many(self, lines: Sequence[str], timeout: float | None = None) -> list[str]:
        """Send ``lines`` at once (each with its sentinel) and read their answers in
        order: one round trip for all. ``timeout`` is per command."""
        async with self._lock:
            proc = await self._ensure()
            assert proc.stdin is not None and proc.stdout is not None
            sentinels = []
            for _ in lines:
                self._seq += 1
                sentinels.append(f"{SENTINEL_PREFIX}{self._seq}")
            shown = "; ".join(line.strip() for line in lines)
            limit = (timeout or self.timeout) * len(lines)
            try:
                proc.stdin.write(
                    "".join(
                        f"{ln.strip()}\n{s}\n" for ln, s in zip(lines, sentinels, strict=True)
                    ).encode()
                )
                await proc.stdin.drain()
                return await asyncio.wait_for(self._read_all(proc.stdout, sentinels), limit)
            except TimeoutError:
                await self._discard()
                raise ChannelError(
                    f"{self.label}: no answer to `{shown}` within {limit:g}s on the control "
                    "channel",
                    exited=False,
                ) from None
            except (ConnectionError, EOFError) as err:
                code = await self._discard()
                raise ChannelError(
                    f"{self.label}: the control shell exited (status {code}) "
                    f"during `{shown}`{': ' + str(err) if str(err) else ''}",
                    exited=True,
                ) from None

    @classmethod
    async def _read_all(cls, stream: asyncio.StreamReader, sentinels: Sequence[str]) -> list[str]:
        return [await cls._read_until(stream, sentinel) for sentinel in sentinels]

    @staticmethod
    async def _read_until(stream: asyncio.StreamReader, sentinel: str) -> str:
        lines: list[str] = []
        while True:
            raw = await stream.readline()
            if not raw:
                raise EOFError(" ".join(lines).strip())
            text = raw.decode(errors="replace")
            if sentinel in text:
                return "".join(lines)
            lines.append(text)

    async def _discard(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        return await proc.wait()

    async def close(self, grace: float = 1.0) -> None:
        """Close stdin (the shell then exits), kill it if it lingers."""
        async with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.returncode is None and proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), grace)
            await self._discard()
