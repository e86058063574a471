"""The kubelet plugin's object graph: backend → inventory → engine → gRPC servers.

:func:`start_plugin` builds it from :class:`PluginParts` in one pass, each object
complete when made (handed its collaborators in its constructor), in this order:

1. the readiness endpoint (first, so the probe hears "starting" rather than nothing);
2. the GPU inventory, then the node context (it needs the GPUs: dmem regions);
3. the checkpoint, the metrics (they read it at scrape time), the disruption
   guard, the mps-agent client;
4. the engine, told of every claim by its observers (claim log, metrics, claim
   status and Events, the disruption guard), and its start-up reconciliation;
5. the health monitor and who it tells (metrics, claim status and Events, the
   legacy MPS UID watch, slice publishing), then slice publishing and the gRPC
   server;

and returns a :class:`Plugin` serving the kubelet, its background tasks running in
one :class:`asyncio.TaskGroup`: they must live as long as the plugin, so one that
fails or returns stops them all and the plugin with them
(:class:`BackgroundTaskFailed`), rather than leaving a live plugin with, say,
stale ResourceSlices. :meth:`Plugin.stop` undoes it in reverse.

It is used by ``dra-driver kubelet-plugin`` (:mod:`~dra_driver.app.plugin_daemon`,
with the real Kubernetes claim source) and in-process by the demo and the tests
(with an in-memory one); :func:`run_until_signalled` is the daemon's main loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

from dra_driver.app.heap import settle_heap
from dra_driver.app.tasks import BackgroundFate, BackgroundTaskFailed, Work, first_of, supervise
from dra_driver.core.claim_writes import GuardMode
from dra_driver.core.model import Inventory
from dra_driver.core.ports import ClaimSource, GpuBackend
from dra_driver.core.prepare import DriverObserver
from dra_driver.gpu.mig_caps import MigCapabilities
from dra_driver.k8s.events import EventRecorder
from dra_driver.kubeletplugin.server import PluginServer
from dra_driver.kubeletplugin.sockets import SocketPaths, socket_paths
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.observability.claim_log import ClaimLog
from dra_driver.observability.metrics_server import MetricsRegistry
from dra_driver.observability.plugin_metrics import PluginMetrics
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.cdi_store import CdiStore
from dra_driver.plugin.checkpoint_reads import CheckpointReads
from dra_driver.plugin.claim_reporting import ClaimReporter
from dra_driver.plugin.config import (
    CHECKPOINT_FILE,
    LOCK_FILE,
    MPS_STATUS_TIMEOUT_S,
    PluginConfig,
    SliceOptions,
)
from dra_driver.plugin.current_inventory import CurrentInventory
from dra_driver.plugin.disruption_guard import DisruptionGuard, PodStore
from dra_driver.plugin.driver import Driver, ReconcileReport
from dra_driver.plugin.enforcement import Enforcer
from dra_driver.plugin.health_monitor import HealthListener, HealthMonitor
from dra_driver.plugin.inventory_watch import InventoryWatch
from dra_driver.plugin.mps_watch import MpsUidWatch
from dra_driver.plugin.node_context import node_context
from dra_driver.plugin.publishing import SlicePublishing
from dra_driver.plugin.readiness import Readiness, ReadinessServer, check_readiness
from dra_driver.state.checkpoint import CheckpointStore, read_boot_id
from dra_driver.state.locks import NodeLock

__all__ = [
    "BackgroundTaskFailed",
    "GuardOptions",
    "Plugin",
    "PluginConfig",
    "PluginParts",
    "SliceOptions",
    "run_until_signalled",
    "start_plugin",
]

log = logging.getLogger(__name__)

MPS_KEPT_CONNECTIONS = 16
"""Connections to the mps-agent kept open between requests (a wave's shares)."""


@dataclass(frozen=True)
class GuardOptions:
    """The disruption guard (``plugin/disruption_guard.py``): whose pods it annotates, how."""

    pods: PodStore
    mode: GuardMode
    interval_s: float
    events: EventRecorder | None = None
    """Where its warnings go (None: the log only)."""


@dataclass(frozen=True)
class PluginParts:
    """What a kubelet plugin is built from: its configuration and the collaborators
    that come from outside it (the GPUs, the claims, the cluster)."""

    config: PluginConfig
    backend: GpuBackend
    claims: ClaimSource
    slices: SliceOptions | None = None
    """How to publish ResourceSlices (None: none are, e.g. the demo)."""
    _: KW_ONLY
    reporting: ClaimReporter | None = None
    """Claim status and Events (None: neither is written, e.g. the demo)."""
    metrics: MetricsRegistry | None = None
    """The registry to keep the plugin's metrics in (None: no metrics)."""
    disruption_guard: GuardOptions | None = None
    """None: no pods are guarded."""
    activity: CallActivity = field(default_factory=CallActivity)
    """The kubelet's calls in flight, shared with ``reporting`` so that its writes
    wait for a lull."""
    observers: Sequence[DriverObserver] = ()
    """Told of every claim besides the plugin's own (after them)."""
    health_listeners: Sequence[HealthListener] = ()
    """Told of every device-health change besides the plugin's own (before them)."""

    def __post_init__(self) -> None:
        self.config.validate()


class Plugin:
    """A running kubelet plugin (from :func:`start_plugin`): its parts, and how to stop it."""

    def __init__(
        self,
        parts: PluginParts,
        *,
        inventory: CurrentInventory,
        driver: Driver,
        reconcile_report: ReconcileReport,
        health_monitor: HealthMonitor,
        publishing: SlicePublishing | None,
        server: PluginServer,
        disruption_guard: DisruptionGuard | None,
        readiness_server: ReadinessServer | None,
        background: BackgroundFate,
        closers: contextlib.AsyncExitStack,
    ) -> None:
        """``background``: its tasks' fate; ``closers``: what :meth:`stop` undoes (the
        tasks, the server, then the rest), in the reverse order of their making."""
        self.config = parts.config
        self.backend = parts.backend
        self.publishes = parts.slices is not None
        self.sockets: SocketPaths = server.sockets
        self._inventory = inventory
        self.driver = driver
        self.reconcile_report = reconcile_report
        self.health_monitor = health_monitor
        self.publishing = publishing
        """None when the plugin publishes no ResourceSlices."""
        self.server = server
        self.disruption_guard = disruption_guard
        self.readiness_server = readiness_server
        """None when ``/readyz`` is not served."""
        self._background = background
        self._closers = closers
        self._stopped = False

    @property
    def inventory(self) -> Inventory:
        """The node's GPUs as last discovered."""
        return self._inventory.get()

    @property
    def failure(self) -> BackgroundTaskFailed | None:
        """Why the background tasks stopped (one failed or ended); None while they run."""
        return self._background.failure

    @property
    def failed(self) -> asyncio.Event:
        """Set when :attr:`failure` is: :func:`run_until_signalled` then stops the plugin."""
        return self._background.failed

    def readiness(self) -> Readiness:
        """Registered with the kubelet and, when it publishes, the last publish succeeded."""
        registration, publishing = self.server.registration, self.publishing
        last = publishing.last_result if publishing is not None else None
        return check_readiness(
            started=not self._stopped and self.failure is None and registration is not None,
            registered=registration is not None and registration.registered,
            registration_error=registration.error if registration is not None else None,
            publishes=self.publishes,
            published_generation=last.generation if last is not None else None,
            publish_failing=publishing.failing if publishing is not None else None,
        )

    async def stop(self) -> None:
        self._stopped = True
        if self.readiness_server is not None:
            await self.readiness_server.close()
        await self._closers.aclose()


async def start_plugin(parts: PluginParts) -> Plugin:
    """Build the plugin from ``parts`` (see the module docstring) and serve the kubelet.

    A step that fails closes what the steps before it made, then raises.
    """
    closers = contextlib.AsyncExitStack()
    try:
        plugin = await _build(parts, closers)
    except BaseException:
        await closers.aclose()
        raise
    cfg = parts.config
    log.info(
        "kubelet plugin for %s on node %s serving %d GPU(s) from the %s backend",
        cfg.driver_name,
        cfg.node_name,
        len(plugin.inventory.gpus),
        parts.backend.name,
    )
    return plugin


async def _build(parts: PluginParts, closers: contextlib.AsyncExitStack) -> Plugin:
    """Every part, in order; each one that must be closed is pushed on ``closers``."""
    cfg, backend, reporting = parts.config, parts.backend, parts.reporting
    readiness_server = None
    if cfg.readiness_port is not None:
        readiness_server = ReadinessServer(_starting)
        await readiness_server.start(cfg.readiness_port, cfg.readiness_address)
        closers.push_async_callback(readiness_server.close)
    # Closed last, in this order: the backend after the last status writes and
    # Events, those after the guard's last annotations.
    closers.push_async_callback(backend.close)
    if reporting is not None:
        closers.push_async_callback(reporting.close)
    os.makedirs(cfg.plugin_dir, exist_ok=True)
    current = CurrentInventory(await backend.inventory())
    inventory = current.get()
    ctx = await node_context(cfg, backend, inventory)
    checkpoints = CheckpointStore(
        os.path.join(cfg.plugin_dir, CHECKPOINT_FILE), read_boot_id(cfg.boot_id_file)
    )
    reads = CheckpointReads(checkpoints, current.get)
    metrics = (
        PluginMetrics(parts.metrics, checkpoints=checkpoints, inventory=current.get)
        if parts.metrics is not None
        else None
    )
    guard = _disruption_guard(parts, reads, metrics)
    if guard is not None:
        closers.push_async_callback(guard.close)
    mps = None
    if cfg.mps_agent_socket:
        # Kept connections: the prepare path sends a wave's shares at once.
        mps = MpsAgentClient(cfg.mps_agent_socket, keep_connections=MPS_KEPT_CONNECTIONS)
        closers.push_async_callback(mps.close)
    observers: list[DriverObserver] = [ClaimLog()]
    observers += [o for o in (metrics, reporting, guard) if o is not None]
    lock = NodeLock(os.path.join(cfg.plugin_dir, LOCK_FILE))
    closers.callback(lock.close)
    driver = Driver(
        ctx=ctx,
        inventory=current,
        claims=parts.claims,
        checkpoints=checkpoints,
        cdi=CdiStore(cfg.cdi_root, ctx.cdi_kind),
        lock=lock,
        enforcer=Enforcer(
            backend=backend,
            inventory=current.get,
            mig_caps=MigCapabilities(cfg.proc_root) if backend.reads_mig_capabilities else None,
            mps=mps,
            settings=cfg.settings,
            lull=parts.activity.lull,
        ),
        observers=[*observers, *parts.observers],
        activity=parts.activity,
    )
    closers.push_async_callback(driver.close)
    report = await driver.reconcile()
    health = _health_monitor(parts, inventory, ctx.pool_name, metrics)
    await _report_current_claims(reporting, health, reads)
    publishing = None
    if parts.slices is not None:
        publishing = SlicePublishing(
            parts.slices.publisher,
            parts.slices.probe,
            inventory=current,
            settings=cfg.settings,
            driver_name=cfg.driver_name,
            node_name=cfg.node_name,
            hidden_mig_devices=reads.created_mig_devices,
            taints=health.taints,
        )
    server = PluginServer(
        cfg.driver_name,
        socket_paths(cfg.driver_name, cfg.registry_dir, cfg.plugin_dir, cfg.rolling_update_uid),
        driver,
        health.hub,
        on_registered=[publishing.on_registered] if publishing is not None else [],
    )
    background = BackgroundFate()
    # Undone in reverse: the tasks are cancelled before the server stops. The
    # publisher is cancelled, never told to unpublish: see plugin/publishing.py.
    closers.push_async_callback(server.stop)
    tasks = asyncio.create_task(
        supervise(
            _background_work(parts, current, guard=guard, publishing=publishing, health=health),
            component="plugin",
            on_failure=background.stopped,
        ),
        name="plugin-tasks",
    )
    closers.push_async_callback(_cancel, tasks)
    await server.start()
    plugin = Plugin(
        parts,
        inventory=current,
        driver=driver,
        reconcile_report=report,
        health_monitor=health,
        publishing=publishing,
        server=server,
        disruption_guard=guard,
        readiness_server=readiness_server,
        background=background,
        closers=closers,
    )
    if readiness_server is not None:
        readiness_server.check = plugin.readiness  # from "starting" to the plugin's own
    return plugin


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _starting() -> Readiness:
    """Readiness while the plugin is being built."""
    return check_readiness(
        started=False,
        registered=False,
        registration_error=None,
        publishes=False,
        published_generation=None,
        publish_failing=None,
    )


def _disruption_guard(
    parts: PluginParts, reads: CheckpointReads, metrics: PluginMetrics | None
) -> DisruptionGuard | None:
    options = parts.disruption_guard
    if options is None:
        return None
    return DisruptionGuard(
        options.pods,
        driver_name=parts.config.driver_name,
        node_name=parts.config.node_name,
        mode=options.mode,
        events=options.events,
        interval_s=options.interval_s,
        on_count=metrics.set_guarded_pods if metrics is not None else None,
        prepared=reads.prepared_refs,
    )


def _health_monitor(
    parts: PluginParts, inventory: Inventory, pool_name: str, metrics: PluginMetrics | None
) -> HealthMonitor:
    """The device-health monitor and who it tells: metrics, claim status and Events
    (device health), the legacy MPS UID watch (MPS status), slice publishing (taints)."""
    cfg, reporting = parts.config, parts.reporting
    listeners = list(parts.health_listeners)
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
        parts.backend,
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
        snapshot_listeners=[metrics.set_device_health] if metrics is not None else [],
        mps_listeners=mps_listeners,
        # The publisher's own request: slice publishing reads the monitor's taints.
        republish=parts.slices.publisher.request_publish if parts.slices is not None else None,
    )
    if metrics is not None:
        metrics.set_device_health(monitor.devices())
    return monitor


async def _report_current_claims(
    reporting: ClaimReporter | None, health: HealthMonitor, reads: CheckpointReads
) -> None:
    """The monitor tells listeners of changes only: give the reporter every
    device's state now (healthy unless a fault says otherwise), or claims on a
    device that never changed would show DeviceHealthy Unknown; and the claims
    the checkpoint holds as prepared."""
    if reporting is None:
        return
    reporting.devices_health_changed(health.devices())
    reporting.remember(await reads.completed_claims())


def _background_work(
    parts: PluginParts,
    current: CurrentInventory,
    *,
    guard: DisruptionGuard | None,
    publishing: SlicePublishing | None,
    health: HealthMonitor,
) -> dict[str, Work]:
    """The plugin's background tasks by name (each must run until shutdown)."""
    cfg, backend = parts.config, parts.backend
    work: dict[str, Work] = {}
    if guard is not None:
        work["disruption-guard"] = guard.run
    if publishing is not None:
        work["slice-publisher"] = publishing.run
    work["device-health"] = health.run
    if cfg.inventory_interval > 0:
        watch = InventoryWatch(
            backend.inventory,
            current,
            interval=cfg.inventory_interval,
            follow_health=health.set_inventory,
            republish=publishing.request_publish if publishing is not None else None,
        )
        work["inventory-watch"] = watch.run
    return work


async def run_until_signalled(
    start: Callable[[], Awaitable[Plugin]], *, settle: bool = False
) -> None:
    """Start the plugin (``start``, e.g. ``functools.partial(start_plugin, parts)``) and
    serve until SIGTERM or SIGINT, then shut down and remove the sockets.

    Raises :class:`BackgroundTaskFailed` (after shutting down) when a background
    task failed or ended: the daemon then exits with an error, to be restarted.
    ``settle``: once started, freeze the heap (:func:`~dra_driver.app.heap.settle_heap`;
    the daemon's process, not a test's).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    plugin = await start()
    if settle:
        settle_heap()
    try:
        await first_of(stop.wait(), plugin.failed.wait())
        if plugin.failure is None:
            log.info("signal received; shutting down")
    finally:
        await plugin.stop()
    if plugin.failure is not None:
        raise plugin.failure
