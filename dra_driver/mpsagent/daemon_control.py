"""How commands reach one GPU's MPS control daemon (I/O; what to send comes from
:mod:`.commands`).

Each command is one run of the control binary (v3: ``<module> <verb>`` on its
command line, docs:mpsv3-interface; legacy: the command on its stdin,
docs:mpsv2-interface), the form of every NVIDIA example, in the daemon's
environment (its GPU, pipe and log directories) and, with ``shm_namespace``, in
its private shm mount namespace (:func:`.commands.in_private_shm`). A command's
process runs on the event loop with no thread of its own (:mod:`.command_process`).

Legacy daemons can opt in to a persistent control channel (:mod:`.channel`,
``control_channel``): one control shell per daemon fed many commands, framed by
a sentinel no document describes (gpu-unverified); where the shell does not
frame answers as expected, the daemon falls back to one process per command for
its life, with a warning. v3 daemons never use it: MPS v3 "replaces the
interactive shell of Legacy MPS v2" (docs:mpsv3-interface), so no document says
a v3 daemon reads commands on stdin at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent.channel import ChannelError, ControlChannel
from dra_driver.mpsagent.command_process import encode_env, run_command
from dra_driver.mpsagent.commands import ControlCall
from dra_driver.mpsagent.daemon_files import DaemonError
from dra_driver.mpsagent.protocol import MpsProtocol

log = logging.getLogger(__name__)

CHANNEL_PROBE_TIMEOUT_S = 2.0
"""How long a readiness probe waits on the channel before trying a process instead."""


class DaemonControl:
    """The commands of one GPU's daemon: on the channel where it is usable, else
    one process each; a refusal or failure raises :class:`.daemon_files.DaemonError`."""

    def __init__(
        self,
        gpu_uuid: str,
        control_binary: str,
        env: Mapping[str, str],
        protocol: MpsProtocol,
        *,
        shm_dir: str,
        shm_namespace: tuple[str, ...] | None,
        command_timeout: float,
        control_channel: bool,
        channel_probe_timeout: float,
    ) -> None:
        self.gpu_uuid = gpu_uuid
        self.control_binary = control_binary
        self.env = env
        self._env_bytes = encode_env(env)
        """``env`` encoded once for every command's spawn."""
        self.protocol: MpsProtocol = protocol
        self.shm_dir = shm_dir
        self.shm_namespace = shm_namespace
        self.command_timeout = command_timeout
        self.channel_probe_timeout = channel_probe_timeout
        self.channel_usable = control_channel and protocol == "legacy"
        """False unless opted in (legacy only), and once the shell did not frame
        answers (then: a process per command)."""
        if control_channel and protocol != "legacy":
            log.warning(
                "GPU %s: the persistent control channel is for legacy MPS only; this %s "
                "daemon gets one process per command (docs:mpsv3-interface documents no shell)",
                gpu_uuid,
                protocol,
            )
        self.channel = ControlChannel(
            self.argv([]), self.env, timeout=command_timeout, label=f"GPU {gpu_uuid}"
        )

    def argv(self, args: Sequence[str]) -> list[str]:
        """The control binary with ``args``, in the GPU's shm namespace when asked."""
        argv = [self.control_binary, *args]
        if self.shm_namespace is None:
            return argv
        return cmd.in_private_shm(argv, self.shm_dir, self.shm_namespace)

    async def run(self, call: ControlCall) -> str:
        """Send ``call`` to the daemon: on the channel, or as a process of its own."""
        if not self._on_channel(call):
            return await self.run_process(call)
        try:
            return await self._run_on_channel(call)
        except ChannelError as err:
            raise DaemonError(f"GPU {self.gpu_uuid}: {err}") from err

    async def run_all(self, calls: Sequence[ControlCall]) -> list[str]:
        """Send ``calls`` in order; on the channel all in one round trip. The first
        that fails raises (on the channel the later ones have run as well)."""
        if len(calls) < 2 or not all(self._on_channel(c) for c in calls):
            return [await self.run(call) for call in calls]
        lines = [c.stdin.strip() if c.stdin is not None else " ".join(c.args) for c in calls]
        try:
            answers = await self.channel.call_many(lines)
        except ChannelError as err:
            raise DaemonError(f"GPU {self.gpu_uuid}: {err}") from err
        for call, answer in zip(calls, answers, strict=True):
            problem = cmd.reply_error(0, answer, "")
            if problem is not None:
                raise DaemonError(f"GPU {self.gpu_uuid}: `{call}` failed: {problem}")
        return answers

    def _on_channel(self, call: ControlCall) -> bool:
        if not self.channel_usable:
            return False
        if call.stdin is not None:
            return call.stdin.strip() not in ("", "quit")
        # -q and the other top-level options are the command line's, not the shell's.
        return bool(call.args) and not call.args[0].startswith("-")

    async def _run_on_channel(self, call: ControlCall, timeout: float | None = None) -> str:
        line = call.stdin.strip() if call.stdin is not None else " ".join(call.args)
        answer = await self.channel.call(line, timeout)
        problem = cmd.reply_error(0, answer, "")
        if problem is not None:
            raise DaemonError(f"GPU {self.gpu_uuid}: `{call}` failed: {problem}")
        return answer

    async def probe(self) -> None:
        """Does the daemon answer? On the channel if it can; a channel that fails
        where a process is answered is given up for one process per command."""
        probe = cmd.probe_call(self.protocol)
        if not self.channel_usable:
            await self.run_process(probe)
            return
        timeout = min(self.command_timeout, self.channel_probe_timeout)
        try:
            await self._run_on_channel(probe, timeout)
            return
        except ChannelError as err:
            first = err
        await self.run_process(probe)  # DaemonError: not up yet (or gone)
        try:  # up now: maybe it only just came up, so the channel gets one more try
            await self._run_on_channel(probe, timeout)
            return
        except ChannelError as err:
            self.channel_usable = False
            log.warning(
                "GPU %s: the MPS daemon answers `%s` run as a process but not on a "
                "persistent control shell (%s; before: %s); one process per command from now on",
                self.gpu_uuid,
                probe,
                err,
                first,
            )

    async def run_process(self, call: ControlCall) -> str:
        """Run the control binary with ``call`` in the daemon's environment."""
        # A command without input reads /dev/null (end of file at once, as an empty pipe
        # gives): no pipe to make and close for it (three per v3 share).
        data = call.stdin.encode() if call.stdin is not None else None
        try:
            done = await run_command(
                self.argv(call.args), self._env_bytes, data, self.command_timeout
            )
        except TimeoutError as err:  # before OSError: TimeoutError is one
            raise DaemonError(
                f"GPU {self.gpu_uuid}: `{call}` timed out after {self.command_timeout:g}s"
            ) from err
        except OSError as err:
            raise DaemonError(f"cannot run {self.control_binary!r}: {err}") from err
        stdout = done.stdout.decode(errors="replace")
        stderr = done.stderr.decode(errors="replace")
        problem = cmd.reply_error(done.returncode, stdout, stderr)
        if problem is not None:
            raise DaemonError(f"GPU {self.gpu_uuid}: `{call}` failed: {problem}")
        return stdout
