"""One MPS control daemon per GPU (I/O; what to send comes from :mod:`.commands`).

Directories: ``<state dir>/<gpu dir>/{pipe,log,shm}``, the GPU's directory a short
fixed-length name derived from its UUID (:mod:`.layout`: every socket path fits a
unix socket address), with the UUID recorded in it. The daemon runs with only
its GPU visible and its own pipe and log directories; its control shell (and any
command run as a process) gets the same environment, so it reaches this GPU's daemon.

The shm directory: MPS clients and their server share POSIX shared memory in
``/dev/shm``, a path the MPS tools do not let us change (no environment
variable or option names another one). Containers get the GPU's shm directory
mounted at ``/dev/shm`` through CDI, so the daemon (and the servers it spawns)
must see that same directory as *their* ``/dev/shm``, not the agent pod's own.
With ``shm_namespace`` set (the ``unshare`` command, see
:func:`.commands.in_private_shm`), the daemon and every command run in a
private mount namespace with the GPU's shm directory bind-mounted on
``/dev/shm``; that needs CAP_SYS_ADMIN (the agent is privileged with the nvml
backend). Without it (the fake control binary, which has no shared memory)
they use the agent's ``/dev/shm``. Shares of one GPU therefore see one shm and
one pipe tree; different GPUs' shares see different ones.

The compute mode: before it first sets EXCLUSIVE_PROCESS, the daemon records
the GPU's mode in ``<state dir>/<gpu uuid>/compute-mode.previous`` (the agent's
state directory); :meth:`MpsDaemon.stop` restores that mode and removes the
file. A restarted daemon or agent finds the file and keeps the first mode.

Legacy MPS serves one UID at a time: while the daemon runs, a monitor reads the
control daemon's log (and ``get_server_list``) every ``uid_check_interval``
seconds and reports a client that waits on another UID's server
(:attr:`MpsDaemon.uid_wait`, a warning naming both UIDs and the fix).

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
process of this one. The agent records the daemon it starts in
``<gpu dir>/daemon.json`` (pid, start time, command line); an adopted daemon's
pid counts only when a live process still matches that record, and no signal
goes to any other pid. Before a start, what a dead daemon left is cleared: its
pid file, its record, and every socket in its pipe tree that nobody listens on
(directories stay: running containers have namespace directories mounted). A
daemon that still answers there but is not ours is asked to ``quit`` first.

A dead daemon takes its servers, namespaces and limits with it (they live only
in the daemon); :meth:`MpsDaemon.restore` re-creates them for the live shares.

Each command is one run of the control binary (v3: ``<module> <verb>`` on its
command line, docs:mpsv3-interface; legacy: the command on its stdin,
docs:mpsv2-interface), the form of every NVIDIA example. Legacy daemons can opt
in to a persistent control channel (:mod:`.channel`, ``control_channel``): one
control shell per daemon fed many commands, framed by a sentinel no document
describes (gpu-unverified); where the shell does not frame answers as expected,
the daemon falls back to one process per command for its life, with a warning.
v3 daemons never use it: MPS v3 "replaces the interactive shell of Legacy MPS
v2" (docs:mpsv3-interface), so no document says a v3 daemon reads commands on
stdin at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import listing, sockets
from dra_driver.mpsagent.channel import ChannelError, ControlChannel
from dra_driver.mpsagent.commands import ControlCall, ShareLimits, UidWait
from dra_driver.mpsagent.compute_mode import ComputeMode, ComputeModeError, Mode, parse_mode
from dra_driver.mpsagent.layout import (
    GPU_UUID_FILE,
    SOCKET_NAME,
    SocketPathTooLong,
    check_socket_path,
    gpu_dir_name,
    is_mig_uuid,
)
from dra_driver.mpsagent.procs import identity
from dra_driver.mpsagent.protocol import MpsProtocol
from dra_driver.state.files import atomic_write, remove_if_exists

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"
"""Written by the daemon into its pipe directory (dra-facts 10)."""
CONTROL_LOG = "control.log"
"""The control daemon's log in its log directory (docs:appendix-logging)."""
PREVIOUS_MODE_FILE = "compute-mode.previous"
"""The GPU's compute mode before its daemon first started (in the GPU's directory)."""
RECORD_FILE = "daemon.json"
"""In the GPU's directory: the daemon this agent started (pid, start time, command line)."""
SHM_MODE = 0o1777
"""Like /dev/shm: clients of any UID create their shared memory there."""
LOG_TAIL_BYTES = 1 << 20
PID_FILE_WAIT_S = 1.0
PID_FILE_POLL_S = 0.005
CHANNEL_PROBE_TIMEOUT_S = 2.0
"""How long a readiness probe waits on the channel before trying a process instead."""
ADOPTED_PROBE_TIMEOUT_S = 0.2
"""How long a look at an adopted daemon's control socket may take (on the event loop)."""


class DaemonError(RuntimeError):
    """The daemon could not be started, or refused or failed a command."""


@dataclass(frozen=True)
class DaemonDirs:
    gpu_uuid: str
    root: str
    pipe: str
    log: str
    shm: str

    @classmethod
    def for_gpu(cls, state_dir: str, gpu_uuid: str) -> DaemonDirs:
        """The short layout (:mod:`.layout`); raises :class:`SocketPathTooLong` when
        the daemon's control socket would not fit."""
        root = os.path.join(state_dir, gpu_dir_name(gpu_uuid))
        dirs = cls(
            gpu_uuid=gpu_uuid,
            root=root,
            pipe=os.path.join(root, "pipe"),
            log=os.path.join(root, "log"),
            shm=os.path.join(root, "shm"),
        )
        check_socket_path(dirs.control)
        return dirs

    def create(self) -> None:
        """Make the directories and record whose they are; DaemonError if they are
        another GPU's (two UUIDs with the same short name)."""
        os.makedirs(self.root, mode=0o755, exist_ok=True)
        owner = os.path.join(self.root, GPU_UUID_FILE)
        try:
            with open(owner) as f:
                recorded = f.read().strip()
        except FileNotFoundError:
            atomic_write(owner, f"{self.gpu_uuid}\n".encode(), fsync=False)
            recorded = self.gpu_uuid
        if recorded != self.gpu_uuid:
            raise DaemonError(
                f"{self.root} belongs to {recorded} ({owner}), not to {self.gpu_uuid}: two "
                "UUIDs with the same short directory name; remove the directory of the one "
                "no longer on this node"
            )
        for path in (self.pipe, self.log, self.shm):
            os.makedirs(path, mode=0o755, exist_ok=True)
        os.chmod(self.shm, SHM_MODE)

    @property
    def control(self) -> str:
        """The daemon's control socket (docs:mpsv3-namespaces "Namespace Routing")."""
        return os.path.join(self.pipe, SOCKET_NAME)

    @property
    def previous_mode(self) -> str:
        return os.path.join(self.root, PREVIOUS_MODE_FILE)

    @property
    def record(self) -> str:
        return os.path.join(self.root, RECORD_FILE)


@dataclass(frozen=True)
class DaemonRecord:
    """The daemon an agent started: enough to know the process again, and only it."""

    pid: int
    start_time: int
    cmdline: tuple[str, ...]

    def matches_live_process(self) -> bool:
        return identity(self.pid) == (self.start_time, self.cmdline)

    @classmethod
    def of(cls, pid: int) -> DaemonRecord | None:
        found = identity(pid)
        return None if found is None else cls(pid, found[0], found[1])

    @classmethod
    def load(cls, path: str) -> DaemonRecord | None:
        try:
            with open(path) as f:
                doc = json.load(f)
            return cls(int(doc["pid"]), int(doc["start_time"]), tuple(map(str, doc["cmdline"])))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring the unreadable MPS daemon record %s: %s", path, err)
            return None

    def save(self, path: str) -> None:
        doc = {"pid": self.pid, "start_time": self.start_time, "cmdline": list(self.cmdline)}
        atomic_write(path, json.dumps(doc).encode(), fsync=False)


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _read_tail(path: str, size: int = LOG_TAIL_BYTES) -> str:
    """The last ``size`` bytes of a log (it grows for the daemon's whole life)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


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
        self.env = cmd.daemon_env(
            os.environ if base_env is None else base_env,
            gpu_uuid,
            self.dirs.pipe,
            self.dirs.log,
            protocol,
        )
        self.command_timeout = command_timeout
        self.ready_timeout = ready_timeout
        self.adopted_poll_interval = adopted_poll_interval
        self.shm_namespace = tuple(shm_namespace) if shm_namespace else None
        self.uid_check_interval = uid_check_interval
        self.uid_wait: UidWait | None = None
        """Legacy MPS: a client waiting on another UID's server (latest check)."""
        self._uid_monitor: asyncio.Task[None] | None = None
        self.stopping = False
        self._proc: asyncio.subprocess.Process | None = None
        self._adopted = False
        self._adopted_record: DaemonRecord | None = None
        """An adopted daemon's process, only when a live one matched our record of it."""
        self._server_exists = False
        self._namespaces: set[str] = set()
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
            self._argv([]), self.env, timeout=command_timeout, label=f"GPU {gpu_uuid}"
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

    def namespace_dir(self, namespace: str) -> str:
        return cmd.v3_namespace_dir(self.dirs.pipe, namespace)

    def _argv(self, args: Sequence[str]) -> list[str]:
        """The control binary with ``args``, in the GPU's shm namespace when asked."""
        argv = [self.control_binary, *args]
        if self.shm_namespace is None:
            return argv
        return cmd.in_private_shm(argv, self.dirs.shm, self.shm_namespace)

    # -- compute mode -----------------------------------------------------------------

    def _recorded_mode(self) -> Mode | None:
        try:
            with open(self.dirs.previous_mode) as f:
                return parse_mode(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ComputeModeError) as err:
            log.warning("ignoring %s: %s", self.dirs.previous_mode, err)
            return None

    async def _enter_exclusive_process(self) -> None:
        """Record the GPU's compute mode (first start only), then set EXCLUSIVE_PROCESS.

        Recorded before it is changed, so a crash in between leaves the right mode.
        A daemon for a MIG instance (``MIG-<uuid>``) leaves compute modes alone:
        the mode belongs to the parent GPU, whose other instances are not ours,
        and NVIDIA's MPS-on-MIG steps select the instance by
        ``CUDA_VISIBLE_DEVICES`` only (to be confirmed on a real GPU).
        """
        if is_mig_uuid(self.gpu_uuid):
            return
        if self._recorded_mode() is None:
            try:
                previous = await self.compute_mode.get_mode(self.gpu_uuid)
            except ComputeModeError as err:
                previous = "DEFAULT"
                log.warning(
                    "cannot read GPU %s's compute mode (%s); DEFAULT will be restored after "
                    "its last MPS share",
                    self.gpu_uuid,
                    err,
                )
            atomic_write(self.dirs.previous_mode, f"{previous}\n".encode())
            log.info("GPU %s compute mode before MPS: %s", self.gpu_uuid, previous)
        await self.compute_mode.set_mode(self.gpu_uuid, "EXCLUSIVE_PROCESS")

    async def _restore_compute_mode(self) -> None:
        """Give the GPU back the mode it had before MPS (DEFAULT if none was recorded)."""
        if is_mig_uuid(self.gpu_uuid):
            return
        mode = self._recorded_mode() or "DEFAULT"
        try:
            await self.compute_mode.set_mode(self.gpu_uuid, mode)
        except ComputeModeError as err:
            # The record stays: the next stop tries again with the same mode.
            log.error("cannot restore GPU %s compute mode to %s: %s", self.gpu_uuid, mode, err)
            return
        remove_if_exists(self.dirs.previous_mode)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Set EXCLUSIVE_PROCESS, spawn the daemon, and wait until it answers."""
        self.stopping = False
        self._server_exists = False
        self._namespaces = set()
        self._adopted, self._adopted_record = False, None
        self.uid_wait = None
        await self.channel.close()  # a dead daemon's shell
        self.dirs.create()
        await self._clear_stale()
        try:
            await self._enter_exclusive_process()
        except ComputeModeError as err:
            raise DaemonError(f"GPU {self.gpu_uuid}: {err}") from err
        out = os.open(
            os.path.join(self.dirs.log, "daemon-output.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o644,
        )
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self._argv(cmd.daemon_args(self.protocol)),
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
        self._start_uid_monitor()
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
        path = os.path.join(self.dirs.pipe, PID_FILE)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while self._proc.returncode is None and loop.time() < deadline:
            if _read_pid(path) == self._proc.pid:
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
                await self._probe()
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
                await self._run_process(cmd.quit_call(self.protocol))
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
            os.path.join(self.dirs.pipe, PID_FILE),
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
            await self._probe()
            await self._refresh()
        except DaemonError as err:
            log.warning("cannot adopt the MPS daemon of GPU %s: %s", self.gpu_uuid, err)
            self._adopted, self._adopted_record = False, None
            return False
        self._start_uid_monitor()
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
        await self._restore_compute_mode()
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

    # -- commands -------------------------------------------------------------------

    async def run(self, call: ControlCall) -> str:
        """Send ``call`` to the daemon: on the channel, or as a process of its own."""
        if not self._on_channel(call):
            return await self._run_process(call)
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

    async def _probe(self) -> None:
        """Does the daemon answer? On the channel if it can; falls back (see above)."""
        probe = cmd.probe_call(self.protocol)
        if not self.channel_usable:
            await self._run_process(probe)
            return
        timeout = min(self.command_timeout, self.channel_probe_timeout)
        try:
            await self._run_on_channel(probe, timeout)
            return
        except ChannelError as err:
            first = err
        await self._run_process(probe)  # DaemonError: not up yet (or gone)
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

    async def _run_process(self, call: ControlCall) -> str:
        """Run the control binary with ``call`` in the daemon's environment."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._argv(call.args),
                env=self.env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as err:
            raise DaemonError(f"cannot run {self.control_binary!r}: {err}") from err
        data = (call.stdin or "").encode()
        try:
            out, err_out = await asyncio.wait_for(proc.communicate(data), self.command_timeout)
        except TimeoutError as err:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise DaemonError(
                f"GPU {self.gpu_uuid}: `{call}` timed out after {self.command_timeout:g}s"
            ) from err
        stdout, stderr = out.decode(errors="replace"), err_out.decode(errors="replace")
        problem = cmd.reply_error(proc.returncode or 0, stdout, stderr)
        if problem is not None:
            raise DaemonError(f"GPU {self.gpu_uuid}: `{call}` failed: {problem}")
        return stdout

    async def _refresh(self) -> None:
        """Learn which server and namespaces the daemon holds (v3)."""
        if self.protocol != "v3":
            return
        servers = listing.parse_v3_server_names(await self.run(cmd.v3_server_list()))
        self._log_problems(servers.problems)
        self._server_exists = cmd.SERVER_NAME in servers.names
        self._namespaces = set()
        if self._server_exists:
            spaces = listing.parse_v3_namespace_list(await self.run(cmd.v3_namespace_list()))
            self._log_problems(spaces.problems)
            self._namespaces = {r.name for r in spaces.rows if r.server == cmd.SERVER_NAME}

    def _log_problems(self, problems: Sequence[listing.ListingProblem]) -> None:
        """A listing line not in the documented form costs that line, not the adoption."""
        for problem in problems:
            log.warning("GPU %s: %s", self.gpu_uuid, problem)

    async def restore(self, shares: Sequence[ShareLimits]) -> None:
        """Make the daemon hold exactly ``shares`` (after a start, restart or adoption)."""
        if self.protocol == "v3":
            await self.run_all(cmd.render_v3_restore(shares, self._namespaces, self._server_exists))
            self._server_exists = True
            self._namespaces = {s.namespace for s in shares}
            for share in shares:
                os.makedirs(self.namespace_dir(share.namespace), exist_ok=True)
        else:
            await self._apply_legacy(shares)

    async def apply(self, share: ShareLimits, all_shares: Sequence[ShareLimits]) -> None:
        """Put one share's limits in force; ``all_shares`` includes it."""
        if self.protocol != "v3":
            await self._apply_legacy(all_shares)
            return
        if not self._server_exists:
            await self._refresh()
            if not self._server_exists:
                await self.run(cmd.v3_server_create())
                self._server_exists = True
        exists = share.namespace in self._namespaces
        try:
            await self.run_all(cmd.render_v3_apply(share, exists))
        except DaemonError:
            # Our view may be stale (a half-done earlier attempt): look, then retry once.
            await self._refresh()
            for call in cmd.render_v3_apply(share, share.namespace in self._namespaces):
                await self.run(call)
        self._namespaces.add(share.namespace)
        # The container's pipe mount needs the directory even before a client connects.
        os.makedirs(self.namespace_dir(share.namespace), exist_ok=True)

    async def remove(self, share: ShareLimits, remaining: Sequence[ShareLimits]) -> None:
        """Drop one share (others remain; the last share stops the daemon instead)."""
        if self.protocol != "v3":
            await self._apply_legacy(remaining)
            return
        try:
            await self.run(cmd.v3_namespace_delete(share.namespace))
        except DaemonError:
            await self._refresh()
            if share.namespace in self._namespaces:
                raise
        self._namespaces.discard(share.namespace)

    async def _apply_legacy(self, shares: Sequence[ShareLimits]) -> None:
        pids = cmd.parse_legacy_server_list(await self.run(ControlCall(stdin="get_server_list\n")))
        await self.run_all(cmd.render_legacy_apply(self.gpu_uuid, shares, pids))

    # -- legacy MPS: one UID at a time ----------------------------------------------

    async def check_uids(self) -> UidWait | None:
        """Legacy MPS: is a client waiting on a server of another UID? (None under v3.)

        ``get_server_list`` gives the live servers; the control log gives their
        UIDs and the clients' (see :func:`.commands.legacy_uid_wait`).
        """
        if self.protocol != "legacy" or not self.running:
            return None
        pids = cmd.parse_legacy_server_list(await self.run(ControlCall(stdin="get_server_list\n")))
        text = await asyncio.to_thread(_read_tail, os.path.join(self.dirs.log, CONTROL_LOG))
        found = cmd.legacy_uid_wait(text, pids)
        if found != self.uid_wait:
            if found is not None:
                log.warning("GPU %s: %s", self.gpu_uuid, cmd.describe_uid_wait(found))
            else:
                log.info("GPU %s: no MPS client waits on another UID's server now", self.gpu_uuid)
        self.uid_wait = found
        return found

    def _start_uid_monitor(self) -> None:
        if self.protocol != "legacy" or self.uid_check_interval <= 0:
            return
        if self._uid_monitor is None or self._uid_monitor.done():
            self._uid_monitor = asyncio.create_task(
                self._monitor_uids(), name=f"mps-uids-{self.gpu_uuid}"
            )

    async def stop_monitoring(self) -> None:
        """End the UID monitor (also when the agent leaves the daemon running)."""
        task, self._uid_monitor = self._uid_monitor, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _monitor_uids(self) -> None:
        while not self.stopping:
            await asyncio.sleep(self.uid_check_interval)
            try:
                await self.check_uids()
            except DaemonError as err:
                # A daemon that died is the supervisor's business; look again later.
                log.debug("GPU %s: UID check failed: %s", self.gpu_uuid, err)
