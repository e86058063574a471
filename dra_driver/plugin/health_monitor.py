"""Keeps device health current: backend events, the liveness probe, the mps-agent (I/O).

The decisions are the pure :class:`~dra_driver.core.health.HealthModel`'s;
this module feeds it and spreads the result. Inputs:

* the backend's health events (XIDs), as they come;
* every ``interval`` seconds: the backend's liveness probe (unless
  ``--health-probe-interval 0``), the mps-agent's daemon status (when an agent
  socket is configured), and the recovery clock.

On every change the monitor updates the kubelet's health streams (the full
list), asks slice publishing to republish when the device taints changed
(which bumps the pool generation), and calls each of :attr:`HealthMonitor.listeners`
with the devices that changed (each of :attr:`HealthMonitor.snapshot_listeners`
with all of them). Every ``interval`` it also re-sends the full
list unchanged: the kubelet marks a device Unknown when its last report is
older than ``health_check_timeout_seconds``, which is set to three intervals.
Every status read from the mps-agent also goes to each of
:attr:`HealthMonitor.mps_listeners` (``plugin.mps_watch``: legacy MPS UID waits).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from dra_driver.base.errors import DriverError
from dra_driver.base.ids import GpuUUID
from dra_driver.core.health import (
    NOT_AN_XID,
    DeviceHealth,
    HealthModel,
    HealthSettings,
    Status,
    XidClass,
    classify_xid,
    describe_xid,
    device_taints,
)
from dra_driver.core.model import HealthEvent, Inventory
from dra_driver.core.ports import GpuBackend
from dra_driver.kubeletplugin.health import DeviceHealthState, HealthHub, health_states
from dra_driver.mpsagent.port import MpsAgentPort
from dra_driver.mpsagent.protocol import AgentStatus

log = logging.getLogger(__name__)

HealthListener = Callable[[Sequence[DeviceHealth]], None]
"""Told of the devices whose health changed (Events, claim status, metrics)."""

MpsStatusListener = Callable[[AgentStatus], Awaitable[None]]
"""Given every status read from the mps-agent (``MpsUidWatch.update``)."""

DEFAULT_INTERVAL_S = 30.0
"""How often to check and report when the probe is off."""
TIMEOUT_INTERVALS = 3
"""Reports the kubelet may miss before it calls our devices Unknown."""

_Taints = Mapping[str, Sequence[Mapping[str, str]]]


def report_timeout(interval: float) -> int:
    """``health_check_timeout_seconds`` for reports sent every ``interval`` seconds."""
    return max(1, math.ceil(TIMEOUT_INTERVALS * interval))


def mps_daemons_down(status: AgentStatus) -> dict[GpuUUID, str]:
    """GPUs whose daemon should run (it holds shares) and does not, with why."""
    return {
        GpuUUID(d.gpu_uuid): (
            f"the daemon serving {d.shares} share(s) is not running; the mps-agent is "
            "restarting it (its log says why it died)"
        )
        for d in status.daemons
        if d.shares > 0 and not d.running
    }


class HealthMonitor:
    def __init__(
        self,
        backend: GpuBackend,
        inventory: Inventory,
        *,
        driver_name: str,
        pool_name: str,
        settings: HealthSettings,
        probe_interval: float = DEFAULT_INTERVAL_S,
        mps: MpsAgentPort | None = None,
        clock: Callable[[], float] = time.time,
        listeners: Sequence[HealthListener] = (),
        snapshot_listeners: Sequence[HealthListener] = (),
        mps_listeners: Sequence[MpsStatusListener] = (),
        republish: Callable[[], None] | None = None,
    ) -> None:
        """``probe_interval`` 0 turns the probe off; checks and reports then run every 30 s.

        ``listeners``, ``snapshot_listeners``, ``mps_listeners``, ``republish``: see
        the attributes of those names.
        """
        self.backend = backend
        self.driver_name = driver_name
        self.pool_name = pool_name
        self.settings = settings
        self.probe_enabled = probe_interval > 0
        self.interval = probe_interval if self.probe_enabled else DEFAULT_INTERVAL_S
        self.timeout_seconds = report_timeout(self.interval)
        self.mps = mps
        self.clock = clock
        self.model = HealthModel(settings, inventory, clock())
        self.hub = HealthHub(self._states())
        """The kubelet's health streams read this."""
        self.listeners: list[HealthListener] = list(listeners)
        """Called with the devices whose health changed; add yours."""
        self.snapshot_listeners: list[HealthListener] = list(snapshot_listeners)
        """Called with every device's health (all of them) on each change: those that
        replace what they report whole (the metrics)."""
        self.mps_listeners: list[MpsStatusListener] = list(mps_listeners)
        """Awaited with every status read from the mps-agent; add yours."""
        self.republish = republish
        """Called when the device taints changed (slice publishing's ``request_publish``)."""
        self._lock = asyncio.Lock()
        self._mps_restarts: dict[str, int] | None = None
        self._agent_answers: bool | None = None

    # -- views ---------------------------------------------------------------------------

    def devices(self) -> list[DeviceHealth]:
        return self.model.devices()

    def taints(self) -> dict[str, list[dict[str, str]]]:
        """Device name → its device taints now (for the ResourceSlices)."""
        return device_taints(
            self.model.devices(),
            driver_name=self.driver_name,
            fatal_effect=self.settings.fatal_effect,
        )

    def _states(self) -> list[DeviceHealthState]:
        return health_states(
            self.model.devices(),
            self.pool_name,
            now=self.clock(),
            timeout_seconds=self.timeout_seconds,
        )

    # -- running -------------------------------------------------------------------------

    async def run(self) -> None:
        """Watch events and check every ``interval`` until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._consume_events(), name="health-events")
            group.create_task(self._check_periodically(), name="health-checks")

    async def _consume_events(self) -> None:
        async for event in self.backend.health_events():
            await self.handle_event(event)
        log.error(
            "the %s backend's health events ended: XIDs are no longer seen (the liveness "
            "probe still runs); restart the plugin to watch them again",
            self.backend.name,
        )

    async def _check_periodically(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # a bug here must not end health reporting
                log.exception("device health check failed; trying again in %.0f s", self.interval)
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # Cancelled during the check, and the cancellation was lost: Python
                # 3.11's asyncio.wait_for returns (or raises) what it waited for when
                # that ends as the cancellation arrives (the mps-agent client).
                raise asyncio.CancelledError
            await asyncio.sleep(self.interval)

    async def check_once(self) -> None:
        """Probe, read the mps-agent, let recovery time pass, and report to the kubelet."""
        if self.probe_enabled:
            await self.probe_once()
        if self.mps is not None:
            await self.poll_mps_once()
        await self.tick()

    # -- inputs --------------------------------------------------------------------------

    async def handle_event(self, event: HealthEvent) -> None:
        where = f"GPU {event.gpu_uuid}"
        if event.mig_uuid:
            where += f" MIG device {event.mig_uuid}"
        if event.xid == NOT_AN_XID:
            log.error("%s: health events failed: %s", where, event.message or "(no message)")
        else:
            kind = classify_xid(event.xid, self.settings.ignored_xids)
            level = logging.WARNING if kind in (XidClass.FATAL, XidClass.DEVICE) else logging.INFO
            what = describe_xid(event.xid)
            if event.message and event.message.lower() not in what.lower():
                what += f": {event.message}"
            log.log(
                level,
                "%s reported %s, a%s %s error%s",
                where,
                what,
                "n" if kind[0] in "aeiou" else "",
                kind,
                _CONSEQUENCE[kind],
            )
        await self._change(lambda now: self.model.record_event(event, now))

    async def probe_once(self) -> None:
        """Ask the backend whether each GPU still answers."""
        try:
            results = await self.backend.probe()
        except DriverError as err:
            log.warning("the GPU liveness probe failed: %s", err)
            why = str(err)
            await self._change(lambda now: self.model.record_probe_failure(why, now))
            return
        await self._change(lambda now: self.model.record_probe(results, now))

    async def poll_mps_once(self) -> None:
        """Read which MPS daemons are down from the mps-agent; log the restarts it made."""
        if self.mps is None:
            return
        try:
            status = await self.mps.status()
        except DriverError as err:
            if self._agent_answers is not False:
                log.warning(
                    "cannot read the MPS daemons' state from the mps-agent: %s; keeping the "
                    "last known state",
                    err,
                )
            self._agent_answers = False
            return
        if self._agent_answers is False:
            log.info("the mps-agent answers again")
        self._agent_answers = True
        self._log_restarts(status)
        down = mps_daemons_down(status)
        await self._change(lambda now: self.model.record_mps(down, now))
        for listener in list(self.mps_listeners):
            try:
                await listener(status)
            except Exception:  # a bug there must not end health reporting
                log.exception("mps-agent status listener %r failed", listener)

    async def tick(self) -> None:
        """Clear problems quiet for long enough, and send the kubelet a fresh report."""
        await self._change(self.model.tick)
        await self.hub.update(self._states())

    async def set_inventory(self, inventory: Inventory) -> None:
        """The node's GPUs changed (re-discovery): follow them."""
        await self._change(lambda now: self.model.set_inventory(inventory, now), always=True)

    # -- internals -----------------------------------------------------------------------

    async def _change(
        self, apply: Callable[[float], list[DeviceHealth]], *, always: bool = False
    ) -> None:
        """Apply one input to the model; spread what changed (``always``: report anyway)."""
        async with self._lock:
            before = self.taints()
            changed = apply(self.clock())
            if not changed and not always:
                return
            _log_changes(changed)
            await self.hub.update(self._states())
            if self.republish is not None and self.taints() != before:
                self.republish()
            devices = self.model.devices()
            told = [(lis, changed) for lis in self.listeners]
            told += [(lis, devices) for lis in self.snapshot_listeners]
            for listener, what in told:
                try:
                    listener(what)
                except Exception:
                    log.exception("device health listener %r failed", listener)

    def _log_restarts(self, status: AgentStatus) -> None:
        previous = self._mps_restarts
        self._mps_restarts = {d.gpu_uuid: d.restarts for d in status.daemons}
        if previous is None:
            return
        for daemon in status.daemons:
            grown = daemon.restarts - previous.get(daemon.gpu_uuid, daemon.restarts)
            if grown <= 0:
                continue
            log.warning(
                "the MPS control daemon of GPU %s died and the mps-agent restarted it "
                "(%d time(s) since the last check; now %s, %d share(s) restored): the "
                "containers of those shares lost their MPS connection and may have failed; "
                "the mps-agent's log names what was lost",
                daemon.gpu_uuid,
                grown,
                f"pid {daemon.pid}" if daemon.running else "not running",
                daemon.shares,
            )


_CONSEQUENCE = {
    XidClass.FATAL: ": the GPU needs a reset; its devices are unhealthy until one is seen",
    XidClass.DEVICE: ": its devices are unhealthy until they have been quiet for a while",
    XidClass.APPLICATION: ": the workload that caused it fails, the device stays healthy",
    XidClass.INFORMATIONAL: "; nothing to do",
    XidClass.IGNORED: " (listed in --ignored-xids)",
}


def _log_changes(changed: Sequence[DeviceHealth]) -> None:
    """One line per GPU and state: a fatal XID on a MIG GPU changes 20-odd devices at once."""
    groups: dict[tuple[str, Status, str, bool, str], list[str]] = {}
    for device in changed:
        message = device.message.replace(f"its GPU {device.gpu_uuid}: ", "")
        key = (device.gpu_uuid, device.status, device.reason, device.fatal, message)
        groups.setdefault(key, []).append(device.device_name)
    for (gpu, status, reason, fatal, message), names in groups.items():
        devices = f"device {names[0]}" if len(names) == 1 else f"devices {', '.join(names)}"
        if status is Status.HEALTHY:
            log.info("GPU %s: %s healthy", gpu, devices)
        else:
            log.warning(
                "GPU %s: %s %s (%s%s): %s",
                gpu,
                devices,
                status,
                reason,
                ", fatal" if fatal else "",
                message,
            )
