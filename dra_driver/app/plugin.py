"""The kubelet plugin's object graph: backend → inventory → engine → gRPC servers.

:class:`PluginRuntime` builds it by constructor injection (each object is given
its collaborators: the engine its observers, the health monitor its listeners,
the gRPC server its registration callbacks) and runs its background tasks in
one :class:`asyncio.TaskGroup`: they must live as long as the plugin, so one
that fails or returns stops them all and the plugin with them
(:class:`BackgroundTaskFailed`), rather than leaving a live plugin with, say,
stale ResourceSlices.

It is used by ``dra-driver kubelet-plugin`` (:func:`run_plugin`, with the real
Kubernetes claim source) and in-process by the demo and the tests (with an
in-memory one); :func:`run_until_signalled` is the daemon's main loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dra_driver.app.heap import settle_heap
from dra_driver.app.tasks import BackgroundTaskFailed, Work, first_of, supervise
from dra_driver.base.errors import DriverError
from dra_driver.base.ids import ClaimRef, ClaimUID, PoolName
from dra_driver.core.cdi import (
    ContainerEdits,
    cdi_kind_for_driver,
    edits_from_driver_files,
    edits_from_toolkit_spec,
    fake_common_edits,
)
from dra_driver.core.model import Inventory
from dra_driver.core.ports import ClaimSource, GpuBackend
from dra_driver.core.prepare import DriverObserver, GuardMode, NodeContext, mig_of
from dra_driver.gpu.driver_files import discover_driver_files, load_toolkit_spec
from dra_driver.gpu.mig_caps import MigCapabilities
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.claim_status import ClaimStatusWriter
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.client import make_api_client
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.nodes import read_node
from dra_driver.k8s.pods import PodApi
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.sockets import SocketPaths, socket_paths
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.observability.metrics_server import MetricsServer, serve_metrics
from dra_driver.observability.plugin_metrics import PluginMetrics
from dra_driver.observability.plugin_observers import plugin_observers
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.claim_reporting import COMPONENT, ClaimReporter
from dra_driver.plugin.config import (
    CHECKPOINT_FILE,
    LOCK_FILE,
    MPS_STATUS_TIMEOUT_S,
    PluginConfig,
    SliceOptions,
)
from dra_driver.plugin.current_inventory import CurrentInventory
from dra_driver.plugin.disruption_guard import DisruptionGuard, PreparedClaims
from dra_driver.plugin.driver import Driver, ReconcileReport
from dra_driver.plugin.enforcement import Enforcer, dmem_hook_settings
from dra_driver.plugin.extended_resources import check_extended_resources
from dra_driver.plugin.health_monitor import HealthListener, HealthMonitor
from dra_driver.plugin.mps_watch import MpsUidWatch
from dra_driver.plugin.publishing import SlicePublishing
from dra_driver.plugin.readiness import Readiness, ReadinessServer, check_readiness
from dra_driver.state.checkpoint import CheckpointStore, ClaimState, read_boot_id
from dra_driver.state.locks import NodeLock

__all__ = [
    "BackgroundTaskFailed",
    "ClusterOptions",
    "PluginConfig",
    "PluginRuntime",
    "SliceOptions",
    "claim_reporter",
    "make_disruption_guard",
    "run_plugin",
    "run_until_signalled",
    "run_with_startup_checks",
]

log = logging.getLogger(__name__)

MPS_KEPT_CONNECTIONS = 16
"""Connections to the mps-agent kept open between requests (a wave's shares)."""


GuardMaker = Callable[[PreparedClaims, Callable[[int], None] | None], DisruptionGuard]
"""(the claims prepared now, told the guarded pods' count or None) → the disruption
guard: the runtime makes it with its checkpoint and its metrics."""


@dataclass(frozen=True)
class _EngineState:
    """What the metrics read of the engine (the checkpoint, the current GPUs), ready
    before the engine is, so that the metrics are given to it as an observer."""

    checkpoints: CheckpointStore
    current: Callable[[], Inventory]

    @property
    def inventory(self) -> Inventory:
        return self.current()


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
        disruption_guard: GuardMaker | None = None,
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
        self.metrics = metrics
        self.disruption_guard = (
            disruption_guard(
                self._prepared_claims, metrics.set_guarded_pods if metrics is not None else None
            )
            if disruption_guard is not None
            else None
        )
        self.backend = backend
        self.claims = claims
        self.slice_options = slices
        self.publishing: SlicePublishing | None = None
        self.health_monitor: HealthMonitor | None = None
        self.health_listeners: list[HealthListener] = []
        """Told of every device-health change (Events, claim status, metrics); add
        yours before :meth:`start`."""
        self._inventory: CurrentInventory | None = None
        self.sockets: SocketPaths = socket_paths(
            config.driver_name, config.registry_dir, config.plugin_dir, config.rolling_update_uid
        )
        self.driver: Driver | None = None
        self._mps_client: MpsAgentClient | None = None
        self.server: PluginServer | None = None
        self.reconcile_report: ReconcileReport | None = None
        self.readiness_server: ReadinessServer | None = None
        self.failure: BackgroundTaskFailed | None = None
        """Why the background tasks stopped (one failed or ended); None while they run."""
        self.failed = asyncio.Event()
        """Set when :attr:`failure` is."""
        self._background: asyncio.Task[None] | None = None
        self._started = False

    @property
    def inventory(self) -> Inventory | None:
        """The node's GPUs as last discovered (None before :meth:`start`)."""
        return self._inventory.get() if self._inventory is not None else None

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
        current = self._inventory = CurrentInventory(await self.backend.inventory())
        inventory = current.get()
        ctx = await self._node_context(inventory)
        checkpoints = CheckpointStore(
            os.path.join(cfg.plugin_dir, CHECKPOINT_FILE), read_boot_id(cfg.boot_id_file)
        )
        if cfg.mps_agent_socket:
            # Kept connections: the prepare path sends a wave's shares at once.
            self._mps_client = MpsAgentClient(
                cfg.mps_agent_socket, keep_connections=MPS_KEPT_CONNECTIONS
            )
        driver = self.driver = Driver(
            ctx=ctx,
            inventory=current,
            claims=self.claims,
            checkpoints=checkpoints,
            cdi=CdiStore(cfg.cdi_root, ctx.cdi_kind),
            lock=NodeLock(os.path.join(cfg.plugin_dir, LOCK_FILE)),
            enforcer=Enforcer(
                backend=self.backend,
                inventory=current.get,
                mig_caps=(
                    MigCapabilities(cfg.proc_root) if self.backend.reads_mig_capabilities else None
                ),
                mps=self._mps_client,
            ),
            observers=self._observers(_EngineState(checkpoints, current.get)),
            activity=self.activity,
        )
        self.reconcile_report = await driver.reconcile()
        health = self.health_monitor = self._health_monitor(inventory, ctx.pool_name)
        await self._report_current_claims(health)
        work: dict[str, Work] = {}
        if self.disruption_guard is not None:
            work["disruption-guard"] = self.disruption_guard.run
        on_registered: list[Callable[[], None]] = []
        if self.slice_options is not None:
            self.publishing = SlicePublishing(
                self.slice_options.publisher,
                self.slice_options.probe,
                inventory=current,
                settings=cfg.settings,
                driver_name=cfg.driver_name,
                node_name=cfg.node_name,
                hidden_mig_devices=self._created_mig_devices,
                taints=health.taints,
            )
            on_registered.append(self.publishing.on_registered)
            work["slice-publisher"] = self.publishing.run
        self.server = PluginServer(
            cfg.driver_name, self.sockets, driver, health.hub, on_registered=on_registered
        )
        work["device-health"] = health.run
        if cfg.inventory_interval > 0:
            interval = cfg.inventory_interval
            work["inventory-watch"] = lambda: self._watch_inventory(interval)
        self._background = asyncio.create_task(self._run_background(work), name="plugin-tasks")
        await self.server.start()
        self._started = self.failure is None
        log.info(
            "kubelet plugin for %s on node %s serving %d GPU(s) from the %s backend",
            cfg.driver_name,
            cfg.node_name,
            len(inventory.gpus),
            self.backend.name,
        )

    async def _node_context(self, inventory: Inventory) -> NodeContext:
        cfg, backend = self.config, self.backend
        return NodeContext(
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

    def _observers(self, state: _EngineState) -> list[DriverObserver]:
        """Claim log, metrics, claim status and Events, the disruption guard: told of
        every claim from before the sockets open."""
        observers = plugin_observers(state, self.metrics)
        if self.reporting is not None:
            observers.append(self.reporting)
        if self.disruption_guard is not None:
            observers.append(self.disruption_guard)
        return observers

    def _health_monitor(self, inventory: Inventory, pool_name: str) -> HealthMonitor:
        """The device-health monitor and who it tells: metrics, claim status and Events
        (device health), the legacy MPS UID watch (MPS status), slice publishing (taints)."""
        cfg, metrics, reporting = self.config, self.metrics, self.reporting
        # Called only once the monitor exists: its listeners want every device.
        listeners = self.health_listeners
        if metrics is not None:
            listeners.append(lambda _changed: metrics.set_device_health(monitor.devices()))
        if reporting is not None:
            listeners.append(reporting.devices_health_changed)
        mps_listeners = []
        if reporting is not None and cfg.mps_agent_socket:
            # Legacy MPS clients waiting on another UID's server: Events (not health).
            uid_watch = MpsUidWatch(
                MpsAgentClient(cfg.mps_agent_socket, timeout=MPS_STATUS_TIMEOUT_S), [reporting]
            )
            mps_listeners.append(uid_watch.update)
        monitor = HealthMonitor(
            self.backend,
            inventory,
            driver_name=cfg.driver_name,
            pool_name=pool_name,
            settings=cfg.health,
            probe_interval=cfg.health_probe_interval,
            mps=(
                MpsAgentClient(cfg.mps_agent_socket, timeout=MPS_STATUS_TIMEOUT_S)
                if cfg.mps_agent_socket
                else None
            ),
            listeners=listeners,
            mps_listeners=mps_listeners,
            republish=self._request_publish if self.slice_options is not None else None,
        )
        if metrics is not None:
            metrics.set_device_health(monitor.devices())
        return monitor

    async def _report_current_claims(self, health: HealthMonitor) -> None:
        """The monitor tells listeners of changes only: give the reporter every
        device's state now (healthy unless a fault says otherwise), or claims on a
        device that never changed would show DeviceHealthy Unknown; and the claims
        the checkpoint holds as prepared."""
        if self.reporting is None:
            return
        assert self.driver is not None
        self.reporting.devices_health_changed(health.devices())
        checkpoint = await asyncio.to_thread(self.driver.checkpoints.load)
        self.reporting.remember(
            c for c in checkpoint.claims.values() if c.state is ClaimState.PREPARE_COMPLETED
        )

    def _request_publish(self) -> None:
        if self.publishing is not None:
            self.publishing.request_publish()

    async def _run_background(self, work: dict[str, Work]) -> None:
        """Every task in one group: the first to fail or end cancels the others, and
        :attr:`failed` tells :func:`run_until_signalled` to stop the plugin."""
        await supervise(work, component="plugin", on_failure=self._background_failed)

    def _background_failed(self, failure: BackgroundTaskFailed) -> None:
        self.failure = failure
        self._started = False
        self.failed.set()

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
                if (mig := mig_of(d)) is None:
                    continue
                if mig.created and mig.mig_uuid:
                    hidden.add(mig.mig_uuid)
                elif mig.mig_uuid is None and claim.state is ClaimState.PREPARE_STARTED:
                    pending.add((d.gpu_uuid, mig.profile_id, mig.placement_start))
        if pending and self.inventory is not None:
            hidden.update(
                m.uuid
                for gpu in self.inventory.gpus
                for m in gpu.mig_devices
                if (gpu.uuid, m.profile_id, m.placement.start) in pending
            )
        return hidden

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
        assert self._inventory is not None and self.health_monitor is not None
        self._inventory.set(inventory)  # the engine's and slice publishing's too
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
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._background
            self._background = None
        if self.server is not None:
            await self.server.stop()
            self.server = None
        if self.driver is not None:
            await self.driver.close()
            self.driver.lock.close()
            self.driver = None
        if self._mps_client is not None:
            await self._mps_client.close()
            self._mps_client = None
        if self.disruption_guard is not None:
            await self.disruption_guard.close()
        if self.reporting is not None:
            await self.reporting.close()  # the last status writes and Events
        await self.backend.close()


async def run_until_signalled(runtime: PluginRuntime, *, settle: bool = False) -> None:
    """Serve until SIGTERM or SIGINT, then shut down and remove the sockets.

    Raises :class:`BackgroundTaskFailed` (after shutting down) when a background
    task failed or ended: the daemon then exits with an error, to be restarted.
    ``settle``: once started, freeze the heap (:func:`~dra_driver.app.heap.settle_heap`;
    the daemon's process, not a test's).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await runtime.start()
    if settle:
        settle_heap()
    try:
        await first_of(stop.wait(), runtime.failed.wait())
        if runtime.failure is None:
            log.info("signal received; shutting down")
    finally:
        await runtime.stop()
    if runtime.failure is not None:
        raise runtime.failure


@dataclass(frozen=True)
class ClusterOptions:
    """How ``dra-driver kubelet-plugin`` reaches the cluster and serves metrics."""

    kubeconfig: str | None = None
    """None or empty: the in-cluster config."""
    metrics_port: int = 0
    """0: no metrics served."""
    metrics_address: str = "0.0.0.0"
    extended_resource_names: tuple[str, ...] = ()
    """The start-up check warns if this node's device plugin advertises one."""


ReporterFactory = Callable[[Any, str, str, CallActivity], ClaimReporter]
"""(API client, driver name, node name, calls in flight) → claim status and Events."""
GuardFactory = Callable[[Any, str, str, ClaimReporter], GuardMaker | None]
"""(API client, driver name, node name, reporter) → what makes the disruption guard,
or None (off)."""


def run_plugin(
    config: PluginConfig,
    backend: GpuBackend,
    options: ClusterOptions,
    *,
    reporting: ReporterFactory,
    disruption_guard: GuardFactory,
) -> None:
    """``dra-driver kubelet-plugin``: build the plugin against the API server and serve
    until a signal (raises :class:`BackgroundTaskFailed` when a background task dies)."""

    metrics = PluginMetrics() if options.metrics_port else None
    api_client = make_api_client(options.kubeconfig)
    claims = KubernetesClaimSource(api_client)
    publisher = SlicePublisher(
        api_client, driver_name=config.driver_name, node_name=config.node_name
    )
    slices = SliceOptions(
        publisher=publisher,
        probe=functools.partial(
            probe_capabilities, api_client, config.driver_name, config.node_name
        ),
    )
    server: MetricsServer | None = None
    try:
        if metrics is not None:
            server = serve_metrics(options.metrics_port, metrics.registry, options.metrics_address)
        activity = CallActivity()
        reporter = reporting(api_client, config.driver_name, config.node_name, activity)
        runtime = PluginRuntime(
            config,
            backend,
            claims,
            slices,
            reporting=reporter,
            activity=activity,
            metrics=metrics,
            disruption_guard=disruption_guard(
                api_client, config.driver_name, config.node_name, reporter
            ),
        )
        check = functools.partial(
            check_extended_resources,
            functools.partial(read_node, api_client, config.node_name),
            node_name=config.node_name,
            names=options.extended_resource_names,
            events=reporter.events,
        )
        asyncio.run(run_with_startup_checks(runtime, check))
    finally:
        if server is not None:
            server.stop()
        claims.close()
        publisher.close()


async def run_with_startup_checks(
    runtime: PluginRuntime, check: Callable[[], Coroutine[Any, Any, object]]
) -> None:
    """The plugin until a signal, with the start-up checks beside it (they only warn,
    so a slow API server never delays serving the kubelet)."""
    task = asyncio.create_task(check(), name="extended-resources-check")
    try:
        await run_until_signalled(runtime, settle=True)
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def claim_reporter(
    api_client: Any,
    driver_name: str,
    node_name: str,
    *,
    event_interval_s: float,
    claim_status: bool,
    activity: CallActivity | None = None,
) -> ClaimReporter:
    """The plugin's claim status writer (``claim_status`` False: none) and Event
    recorder; ``activity``: the plugin's calls in flight (status writes wait for a lull)."""

    events = EventRecorder(
        api_client,
        component=COMPONENT,
        instance=node_name,
        interval_s=event_interval_s,
        aggregate=True,
    )
    status = (
        ClaimStatusWriter(api_client, driver_name=driver_name, node_name=node_name)
        if claim_status
        else None
    )
    return ClaimReporter(
        driver_name=driver_name,
        node_name=node_name,
        status=status,
        events=events,
        activity=activity,
    )


def make_disruption_guard(
    api_client: Any,
    driver_name: str,
    node_name: str,
    reporting: ClaimReporter,
    *,
    mode: GuardMode,
    interval_s: float,
    prepared: PreparedClaims | None = None,
    on_count: Callable[[int], None] | None = None,
) -> DisruptionGuard:
    """The plugin's disruption guard (``mode`` not off), its Events through ``reporting``;
    ``prepared`` and ``on_count``: see :class:`DisruptionGuard` (the runtime's)."""

    return DisruptionGuard(
        PodApi(api_client, node_name),
        driver_name=driver_name,
        node_name=node_name,
        mode=mode,
        events=reporting.events,
        interval_s=interval_s,
        on_count=on_count,
        prepared=prepared,
    )
