"""The mps-agent server: owns the MPS daemons, answers the plugin on a unix socket.

The agent is its own long-lived process (``dra-driver mps-agent``, a DaemonSet
updated only on delete), so a plugin restart or rolling update never touches a
running daemon or its clients. Requests (:mod:`.protocol`) come in on a unix
socket (:mod:`.server`). What runs at once is :mod:`.gpu_gate`'s: the shares of
different claims on one v3 daemon side by side, each share's own operations in
turn, a daemon's start, restart and stop alone; concurrent changes share one
write of the state file (:mod:`.state_writer`).

Every live share is recorded (:mod:`.agent_state`). A starting agent adopts a
daemon a previous agent left running, or starts a fresh one, and restores the
recorded shares' namespaces and limits. A supervisor per GPU waits for the daemon's exit; when
it dies unasked, the agent logs what was lost with it and restarts it with
every live share restored, retrying with backoff.

A v3 release answers once the state file no longer holds the share; its namespace's
``namespace delete`` runs after the answer (:meth:`MpsAgent._delete_namespace`). By
then the claim's containers are gone (the kubelet unprepares after them), and a
namespace holds caps, not memory or SMs (docs:mpsv3-namespaces), so one left a moment
longer serves no one and takes nothing from the next share. A failed delete is
logged, counted and retried; a daemon that dies or stops takes the namespace with it;
an agent that dies first leaves it to the next agent's restore, which deletes every
namespace of ours the state file does not hold. An ensure of the same share waits for
the delete's try in flight, so a namespace is never deleted under its new share. The
delete waits for a quiet spell of the plugin's calls (they come in waves;
:mod:`.quiet_spell`), so its processes do not take the cores from the calls still
waiting.

Each GPU's v3 daemon keeps ``spare_namespaces`` namespaces made ahead of the shares
(:mod:`.daemon_shares`), so a new share's ensure sends one command, ``namespace
set``, not two; none when the spare's limits were set ahead to what it asks for (a
spare made after a share of the GPU has its limits set to that share's: the
next share of the same size, the common case of a node's replicas, takes it as it
is). They are made when the calls pause, as the deletes are, and made again as
shares take them. A share's namespace is recorded with it, so a share keeps the
spare it took across an agent's restart and a daemon's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.agent_state import (
    StateEncoder,
    load_state,
    relaid,
    save_state,
    state_path,
)
from dra_driver.mpsagent.commands import ShareLimits
from dra_driver.mpsagent.compute_mode import ComputeMode, NvidiaSmiComputeMode
from dra_driver.mpsagent.daemon import MpsDaemon
from dra_driver.mpsagent.daemon_files import DaemonError
from dra_driver.mpsagent.gpu_gate import GpuGate, ShareLocks
from dra_driver.mpsagent.layout import SocketPathTooLong, check_state_dir, is_short_namespace
from dra_driver.mpsagent.migrate import retire_old_gpu_dirs
from dra_driver.mpsagent.protocol import MpsProtocol, ShareInfo
from dra_driver.mpsagent.quiet_spell import QuietSpell
from dra_driver.mpsagent.server import AgentRequestError, AgentServer
from dra_driver.mpsagent.state_writer import CoalescedWrite

log = logging.getLogger(__name__)

DELETE_RETRY_FIRST_S = 0.5
"""A released share's failed namespace delete is tried again after this, doubling..."""
DELETE_RETRY_MAX_S = 30.0
"""...up to this."""
DELETE_IDLE_S = 0.1
"""A released share's namespace delete waits until no ensure or release has run for
this long: the plugin's calls come in waves (a node's pods start and stop together),
and a delete's processes would take the cores from the calls still waiting..."""
DELETE_IDLE_MAX_WAIT_S = 2.0
"""...but never longer than this (a node never idle still gets its deletes)."""
SPARE_RETRY_FIRST_S = 0.5
"""A spare namespace the daemon refused is tried again after this, doubling..."""
SPARE_RETRY_MAX_S = 30.0
"""...up to this."""


class ShareFields(Protocol):
    """What a share is, whoever says it: an ensure request or a recorded share."""

    @property
    def gpu_uuid(self) -> str: ...
    @property
    def share_id(self) -> str: ...
    @property
    def claim_uid(self) -> str: ...
    @property
    def memory_limit_bytes(self) -> int: ...
    @property
    def active_thread_percentage(self) -> int: ...
    @property
    def uid(self) -> int | None: ...
    @property
    def tenant(self) -> str | None: ...


@dataclass(frozen=True)
class AgentConfig:
    socket_path: str
    """The agent's unix socket, in the plugin directory (e.g. ``<plugin dir>/mps-agent.sock``)."""
    state_dir: str
    """Per-GPU daemon directories and the agent's state file."""
    control_binary: str = "nvidia-cuda-mps-control"
    """The real binary, or the fake launcher
    (:func:`dra_driver.fakes.mps_control.fake_control_path`)."""
    protocol: str = "auto"
    """``v3``, ``legacy``, or ``auto`` (v3 from driver 615, by ``driver_version``)."""
    compute_mode: ComputeMode = field(default_factory=NvidiaSmiComputeMode)
    driver_version: str | None = None
    daemon_env: Mapping[str, str] | None = None
    """Base environment of the daemons and commands (default: the agent's own)."""
    command_timeout_s: float = 10.0
    restart_backoff_s: float = 0.2
    restart_backoff_max_s: float = 30.0
    stop_daemons_on_exit: bool = True
    """Quit the daemons when the agent stops (its container is going away anyway)."""
    shm_namespace: tuple[str, ...] | None = None
    """The ``unshare`` command giving each daemon its GPU's shm directory as /dev/shm
    (:func:`.commands.in_private_shm`); None: the agent's own /dev/shm (fake only)."""
    uid_check_interval_s: float = 10.0
    """Legacy MPS: seconds between checks for a client waiting on another UID (0: none)."""
    control_channel: bool = False
    """Opt-in, unverified: legacy daemons' commands over one persistent control shell
    each (:mod:`.channel`). Off: one process per command, the form every NVIDIA
    example uses. v3 daemons always run a process per command."""
    spare_namespaces: int = 0
    """MPS v3: namespaces each running daemon keeps made ahead of the shares, so a new
    share's ensure sends one command (``namespace set``) instead of two. 0: none (every
    share's namespace is created by its ensure; ``dra-driver mps-agent``'s
    ``--spare-namespaces`` defaults to 2)."""


def _limits(share: ShareInfo) -> ShareLimits:
    return ShareLimits(
        share.share_id,
        share.memory_limit_bytes,
        share.active_thread_percentage,
        taken_namespace=share.namespace,
    )


DaemonFactory = Callable[[str], MpsDaemon]
"""GPU UUID → the (not yet started) MPS control daemon of that GPU."""

SupervisorFailed = Callable[[str, BaseException], None]
"""(task name, why) → told when a daemon's supervisor dies unexpectedly."""


class MpsAgent:
    """The shares, their daemons and the socket, given their collaborators: the MPS
    protocol, a daemon per GPU (made by ``daemon``, on first use) and who is told
    when a supervisor dies (built by :func:`dra_driver.app.agent.run_agent`)."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        protocol: MpsProtocol,
        daemon: DaemonFactory,
        supervisor_failed: SupervisorFailed,
    ) -> None:
        self.config = config
        self.protocol: MpsProtocol = protocol
        self._make_daemon = daemon
        self._supervisor_failed = supervisor_failed
        self._shares: dict[tuple[str, str], ShareInfo] = {}
        self._daemons: dict[str, MpsDaemon] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._restarts: dict[str, int] = {}
        self._gates: dict[str, GpuGate] = {}
        self._share_locks = ShareLocks()
        self._deleting: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Released v3 shares whose namespace delete has not succeeded yet."""
        self._released_namespaces: dict[tuple[str, str], str] = {}
        """Their namespaces: the share, ensured again before the delete, keeps its own."""
        self._refills: dict[str, asyncio.Task[None]] = {}
        """Per GPU: making its daemon's spare namespaces, when the calls pause."""
        self._spare_failures: dict[str, int] = {}
        self._spare_limits: dict[str, cmd.Limits] = {}
        """Per GPU, the limits its last new share asked for: what its spares are set to."""
        self._between_tries: set[tuple[str, str]] = set()
        self._delete_failures: dict[str, int] = {}
        self._calls = QuietSpell(DELETE_IDLE_S, DELETE_IDLE_MAX_WAIT_S)
        """Ensures and releases: what the deletes wait out."""
        self._state_text = StateEncoder()
        self._state = CoalescedWrite(self._save)
        self._server = AgentServer(self, config.socket_path)

    # -- state ----------------------------------------------------------------------

    @property
    def state_path(self) -> str:
        return state_path(self.config.state_dir)

    def _save(self) -> None:
        save_state(self.state_path, self.protocol, self.list_shares(), self._state_text)

    def _load(self) -> None:
        """Take the recorded shares, each laid out as this agent lays it out."""
        for share in load_state(self.state_path):
            kept_namespace = (
                share.namespace
                if share.namespace is not None and is_short_namespace(share.namespace)
                else None
            )
            try:
                current = self._share_info(share, kept_namespace)
            except (DaemonError, SocketPathTooLong) as err:
                log.error("dropping recorded share %s: %s", share.share_id, err)
                continue
            kept = relaid(share, current)
            self._shares[(kept.gpu_uuid, kept.share_id)] = kept

    def _gpu_shares(self, gpu_uuid: str) -> list[ShareInfo]:
        return [s for (gpu, _), s in sorted(self._shares.items()) if gpu == gpu_uuid]

    def _gate(self, gpu_uuid: str) -> GpuGate:
        return self._gates.setdefault(gpu_uuid, GpuGate())

    def _running_daemon(self, gpu_uuid: str) -> MpsDaemon | None:
        daemon = self._daemons.get(gpu_uuid)
        return daemon if daemon is not None and daemon.running else None

    def _daemon(self, gpu_uuid: str) -> MpsDaemon:
        daemon = self._daemons.get(gpu_uuid)
        if daemon is None:
            daemon = self._make_daemon(gpu_uuid)
            self._daemons[gpu_uuid] = daemon
        return daemon

    def _share_info(self, share: ShareFields, namespace: str | None = None) -> ShareInfo:
        """The record of ``share`` (a request, or a record an earlier agent wrote) as this
        agent lays it out: its daemon's protocol, namespace (``namespace``: the one it
        holds already; else the one named after it) and directories."""
        gpu_uuid, share_id = share.gpu_uuid, share.share_id
        daemon_dirs = self._daemon(gpu_uuid).dirs
        # A MIG instance's daemon is legacy whatever the agent runs (cmd.daemon_protocol).
        protocol = cmd.daemon_protocol(self.protocol, gpu_uuid)
        if protocol != "v3":
            namespace = None
        elif namespace is None:
            namespace = cmd.namespace_name(share_id)
        pipe = (
            cmd.v3_namespace_dir(daemon_dirs.pipe, namespace)
            if namespace is not None
            else daemon_dirs.pipe
        )
        return ShareInfo(
            gpu_uuid=gpu_uuid,
            share_id=share_id,
            claim_uid=share.claim_uid,
            memory_limit_bytes=share.memory_limit_bytes,
            active_thread_percentage=share.active_thread_percentage,
            uid=share.uid,
            protocol=protocol,
            namespace=namespace,
            pipe_dir=pipe,
            shm_dir=daemon_dirs.shm,
            tenant=share.tenant,
        )

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Load the recorded shares and bring each of their GPUs' daemons back.

        Raises :class:`~.layout.StateDirTooLong` when the state dir leaves MPS
        sockets no room (before anything is made)."""
        check_state_dir(self.config.state_dir)
        os.makedirs(self.config.state_dir, exist_ok=True)
        await retire_old_gpu_dirs(
            self.config.state_dir,
            self.config.control_binary,
            os.environ if self.config.daemon_env is None else self.config.daemon_env,
        )
        self._load()
        for gpu_uuid in sorted({gpu for gpu, _ in self._shares}):
            async with self._gate(gpu_uuid).exclusive():
                daemon = self._daemon(gpu_uuid)
                shares = [_limits(s) for s in self._gpu_shares(gpu_uuid)]
                try:
                    if not await daemon.adopt():
                        await daemon.start()
                    await daemon.restore(shares)
                except DaemonError as err:
                    log.error("cannot bring back the MPS daemon of GPU %s: %s", gpu_uuid, err)
                    if not daemon.running:
                        continue
                self._watch(gpu_uuid)
                self._want_spares(gpu_uuid)
        await self._state.save()

    async def close(self) -> None:
        await self._server.close()
        refills = list(self._refills.values())
        self._refills.clear()
        for refill in refills:
            refill.cancel()
        await asyncio.gather(*refills, return_exceptions=True)
        # A delete not done is the next agent's: its restore deletes what no share holds.
        pending = list(self._deleting.values())
        self._deleting.clear()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self.config.stop_daemons_on_exit:
            for gpu_uuid in sorted(self._daemons):
                async with self._gate(gpu_uuid).exclusive():
                    await self._stop_daemon(gpu_uuid)
        for daemon in self._daemons.values():  # left running (stop_daemons_on_exit off)
            await daemon.stop_monitoring()
        for task in self._watchers.values():
            task.cancel()
        await asyncio.gather(*self._watchers.values(), return_exceptions=True)
        self._watchers.clear()
        self._server.remove_socket()

    # -- supervision ----------------------------------------------------------------

    def _watch(self, gpu_uuid: str) -> None:
        task = self._watchers.get(gpu_uuid)
        if task is None or task.done():
            task = asyncio.create_task(self._supervise(gpu_uuid), name=f"mps-watch-{gpu_uuid}")
            task.add_done_callback(self._watcher_done)
            self._watchers[gpu_uuid] = task

    def _watcher_done(self, task: asyncio.Task[None]) -> None:
        """A supervisor returns when its daemon is stopped on purpose; one that raised
        is told to ``supervisor_failed`` (the agent then stops)."""
        if task.cancelled():
            return
        err = task.exception()
        if err is not None:
            log.error("MPS daemon supervisor %s failed", task.get_name(), exc_info=err)
            self._supervisor_failed(task.get_name(), err)

    async def _supervise(self, gpu_uuid: str) -> None:
        daemon = self._daemons[gpu_uuid]
        while True:
            pid = daemon.pid
            code = await daemon.wait_exit()
            if daemon.stopping:
                return
            lost = self._gpu_shares(gpu_uuid)
            log.error(
                "MPS control daemon for GPU %s (pid %s) died unasked (exit status %s). Lost "
                "with it: its server and %s; clients connected to it lost their MPS "
                "connection. Restarting it and restoring %d live share(s).",
                gpu_uuid,
                pid,
                "unknown (adopted daemon)" if code is None else code,
                ", ".join(
                    f"share {s.share_id} (claim {s.claim_uid}"
                    + (f", namespace {s.namespace}" if s.namespace else "")
                    + f": {cmd.memory_limit_value(s.memory_limit_bytes)} pinned memory, "
                    f"{s.active_thread_percentage}% threads)"
                    for s in lost
                )
                or "no shares",
                len(lost),
            )
            delay = self.config.restart_backoff_s
            while True:
                async with self._gate(gpu_uuid).exclusive():
                    if daemon.stopping:
                        return
                    if daemon.running:
                        # A prepare found it down first and started it with the shares.
                        log.warning(
                            "MPS daemon of GPU %s was restarted by a prepare (pid %s)",
                            gpu_uuid,
                            daemon.pid,
                        )
                        break
                    shares = [_limits(s) for s in self._gpu_shares(gpu_uuid)]
                    try:
                        await daemon.start()
                        await daemon.restore(shares)
                    except DaemonError as err:
                        log.error("restarting the MPS daemon of GPU %s failed: %s", gpu_uuid, err)
                    else:
                        self._restarts[gpu_uuid] = self._restarts.get(gpu_uuid, 0) + 1
                        self._want_spares(gpu_uuid)
                        log.warning(
                            "MPS daemon of GPU %s restarted (pid %s); %d share(s) restored: %s",
                            gpu_uuid,
                            daemon.pid,
                            len(shares),
                            ", ".join(s.share_id for s in shares) or "none",
                        )
                        break
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.restart_backoff_max_s)

    async def _stop_daemon(self, gpu_uuid: str) -> None:
        daemon = self._daemons.get(gpu_uuid)
        if daemon is None:
            return
        await daemon.stop()
        watcher = self._watchers.pop(gpu_uuid, None)
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        del self._daemons[gpu_uuid]

    # -- operations -----------------------------------------------------------------

    async def ensure_share(self, req: wire.EnsureShare) -> ShareInfo:
        """Create the share, or set its limits again; answered once the state file
        holds it. A v3 share's commands run beside other shares' of its GPU; a
        daemon to start, and every legacy share, have the GPU to themselves."""
        key = (req.gpu_uuid, req.share_id)
        with self._calls.call():
            return await self._ensure_share(key, req)

    async def _ensure_share(self, key: tuple[str, str], req: wire.EnsureShare) -> ShareInfo:
        released = await self._no_delete_pending(key)
        async with self._share_locks.hold(key):
            existing = self._shares.get(key)
            if existing is not None and existing.claim_uid != req.claim_uid:
                raise AgentRequestError(
                    "conflict",
                    f"share {req.share_id} on GPU {req.gpu_uuid} belongs to claim "
                    f"{existing.claim_uid}, not {req.claim_uid}",
                )
            if cmd.daemon_protocol(self.protocol, req.gpu_uuid) == "legacy":
                # Every legacy change re-sends all the GPU's limits, and the UID and
                # tenant checks read the other shares: one share at a time.
                async with self._gate(req.gpu_uuid).exclusive():
                    self._check_legacy(req)
                    info = await self._apply_alone(req, self._checked_info(req))
            else:
                # A share keeps the namespace it holds, or held until its release (its
                # delete was stopped or has run); a new one may take a spare.
                held = existing.namespace if existing is not None else released
                info = await self._apply_v3(req, self._checked_info(req, held), held is None)
            # Alone (the only call under way, as when the plugin's calls come one at a
            # time): written now. An ensure in a wave ends among the others' commands,
            # so it seldom is; releases, which run no command, never say so.
            await self._state.save(alone=self._calls.running == 1)
            if existing is None:
                log.info(
                    "share %s (claim %s) on GPU %s ensured: %s, %d%% threads",
                    req.share_id,
                    req.claim_uid,
                    req.gpu_uuid,
                    cmd.memory_limit_value(req.memory_limit_bytes),
                    req.active_thread_percentage,
                )
            return info

    def _checked_info(self, req: wire.EnsureShare, namespace: str | None = None) -> ShareInfo:
        try:
            return self._share_info(req, namespace)
        except (DaemonError, SocketPathTooLong) as err:
            raise AgentRequestError("daemon_failed", str(err)) from err

    def _others(self, gpu_uuid: str, share_id: str) -> list[ShareInfo]:
        return [s for s in self._gpu_shares(gpu_uuid) if s.share_id != share_id]

    def _check_legacy(self, req: wire.EnsureShare) -> None:
        others = self._others(req.gpu_uuid, req.share_id)
        if req.uid is not None:
            uids = sorted({s.uid for s in others if s.uid is not None and s.uid != req.uid})
            if uids:
                raise AgentRequestError(
                    "conflict",
                    f"legacy MPS serves one UID at a time: GPU {req.gpu_uuid} already "
                    f"serves UID {uids[0]}, this share asks for UID {req.uid}; run the "
                    "pods sharing a GPU as the same user, or use MPS v3 on a whole GPU (driver "
                    "615+; a MIG instance's daemon is always legacy)",
                )
        if req.tenant is not None and not req.cooperative:
            self._check_one_tenant(req, others)

    async def _apply_v3(
        self, req: wire.EnsureShare, info: ShareInfo, may_take_spare: bool
    ) -> ShareInfo:
        """The share's namespace commands against the running daemon, beside other
        shares' (a new share in a spare namespace when the daemon has one); when the
        daemon is down, start it first, alone."""
        gate = self._gate(req.gpu_uuid)
        wanted = cmd.Limits(req.memory_limit_bytes, req.active_thread_percentage)
        if may_take_spare:
            self._spare_limits[req.gpu_uuid] = wanted
        while True:
            async with gate.shared():
                daemon = self._running_daemon(req.gpu_uuid)
                if daemon is not None:
                    spare = daemon.shares.take_spare(wanted) if may_take_spare else None
                    if spare is not None:
                        info = dataclasses.replace(
                            info, namespace=spare, pipe_dir=daemon.shares.namespace_dir(spare)
                        )
                        self._want_spares(req.gpu_uuid)
                    try:
                        # v3 sends only this share's commands (the others are not read).
                        await daemon.apply(_limits(info), [_limits(info)])
                    except DaemonError as err:
                        raise AgentRequestError("daemon_failed", str(err)) from err
                    self._shares[(req.gpu_uuid, req.share_id)] = info
                    return info
            async with gate.exclusive():
                if self._running_daemon(req.gpu_uuid) is None:
                    return await self._apply_alone(req, info)
            # Started meanwhile (by another share's ensure): back beside the others.

    async def _apply_alone(self, req: wire.EnsureShare, info: ShareInfo) -> ShareInfo:
        """With the GPU's gate held exclusive: start the daemon if it is down (with
        the recorded shares restored), then apply this share."""
        others = self._others(req.gpu_uuid, req.share_id)
        daemon = self._daemon(req.gpu_uuid)
        started = False
        try:
            if not daemon.running:
                started = True  # also when start fails half-way: undo the compute mode
                await daemon.start()
                await daemon.restore([_limits(s) for s in others])
            await daemon.apply(_limits(info), [*map(_limits, others), _limits(info)])
        except DaemonError as err:
            if started and not others:
                await self._stop_daemon(req.gpu_uuid)
            raise AgentRequestError("daemon_failed", str(err)) from err
        self._watch(req.gpu_uuid)
        self._shares[(req.gpu_uuid, req.share_id)] = info
        if started:
            self._want_spares(req.gpu_uuid)
        return info

    @staticmethod
    def _check_one_tenant(req: wire.EnsureShare, others: list[ShareInfo]) -> None:
        """Refuse a share of ``req.tenant`` on a legacy daemon serving another namespace.

        Every client of a legacy daemon (a MIG instance's is always legacy) gets its
        ``control`` socket and ``/dev/shm``: it could stop the daemon, change or read
        the other clients' limits and work. Shares recorded without a tenant (by an
        older agent) are not counted: nothing says whose they are."""
        tenants = sorted({s.tenant for s in others if s.tenant not in (None, req.tenant)})
        if tenants:
            raise AgentRequestError(
                "conflict",
                f"the legacy MPS daemon of {req.gpu_uuid} serves claims of namespace "
                f"{tenants[0]}, and a legacy daemon cannot keep tenants apart (each client "
                "gets its control socket and /dev/shm); this share is of namespace "
                f"{req.tenant}. Give the namespaces separate GPUs, use MPS v3 on a whole GPU "
                "(driver 615+), or, where the tenants trust each other, set tenancy: "
                "cooperative in that GPU's node config",
            )

    async def release_share(self, req: wire.ReleaseShare) -> bool:
        """Drop the share (its namespace, or the daemon with the GPU's last share);
        answered once the state file no longer holds it. A v3 namespace of a GPU with
        other shares is deleted after the answer (:meth:`_delete_namespace`)."""
        with self._calls.call():
            return await self._release_share((req.gpu_uuid, req.share_id), req)

    async def _release_share(self, key: tuple[str, str], req: wire.ReleaseShare) -> bool:
        async with self._share_locks.hold(key):
            share = self._shares.get(key)
            if share is None:
                return False
            # Out of the status first: a daemon stopping after its last share is not a
            # daemon down (the plugin's health monitor would taint the GPU meanwhile).
            del self._shares[key]
            gate = self._gate(req.gpu_uuid)
            legacy = cmd.daemon_protocol(self.protocol, req.gpu_uuid) == "legacy"
            deferred = False
            try:
                if legacy or not self._gpu_shares(req.gpu_uuid):
                    async with gate.exclusive():
                        await self._remove_alone(share)
                elif self._running_daemon(req.gpu_uuid) is not None:
                    # The namespace goes after the answer. (A daemon that is down needs
                    # nothing: its restart restores only the shares still held.)
                    deferred = True
            except DaemonError as err:
                self._shares[key] = share
                # Another share's write may have dropped it from the file meanwhile.
                await self._save_logged(f"share {req.share_id} kept after its release failed")
                raise AgentRequestError("daemon_failed", str(err)) from err
            await self._state.save()
            if deferred:
                self._deleting[key] = asyncio.create_task(
                    self._delete_namespace(key, share), name=f"delete-{share.share_id}"
                )
                if share.namespace is not None:
                    self._released_namespaces[key] = share.namespace
            log.info("share %s on GPU %s released", req.share_id, req.gpu_uuid)
            return True

    async def _no_delete_pending(self, key: tuple[str, str]) -> str | None:
        """Before a share is ensured: the delete of its released namespace, if one is
        pending, ends first (a try in flight finishes; none is tried after it, since
        the share is wanted again: the ensure then finds the namespace and sets its
        limits, or creates it). Returns that namespace's name (None: none pending)."""
        pending = self._deleting.get(key)
        if pending is None:
            return None
        self._deleting.pop(key, None)
        namespace = self._released_namespaces.pop(key, None)
        if key in self._between_tries:
            pending.cancel()
        await asyncio.wait({pending})  # not cancelled with this ensure: it is no one's
        return namespace

    async def _delete_namespace(self, key: tuple[str, str], share: ShareInfo) -> None:
        """A released share's ``namespace delete``, after the answer; retried with
        backoff while its daemon runs and the share is not wanted again."""
        gpu_uuid = share.gpu_uuid
        backoff = DELETE_RETRY_FIRST_S
        try:
            self._between_tries.add(key)
            try:
                await self._calls.wait()
            finally:
                self._between_tries.discard(key)
            while self._deleting.get(key) is asyncio.current_task():
                try:
                    async with self._gate(gpu_uuid).shared():
                        daemon = self._running_daemon(gpu_uuid)
                        if daemon is None:  # gone with its daemon
                            return
                        await daemon.remove(_limits(share), [])
                    return
                except DaemonError as err:
                    self._delete_failures[gpu_uuid] = self._delete_failures.get(gpu_uuid, 0) + 1
                    again = self._deleting.get(key) is asyncio.current_task()
                    log.error(
                        "GPU %s: the namespace of released share %s (claim %s) was not "
                        "deleted (%s; it serves no one meanwhile): %s",
                        gpu_uuid,
                        share.share_id,
                        share.claim_uid,
                        f"retrying in {backoff:g}s" if again else "the share is wanted again",
                        err,
                    )
                    if not again:
                        return
                self._between_tries.add(key)
                try:
                    await asyncio.sleep(backoff)
                finally:
                    self._between_tries.discard(key)
                backoff = min(backoff * 2, DELETE_RETRY_MAX_S)
        finally:
            if self._deleting.get(key) is asyncio.current_task():
                del self._deleting[key]
                self._released_namespaces.pop(key, None)

    def _want_spares(self, gpu_uuid: str) -> None:
        """Make the GPU's daemon's spare namespaces up to ``spare_namespaces`` (v3),
        unless that is under way."""
        if self.config.spare_namespaces <= 0:
            return
        if cmd.daemon_protocol(self.protocol, gpu_uuid) != "v3":
            return
        refill = self._refills.get(gpu_uuid)
        if refill is None or refill.done():
            self._refills[gpu_uuid] = asyncio.create_task(
                self._refill_spares(gpu_uuid), name=f"spares-{gpu_uuid}"
            )

    async def _refill_spares(self, gpu_uuid: str) -> None:
        """One spare namespace at a time, each when the calls pause (a ``namespace
        create`` takes a core from the calls still waiting, like a delete), until the
        daemon has ``spare_namespaces`` or is not running. A refused create is logged,
        counted and tried again with backoff; meanwhile shares are created by their
        ensure, as with no spares. A spare is set to the limits of the GPU's last new
        share; one whose limits the daemon refused stays, bare, and counts as a
        failure."""
        backoff = SPARE_RETRY_FIRST_S
        while True:
            await self._calls.wait()
            async with self._gate(gpu_uuid).shared():
                daemon = self._running_daemon(gpu_uuid)
                if daemon is None or daemon.shares.spare_count >= self.config.spare_namespaces:
                    return
                try:
                    if not await daemon.shares.add_spare(self._spare_limits.get(gpu_uuid)):
                        return  # no server yet: the next share's ensure asks again
                except DaemonError as err:
                    failed = True
                    self._spare_failures[gpu_uuid] = self._spare_failures.get(gpu_uuid, 0) + 1
                    log.error(
                        "GPU %s: a spare MPS namespace was not made, or its limits not set "
                        "ahead (retrying in %gs; new shares create or set their own "
                        "meanwhile): %s",
                        gpu_uuid,
                        backoff,
                        err,
                    )
                else:
                    failed = False
            if failed:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, SPARE_RETRY_MAX_S)
            else:
                backoff = SPARE_RETRY_FIRST_S

    async def _remove_alone(self, share: ShareInfo) -> None:
        """With the GPU's gate held exclusive: the last share stops the daemon (counted
        now: a share ensured meanwhile keeps it up), any other is removed from it."""
        remaining = self._gpu_shares(share.gpu_uuid)
        if not remaining:
            await self._stop_daemon(share.gpu_uuid)
            return
        daemon = self._running_daemon(share.gpu_uuid)
        if daemon is not None:
            await daemon.remove(_limits(share), [_limits(s) for s in remaining])

    async def _save_logged(self, why: str) -> None:
        try:
            await self._state.save()
        except OSError as err:
            log.error("cannot write the MPS agent state %s (%s): %s", self.state_path, why, err)

    def list_shares(self) -> list[ShareInfo]:
        return [s for _, s in sorted(self._shares.items())]

    def status(self) -> wire.AgentStatus:
        gpus = sorted(
            {gpu for gpu, _ in self._shares} | set(self._daemons) | {g for g, _ in self._deleting}
        )
        daemons = []
        for gpu in gpus:
            daemon = self._daemons.get(gpu)
            waits = daemon.uid_wait if daemon is not None else None
            daemons.append(
                wire.DaemonStatus(
                    gpu_uuid=gpu,
                    pid=daemon.pid if daemon is not None and daemon.running else None,
                    running=daemon is not None and daemon.running,
                    restarts=self._restarts.get(gpu, 0),
                    shares=len(self._gpu_shares(gpu)),
                    server_uid=waits.server_uid if waits is not None else None,
                    waiting_uids=waits.waiting_uids if waits is not None else (),
                    namespaces_deleting=sum(1 for g, _ in self._deleting if g == gpu),
                    namespace_delete_failures=self._delete_failures.get(gpu, 0),
                    spare_namespaces=(
                        daemon.shares.spare_count if daemon is not None and daemon.running else 0
                    ),
                    spare_namespace_failures=self._spare_failures.get(gpu, 0),
                )
            )
        return wire.AgentStatus(wire.PROTOCOL_VERSION, self.protocol, tuple(daemons))

    # -- the socket -----------------------------------------------------------------

    async def serve(self) -> None:
        """Bind the socket (refusing if another agent answers on it)."""
        await self._server.serve()
        log.info(
            "mps-agent serving %s (MPS %s; a MIG instance's daemon: legacy)",
            self.config.socket_path,
            self.protocol,
        )
