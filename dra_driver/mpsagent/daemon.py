"""One MPS control daemon per GPU: its process, from start or adoption to stop (I/O).

The daemon's files are :mod:`.daemon_files`; the commands reach it through
:mod:`.daemon_control`; the shares it holds are :mod:`.daemon_shares`; the GPU's
compute mode around it is :mod:`.previous_mode`; legacy MPS's one-UID check is
:mod:`.uid_monitor`. :class:`MpsDaemon` puts them together for the agent.

The daemon runs with only its GPU visible and its own pipe and log directories;
its control shell (and any command run as a process) gets the same environment,
so it reaches this GPU's daemon.

The shm directory: legacy MPS clients and their server are taken to share POSIX
shared memory in ``/dev/shm`` (NVIDIA's device plugin and DRA driver give them
their daemon's), a path the MPS tools do not let us change (no environment
variable or option names another one). A legacy share's containers get the GPU's
shm directory mounted at ``/dev/shm`` through CDI, so the daemon (and the servers
it spawns) must see that same directory as *their* ``/dev/shm``, not the agent
pod's own. v3 shares' containers keep their own ``/dev/shm``, as NVIDIA's verified
v3 container does (:func:`.commands.share_cdi_edits`).
With ``shm_namespace`` set (the ``unshare`` command, see
:func:`.commands.in_private_shm`), the daemon and every command run in a
private mount namespace with the GPU's shm directory bind-mounted on
``/dev/shm``; that needs CAP_SYS_ADMIN (the agent is privileged with the nvml
backend). Without it (the fake control binary, which has no shared memory)
they use the agent's ``/dev/shm``. Shares of one GPU therefore see one shm and
one pipe tree; different GPUs' shares see different ones.

The daemon is started with ``-f`` as the agent's own child rather than with
``-d``: ``-d`` detaches, and the agent would then learn of the daemon's death
only by polling its pid file, racing PID reuse. As a child, its exit is an
awaited event (:meth:`MpsDaemon.wait_exit`), and the agent restarts it at once.
It runs in its own session, so a signal to the agent's process group does not
reach it, and a crashed agent leaves it running: the next agent *adopts* it
when its control socket answers and watches it by polling that socket, since it
is no longer a child.

Liveness and signals: a daemon is alive when its control socket accepts a
connection, as NVIDIA's clients judge it (:mod:`.sockets`), never by a pid: the
pid file the daemon writes, and any pid an earlier agent recorded, may come from
another PID namespace (the agent's previous container) and name an unrelated
process of this one. The agent records the daemon it starts
(:class:`.daemon_files.DaemonRecord`); an adopted daemon's pid counts only when
a live process still matches that record, and no signal goes to any other pid.
Before a start, what a dead daemon left is cleared: its pid file, its record,
and every socket in its pipe tree that nobody listens on (directories stay:
running containers have namespace directories mounted). A daemon that still
answers there but is not ours is asked to ``quit`` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import sockets
from dra_driver.mpsagent.channel import ControlChannel
from dra_driver.mpsagent.commands import ControlCall, ShareLimits, UidWait
from dra_driver.mpsagent.compute_mode import ComputeMode, ComputeModeError
from dra_driver.mpsagent.daemon_control import CHANNEL_PROBE_TIMEOUT_S, DaemonControl
from dra_driver.mpsagent.daemon_files import DaemonDirs, DaemonError, DaemonRecord, read_pid
from dra_driver.mpsagent.daemon_shares import DaemonShares
from dra_driver.mpsagent.layout import SocketPathTooLong
from dra_driver.mpsagent.previous_mode import enter_exclusive_process, restore_previous_mode
from dra_driver.mpsagent.protocol import MpsProtocol
from dra_driver.mpsagent.uid_monitor import UidMonitor
from dra_driver.state.files import remove_if_exists

log = logging.getLogger(__name__)

PID_FILE_WAIT_S = 1.0
PID_FILE_POLL_S = 0.005
ADOPTED_PROBE_TIMEOUT_S = 0.2
"""How long a look at an adopted daemon's control socket may take (on the event loop)."""


class MpsDaemon:
    def __init__(
        self,
        gpu_uuid: str,
        state_dir: str,
        control_binary: str,
        protocol: MpsProtocol,
        compute_mode: ComputeMode,
        *,
        base_env: Mapping[str, str] | None = None,
        command_timeout: float = 10.0,
        ready_timeout: float = 15.0,
        adopted_poll_interval: float = 0.5,
        shm_namespace: Sequence[str] | None = None,
        uid_check_interval: float = 10.0,
        control_channel: bool = False,
        channel_probe_timeout: float = CHANNEL_PROBE_TIMEOUT_S,
    ) -> None:
        """``shm_namespace``: the ``unshare`` command that gives the daemon a private
        mount namespace with the GPU's shm directory on ``/dev/shm`` (None: the
        agent's own ``/dev/shm``). ``uid_check_interval``: seconds between legacy
        UID checks (0: none). ``control_channel``: opt-in, unverified: a legacy
        daemon's commands over one persistent shell (ignored for v3, which has no
        documented shell; off: one process per command); ``channel_probe_timeout``:
        how long a readiness probe waits for the channel before it tries a process."""
        self.gpu_uuid = gpu_uuid
        try:
            self.dirs = DaemonDirs.for_gpu(state_dir, gpu_uuid)
        except SocketPathTooLong as err:
            raise DaemonError(f"GPU {gpu_uuid}: {err}") from err
        self.control_binary = control_binary
        self.protocol: MpsProtocol = protocol
        self.compute_mode = compute_mode
        self.ready_timeout = ready_timeout
        self.adopted_poll_interval = adopted_poll_interval
        self.stopping = False
        self._proc: asyncio.subprocess.Process | None = None
        self._adopted = False
        self._adopted_record: DaemonRecord | None = None
        """An adopted daemon's process, only when a live one matched our record of it."""
        env = cmd.daemon_env(
            os.environ if base_env is None else base_env,
            gpu_uuid,
            self.dirs.pipe,
            self.dirs.log,
            protocol,
        )
        self.control = DaemonControl(
            gpu_uuid,
            control_binary,
            env,
            protocol,
            shm_dir=self.dirs.shm,
            shm_namespace=tuple(shm_namespace) if shm_namespace else None,
            command_timeout=command_timeout,
            control_channel=control_channel,
            channel_probe_timeout=channel_probe_timeout,
        )
        self.shares = DaemonShares(self.control, self.dirs.pipe)
        self._uids = UidMonitor(
            self.control,
            self.dirs.control_log,
            uid_check_interval,
            running=lambda: self.running,
            stopping=lambda: self.stopping,
        )

    # -- state ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        return None if self._adopted_record is None else self._adopted_record.pid

    @property
    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.returncode is None
        return self._adopted and sockets.answers(self.dirs.control, ADOPTED_PROBE_TIMEOUT_S)

    @property
    def env(self) -> Mapping[str, str]:
        return self.control.env

    @property
    def channel(self) -> ControlChannel:
        return self.control.channel

    @property
    def channel_usable(self) -> bool:
        """False unless opted in (legacy only), and once the shell did not frame
        answers (then: a process per command)."""
        return self.control.channel_usable

    @property
    def uid_wait(self) -> UidWait | None:
        """Legacy MPS: a client waiting on another UID's server (latest check)."""
        return self._uids.uid_wait

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Set EXCLUSIVE_PROCESS, spawn the daemon, and wait until it answers."""
        self.stopping = False
        self.shares.forget()
        self._adopted, self._adopted_record = False, None
        self._uids.uid_wait = None
        await self.channel.close()  # a dead daemon's shell
        self.dirs.create()
        await self._clear_stale()
        try:
            await enter_exclusive_process(self.compute_mode, self.gpu_uuid, self.dirs.previous_mode)
        except ComputeModeError as err:
            raise DaemonError(f"GPU {self.gpu_uuid}: {err}") from err
        out = os.open(
            os.path.join(self.dirs.log, "daemon-output.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o644,
        )
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.control.argv(cmd.daemon_args(self.protocol)),
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        except OSError as err:
            raise DaemonError(
                f"cannot start the MPS control daemon {self.control_binary!r} for GPU "
                f"{self.gpu_uuid}: {err}"
            ) from err
        finally:
            os.close(out)
        try:
            await self._wait_ready()
        except BaseException:
            await self._kill()
            raise
        record = DaemonRecord.of(self._proc.pid) if self._proc is not None else None
        if record is not None:  # None: it died just now; the supervisor will see
            record.save(self.dirs.record)
        self._uids.start()
        log.info(
            "MPS control daemon for GPU %s started (pid %s, %s)",
            self.gpu_uuid,
            self.pid,
            self.protocol,
        )

    async def _wait_for_pid_file(self, limit: float) -> None:
        """Until the new daemon has written its pid file (it does once it listens,
        dra-facts 10; gpu-unverified for ``-f``), at most ``limit`` seconds: then
        the first probe finds it up instead of costing a failed shell and retries."""
        assert self._proc is not None
        path = self.dirs.pid_file
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while self._proc.returncode is None and loop.time() < deadline:
            if read_pid(path) == self._proc.pid:
                return
            await asyncio.sleep(PID_FILE_POLL_S)

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        last = ""
        await self._wait_for_pid_file(min(PID_FILE_WAIT_S, self.ready_timeout))
        while True:
            if self._proc is not None and self._proc.returncode is not None:
                raise DaemonError(
                    f"the MPS control daemon for GPU {self.gpu_uuid} exited with "
                    f"{self._proc.returncode} while starting; see {self.dirs.log}"
                )
            try:
                await self.control.probe()
                return
            except DaemonError as err:
                last = str(err)
            if loop.time() >= deadline:
                raise DaemonError(
                    f"the MPS control daemon for GPU {self.gpu_uuid} did not answer within "
                    f"{self.ready_timeout:g}s: {last}"
                )
            await asyncio.sleep(0.05)

    async def _clear_stale(self) -> None:
        """Clear what a dead daemon left in the pipe directory, so a new one starts.

        A daemon that answers on the control socket is not dead: it is asked to
        ``quit`` (it is none of ours: ours is running, or adopted, or was stopped).
        """
        if sockets.answers(self.dirs.control):
            log.warning(
                "GPU %s: an MPS control daemon this agent did not start answers on %s; "
                "asking it to quit before starting ours",
                self.gpu_uuid,
                self.dirs.control,
            )
            try:
                await self.control.run_process(cmd.quit_call(self.protocol))
            except DaemonError as err:
                log.warning("GPU %s: quit failed: %s", self.gpu_uuid, err)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.ready_timeout
            while sockets.answers(self.dirs.control):
                if loop.time() >= deadline:
                    raise DaemonError(
                        f"GPU {self.gpu_uuid}: an MPS control daemon this agent did not start "
                        f"still answers on {self.dirs.control} after quit; stop it (another "
                        "mps-agent on this state dir?)"
                    )
                await asyncio.sleep(0.05)
        leftovers = [
            *sockets.stale_sockets(self.dirs.pipe),
            self.dirs.pid_file,
            self.dirs.record,
        ]
        cleared = [p for p in leftovers if remove_if_exists(p)]
        if cleared:
            log.info(
                "GPU %s: cleared what a dead MPS daemon left: %s",
                self.gpu_uuid,
                ", ".join(cleared),
            )

    async def adopt(self) -> bool:
        """Take over a daemon a previous agent left running; False if there is none.

        There is one when its control socket answers. Its pid is taken only when a
        live process matches the record of the agent that started it.
        """
        if not sockets.answers(self.dirs.control):
            return False
        record = DaemonRecord.load(self.dirs.record)
        verified = record is not None and record.matches_live_process()
        self._proc = None
        self._adopted = True
        self._adopted_record = record if verified else None
        self.stopping = False
        try:
            await self.control.probe()
            await self.shares.refresh()
        except DaemonError as err:
            log.warning("cannot adopt the MPS daemon of GPU %s: %s", self.gpu_uuid, err)
            self._adopted, self._adopted_record = False, None
            return False
        self._uids.start()
        log.info(
            "adopted the running MPS control daemon for GPU %s (%s)",
            self.gpu_uuid,
            f"pid {self.pid}"
            if self._adopted_record is not None
            else "pid unverified: it will not be signalled",
        )
        return True

    async def wait_exit(self) -> int | None:
        """Return when the daemon is gone: its exit status, None if adopted (unknown)."""
        if self._proc is not None:
            return await self._proc.wait()
        # Not our child: no exit event to await, so poll its control socket, and
        # the process too where it is verified (it exits after it stops answering).
        while self.running or self._verified_process_alive():  # noqa: ASYNC110
            await asyncio.sleep(self.adopted_poll_interval)
        return None

    def _verified_process_alive(self) -> bool:
        """The adopted daemon's process, known by this agent's record of it, still runs."""
        record = self._adopted_record
        return record is not None and record.matches_live_process()

    async def stop(self, timeout: float = 10.0) -> None:
        """``quit`` the daemon, wait for it, and give the GPU back its previous mode."""
        self.stopping = True
        await self.stop_monitoring()
        await self.channel.close()  # quit runs as a process of its own
        if self.running:
            try:
                await self.run(cmd.quit_call(self.protocol))
            except DaemonError as err:
                log.warning("quit failed for the MPS daemon of GPU %s: %s", self.gpu_uuid, err)
            try:
                await asyncio.wait_for(self.wait_exit(), timeout)
            except TimeoutError:
                log.warning("MPS daemon of GPU %s did not quit; killing it", self.gpu_uuid)
                await self._kill()
        self._adopted, self._adopted_record = False, None
        remove_if_exists(self.dirs.record)
        await restore_previous_mode(self.compute_mode, self.gpu_uuid, self.dirs.previous_mode)
        log.info("MPS control daemon for GPU %s stopped", self.gpu_uuid)

    async def _kill(self) -> None:
        await self.channel.close(grace=0)
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
        elif self._adopted:
            # Only the process we recorded starting, still the same one (pid reuse).
            record = self._adopted_record
            if record is not None and record.matches_live_process():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(record.pid, signal.SIGKILL)
            else:
                log.warning(
                    "GPU %s: the adopted MPS daemon did not quit and no live process matches "
                    "this agent's record of it (%s); sending no signal",
                    self.gpu_uuid,
                    self.dirs.record,
                )

    async def stop_monitoring(self) -> None:
        """End the UID monitor (also when the agent leaves the daemon running)."""
        await self._uids.stop()

    async def check_uids(self) -> UidWait | None:
        """Legacy MPS: is a client waiting on a server of another UID? (:mod:`.uid_monitor`)"""
        return await self._uids.check()

    # -- commands and shares --------------------------------------------------------

    async def run(self, call: ControlCall) -> str:
        """Send ``call`` to the daemon (:meth:`.daemon_control.DaemonControl.run`)."""
        return await self.control.run(call)

    async def run_all(self, calls: Sequence[ControlCall]) -> list[str]:
        """Send ``calls`` in order (:meth:`.daemon_control.DaemonControl.run_all`)."""
        return await self.control.run_all(calls)

    async def restore(self, shares: Sequence[ShareLimits]) -> None:
        """Make the daemon hold exactly ``shares`` (after a start, restart or adoption)."""
        await self.shares.restore(shares)

    async def apply(self, share: ShareLimits, all_shares: Sequence[ShareLimits]) -> None:
        """Put one share's limits in force; ``all_shares`` includes it."""
        await self.shares.apply(share, all_shares)

    async def remove(self, share: ShareLimits, remaining: Sequence[ShareLimits]) -> None:
        """Drop one share (others remain; the last share stops the daemon instead)."""
        await self.shares.remove(share, remaining)
