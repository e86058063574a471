"""Wiring of the kubelet plugin: backend → inventory → engine → gRPC servers.

:class:`PluginRuntime` is used by ``dra-driver kubelet-plugin`` (with the real
Kubernetes claim source) and in-process by the demo and the tests (with an
in-memory one); :func:`run_until_signalled` is the daemon's main loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from dra_driver.base.errors import ConfigError, DriverError
from dra_driver.base.ids import ClaimRef, ClaimUID, PoolName
from dra_driver.core.cdi import (
    DEFAULT_HOOK_PATH,
    ContainerEdits,
    cdi_kind_for_driver,
    edits_from_driver_files,
    edits_from_toolkit_spec,
    fake_common_edits,
)
from dra_driver.core.health import HealthSettings, unhealthy_taint_key
from dra_driver.core.model import Inventory
from dra_driver.core.ports import ClaimSource, GpuBackend
from dra_driver.core.prepare import NodeContext
from dra_driver.core.settings import NodeSettings
from dra_driver.dmemhook import DEFAULT_HOOK_DIR
from dra_driver.gpu.dmem import DEFAULT_CGROUP_ROOT
from dra_driver.gpu.driver_files import discover_driver_files, load_toolkit_spec
from dra_driver.gpu.mig_caps import MigCapabilities
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.sockets import SocketPaths, socket_paths
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.observability.plugin_metrics import PluginMetrics
from dra_driver.observability.plugin_observers import plugin_observers
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.claim_reporting import ClaimReporter
from dra_driver.plugin.disruption_guard import DisruptionGuard
from dra_driver.plugin.driver import Driver, ReconcileReport
from dra_driver.plugin.enforcement import DmemLimits, Enforcer, dmem_hook_settings
from dra_driver.plugin.health_monitor import HealthListener, HealthMonitor
from dra_driver.plugin.mps_watch import MpsUidWatch
from dra_driver.plugin.publishing import ProbeFn, SlicePublishing
from dra_driver.plugin.readiness import Readiness, ReadinessServer, check_readiness
from dra_driver.state.checkpoint import CheckpointStore, ClaimState, read_boot_id
from dra_driver.state.locks import NodeLock

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
LOCK_FILE = "serialize.lock"
MPS_STATUS_TIMEOUT_S = 10.0
"""How long the health monitor waits for the mps-agent's status."""


@dataclass(frozen=True)
class PluginConfig:
    driver_name: str
    node_name: str
    registry_dir: str
    plugin_dir: str
    cdi_root: str
    rolling_update_uid: str | None = None
    boot_id_file: str = "/proc/sys/kernel/random/boot_id"
    inventory_interval: float = 60.0
    """Seconds between re-discoveries of the GPUs (MIG mode changes after a
    reset, a GPU gone); 0 turns it off."""
    settings: NodeSettings = field(default_factory=NodeSettings)
    """Sharing and allocator per GPU, memory reserve and steps (node settings)."""
    driver_root: str = "/"
    """Where the NVIDIA driver is installed, as the plugin sees it (NVML backend)."""
    proc_root: str = "/proc"
    """The host's /proc (MIG capability files)."""
    cdi_hook_path: str | None = DEFAULT_HOOK_PATH
    """The toolkit's CDI hook on the host, for the ldcache update; None: no hook."""
    mps_agent_socket: str | None = None
    """The mps-agent's socket; None: MPS shares fail with a message naming it (and the
    health monitor does not watch MPS daemons)."""
    health: HealthSettings = field(default_factory=HealthSettings)
    """Device health: recovery time, taint effect of fatal problems, ignored XIDs."""
    health_probe_interval: float = 30.0
    """Seconds between GPU liveness probes (and health reports); 0 turns the probe off."""
    dmem_limits: DmemLimits = DmemLimits.AUTO
    """Kernel-enforced GPU-memory limits for MPS shares (cgroup v2 dmem hook)."""
    hook_dir: str = DEFAULT_HOOK_DIR
    """Host directory the dmem hook script is installed into (hostPath, same path)."""
    cgroup_root: str = DEFAULT_CGROUP_ROOT
    """The host's cgroup v2 root as the plugin sees it (dmem detection)."""
    readiness_port: int | None = None
    """Serve ``/readyz`` on this port (plugin/readiness.py); None: not served, 0: any
    free port (tests)."""
    readiness_address: str = "0.0.0.0"

    def validate(self) -> None:
        if not self.node_name:
            raise ConfigError("--node-name (NODE_NAME) is required: the node this plugin serves")
        if not self.driver_name:
            raise ConfigError("--driver-name (DRIVER_NAME) must not be empty")
        cdi_kind_for_driver(self.driver_name)
        unhealthy_taint_key(self.driver_name)
        self.health.validate()
        if self.health_probe_interval < 0:
            raise ConfigError(
                f"--health-probe-interval must be 0 (off) or more seconds, not "
                f"{self.health_probe_interval}"
            )


@dataclass(frozen=True)
class SliceOptions:
    """How to publish the node's ResourceSlices (absent: not published, e.g. the demo)."""

    publisher: SlicePublisher
    probe: ProbeFn


class PluginRuntime:
    def __init__(
        self,
        config: PluginConfig,
        backend: GpuBackend,
        claims: ClaimSource,
        slices: SliceOptions | None = None,
        *,
        reporting: ClaimReporter | None = None,
        metrics: PluginMetrics | None = None,
        disruption_guard: DisruptionGuard | None = None,
        activity: CallActivity | None = None,
    ) -> None:
        """``reporting``: claim status and Events (None: neither is written, e.g. the
        demo); ``metrics``: the Prometheus registry to keep up to date (None: no
        metrics served); ``disruption_guard``: annotates the pods of guarded claims
        (None: off); ``activity``: the kubelet's calls in flight, shared with
        ``reporting`` so that its writes wait for a lull (None: the driver's own)."""
        config.validate()
        self.config = config
        self.reporting = reporting
        self.activity = activity if activity is not None else CallActivity()
        self.disruption_guard = disruption_guard
        self.metrics = metrics
        self.backend = backend
        self.claims = claims
        self.slice_options = slices
        self.publishing: SlicePublishing | None = None
        self.health_monitor: HealthMonitor | None = None
        self.health_listeners: list[HealthListener] = []
        """Told of every device-health change (Events, claim status, metrics); add
        yours before or after :meth:`start`."""
        self.inventory: Inventory | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.sockets: SocketPaths = socket_paths(
            config.driver_name, config.registry_dir, config.plugin_dir, config.rolling_update_uid
        )
        self.driver: Driver | None = None
        self.server: PluginServer | None = None
        self.reconcile_report: ReconcileReport | None = None
        self.readiness_server: ReadinessServer | None = None
        self._started = False

    def readiness(self) -> Readiness:
        """Registered with the kubelet and, when it publishes, the last publish succeeded."""
        server, publishing = self.server, self.publishing
        registration = server.registration if server is not None else None
        last = publishing.last_result if publishing is not None else None
        return check_readiness(
            started=self._started and registration is not None,
            registered=registration is not None and registration.registered,
            registration_error=registration.error if registration is not None else None,
            publishes=self.slice_options is not None,
            published_generation=last.generation if last is not None else None,
            publish_failing=publishing.failing if publishing is not None else None,
        )

    async def start(self) -> None:
        cfg = self.config
        if cfg.readiness_port is not None:
            # First, so the probe hears "starting" rather than nothing.
            self.readiness_server = ReadinessServer(self.readiness)
            await self.readiness_server.start(cfg.readiness_port, cfg.readiness_address)
        os.makedirs(cfg.plugin_dir, exist_ok=True)
        inventory = self.inventory = await self.backend.inventory()
        backend = self.backend
        ctx = NodeContext(
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            pool_name=PoolName(cfg.node_name),
            cdi_kind=cdi_kind_for_driver(cfg.driver_name),
            settings=cfg.settings,
            common_edits=await asyncio.to_thread(self._common_edits, backend.has_driver_files),
            fake_device_nodes=not backend.has_device_nodes,
            dmem=await dmem_hook_settings(
                inventory.gpus,
                cgroup_root=cfg.cgroup_root,
                hook_dir=cfg.hook_dir,
                mode=cfg.dmem_limits,
            )
            if backend.supports_dmem
            else None,
        )
        enforcer = Enforcer(
            backend=self.backend,
            inventory=self._current_inventory,
            mig_caps=MigCapabilities(cfg.proc_root) if backend.reads_mig_capabilities else None,
            mps=MpsAgentClient(cfg.mps_agent_socket) if cfg.mps_agent_socket else None,
        )
        self.driver = Driver(
            ctx=ctx,
            inventory=inventory,
            claims=self.claims,
            checkpoints=CheckpointStore(
                os.path.join(cfg.plugin_dir, CHECKPOINT_FILE), read_boot_id(cfg.boot_id_file)
            ),
            cdi=CdiStore(cfg.cdi_root, ctx.cdi_kind),
            lock=NodeLock(os.path.join(cfg.plugin_dir, LOCK_FILE)),
            enforcer=enforcer,
            activity=self.activity,
        )
        self.reconcile_report = await self.driver.reconcile()
        health = self.health_monitor = HealthMonitor(
            self.backend,
            inventory,
            driver_name=cfg.driver_name,
            pool_name=ctx.pool_name,
            settings=cfg.health,
            probe_interval=cfg.health_probe_interval,
            mps=(
                MpsAgentClient(cfg.mps_agent_socket, timeout=MPS_STATUS_TIMEOUT_S)
                if cfg.mps_agent_socket
                else None
            ),
            listeners=self.health_listeners,
        )
        await self._attach_observers(health)
        self.server = PluginServer(cfg.driver_name, self.sockets, self.driver, health.hub)
        if self.slice_options is not None:
            self.publishing = SlicePublishing(
                self.slice_options.publisher,
                self.slice_options.probe,
                inventory=inventory,
                settings=cfg.settings,
                driver_name=cfg.driver_name,
                node_name=cfg.node_name,
                hidden_mig_devices=self._created_mig_devices,
                taints=health.taints,
            )
            health.republish = self.publishing.request_publish
            self.server.registration.on_registered.append(self.publishing.on_registered)
            self._spawn(self.publishing.run(), "slice-publisher")
        self._spawn(health.run(), "device-health")
        if cfg.inventory_interval > 0:
            self._spawn(self._watch_inventory(cfg.inventory_interval), "inventory-watch")
        await self.server.start()
        self._started = True
        log.info(
            "kubelet plugin for %s on node %s serving %d GPU(s) from the %s backend",
            cfg.driver_name,
            cfg.node_name,
            len(inventory.gpus),
            self.backend.name,
        )

    async def _attach_observers(self, health: HealthMonitor) -> None:
        """Claim log, metrics, claim status and Events: told of every claim and every
        device-health change from before the sockets open."""
        assert self.driver is not None
        self.driver.observers.extend(plugin_observers(self.driver, self.metrics))
        if self.metrics is not None:
            health.listeners.append(self.metrics.follow_health(health))
        if self.reporting is not None:
            self.driver.observers.append(self.reporting)
            health.listeners.append(self.reporting.devices_health_changed)
            # The monitor tells listeners of changes only: give the reporter every
            # device's state now (healthy unless a fault says otherwise), or claims
            # on a device that never changed would show DeviceHealthy Unknown.
            self.reporting.devices_health_changed(health.devices())
            if self.config.mps_agent_socket:
                # Legacy MPS clients waiting on another UID's server: Events (not health).
                uid_watch = MpsUidWatch(
                    MpsAgentClient(self.config.mps_agent_socket, timeout=MPS_STATUS_TIMEOUT_S),
                    [self.reporting],
                )
                health.mps_listeners.append(uid_watch.update)
            checkpoint = await asyncio.to_thread(self.driver.checkpoints.load)
            self.reporting.remember(
                c for c in checkpoint.claims.values() if c.state is ClaimState.PREPARE_COMPLETED
            )
        guard = self.disruption_guard
        if guard is not None:
            self.driver.observers.append(guard)
            guard.prepared = self._prepared_claims
            if self.metrics is not None:
                guard.on_count = self.metrics.set_guarded_pods
            self._spawn(guard.run(), "disruption-guard")

    def _prepared_claims(self) -> dict[ClaimUID, ClaimRef]:
        """The claims the checkpoint holds as prepared (blocks: reads the file)."""
        assert self.driver is not None
        claims = self.driver.checkpoints.load().claims.values()
        return {c.ref.uid: c.ref for c in claims if c.state is ClaimState.PREPARE_COMPLETED}

    async def _created_mig_devices(self) -> set[str]:
        """MIG instances we created for claims, or are creating right now.

        Created ones are in the checkpoint with their UUID. One being created is
        recorded (PrepareStarted) only as its profile and placement until the
        claim completes, while a re-discovery may already list it: it is found
        in the inventory by that placement, so the pool never shows it as a
        pre-existing instance, not even for one publish.
        """
        assert self.driver is not None
        checkpoint = await asyncio.to_thread(self.driver.checkpoints.load)
        hidden: set[str] = set()
        pending: set[tuple[str, int, int]] = set()
        for claim in checkpoint.claims.values():
            for d in claim.devices:
                if d.mig is None:
                    continue
                if d.mig.created and d.mig.mig_uuid:
                    hidden.add(d.mig.mig_uuid)
                elif d.mig.mig_uuid is None and claim.state is ClaimState.PREPARE_STARTED:
                    pending.add((d.gpu_uuid, d.mig.profile_id, d.mig.placement_start))
        if pending and self.inventory is not None:
            hidden.update(
                m.uuid
                for gpu in self.inventory.gpus
                for m in gpu.mig_devices
                if (gpu.uuid, m.profile_id, m.placement.start) in pending
            )
        return hidden

    def _current_inventory(self) -> Inventory:
        assert self.inventory is not None
        return self.inventory

    def _common_edits(self, has_driver_files: bool) -> ContainerEdits:
        """What every GPU container needs besides its GPU: libraries, control nodes, hooks.

        A backend without driver files (fake): stand-in control nodes. Otherwise
        the NVIDIA Container Toolkit's CDI spec when the node has one (its common
        edits), else our own discovery under ``--driver-root``.
        """
        if not has_driver_files:
            return fake_common_edits()
        doc = load_toolkit_spec()
        if doc is not None:
            log.info("using the NVIDIA Container Toolkit's CDI spec for the driver files")
            return edits_from_toolkit_spec(doc).common
        files = discover_driver_files(self.config.driver_root)
        for note in files.notes:
            log.info("driver discovery: %s", note)
        return edits_from_driver_files(files, hook_path=self.config.cdi_hook_path)

    def _spawn(self, work: Coroutine[Any, Any, object], name: str) -> None:
        """Run ``work`` for the plugin's lifetime; an unexpected end is logged loudly."""

        async def guarded() -> None:
            try:
                await work
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background task %s failed", name)
                raise
            log.error("background task %s ended; it should run until shutdown", name)

        self._tasks.append(asyncio.create_task(guarded(), name=name))

    async def _watch_inventory(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                inventory = await self.backend.inventory()
            except DriverError as err:
                log.warning("GPU re-discovery failed; keeping the last inventory: %s", err)
                continue
            if inventory != self.inventory:
                await self._inventory_changed(inventory)

    async def _inventory_changed(self, inventory: Inventory) -> None:
        log.info("the GPU inventory changed; updating the plugin and republishing")
        self.inventory = inventory
        assert self.driver is not None and self.health_monitor is not None
        self.driver.inventory = inventory
        if self.publishing is not None:
            self.publishing.inventory = inventory
        # The health model follows the devices (and the kubelet hears the new list)
        # before the slices are rebuilt, so they carry the right taints.
        await self.health_monitor.set_inventory(inventory)
        if self.publishing is not None:
            self.publishing.request_publish()

    async def stop(self) -> None:
        self._started = False
        if self.readiness_server is not None:
            await self.readiness_server.close()
            self.readiness_server = None
        # Background tasks first. The publisher is cancelled, never told to
        # unpublish: see plugin/publishing.py.
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.driver is not None:
            await self.driver.close()
            self.driver.lock.close()
            self.driver = None
        if self.disruption_guard is not None:
            await self.disruption_guard.close()
        if self.reporting is not None:
            await self.reporting.close()  # the last status writes and Events
        await self.backend.close()


async def run_until_signalled(runtime: PluginRuntime) -> None:
    """Serve until SIGTERM or SIGINT, then shut down and remove the sockets."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await runtime.start()
    try:
        await stop.wait()
        log.info("signal received; shutting down")
    finally:
        await runtime.stop()
