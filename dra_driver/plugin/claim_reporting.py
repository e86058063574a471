"""Tells the cluster what the node did with claims: ``status.devices`` and Events.

:class:`ClaimReporter` is a :class:`~dra_driver.core.prepare.DriverObserver`:

* a prepare that succeeded writes the claim's ``status.devices`` entries (one
  per prepared device or share: ``Ready`` and ``DeviceHealthy`` conditions, the
  enforced limits as data). A repeated prepare writes them only when this
  process has not written them yet (after a restart);
* an unprepare removes our entries (the claim may be gone already: fine);
* a prepare or unprepare that failed records a Warning Event on the claim with
  the engine's reason (``Overcommit`` names the GPU, what is prepared there and
  what was asked). A claim that does not exist (``ClaimNotFound``) or was
  replaced (``ClaimReplaced``) gets none: there is no object to attach it to;
* :meth:`ClaimReporter.device_health_changed`, called by the health monitor,
  records an Event on the Node and on every claim using the device, and
  rewrites those claims' entries with the new ``DeviceHealthy`` condition;
* :meth:`ClaimReporter.mps_uid_waiting`, called by ``plugin.mps_watch`` at
  every poll while a legacy MPS client waits on another UID's server, records
  a Warning ``MpsUidWait`` Event on the Node and on the claims whose share
  waits (every MPS claim on that GPU when which ones is not known; the message
  says so), rate-limited by the recorder; :meth:`ClaimReporter.mps_uid_wait_cleared`
  a Normal ``MpsUidWaitCleared`` on the Node when the wait is over. Device
  health is left alone (see ``plugin/mps_watch.py`` for why).

Nothing here blocks the event loop: status writes run as one task per claim
that always writes the newest wanted state (a prepare then a quick unprepare
never leaves entries behind, whatever the API's latency), and Events are
scheduled by the recorder. Given the plugin's
:class:`~dra_driver.plugin.activity.CallActivity`, a status write waits for a
lull in the kubelet's calls (at most its ``max_wait_s``), so a wave of pods is
answered before their status is written. :meth:`ClaimReporter.close` flushes both at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.claim_writes import HealthSnapshot, HealthStatus, claim_status_entries
from dra_driver.core.prepare import ClaimOperation, MpsInMig, MpsShare, PlannedDevice
from dra_driver.k8s.claim_status import ApplyResult, ClaimStatusWriter
from dra_driver.k8s.events import NORMAL, WARNING, EventRecorder, InvolvedObject, now_rfc3339
from dra_driver.k8s.rest import JsonObj
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.mps_watch import MpsUidWait

log = logging.getLogger(__name__)

COMPONENT = "fractional-gpu-dra-kubelet-plugin"
"""``reportingComponent`` of the plugin's Events (``reportingInstance``: the node)."""

_NO_EVENT_REASONS = frozenset({"ClaimNotFound", "ClaimReplaced"})
"""Failures with no claim object to put an Event on."""


class DeviceHealthChange(Protocol):
    """One device's new health, as the health monitor reports it."""

    @property
    def device_name(self) -> str:
        """The published device (``gpu-0``, a MIG device); empty: every device of ``gpu_uuid``."""
        ...

    @property
    def gpu_uuid(self) -> str: ...

    @property
    def status(self) -> str:
        """``Healthy``, ``Unhealthy`` or ``Unknown``."""
        ...

    @property
    def reason(self) -> str:
        """Short, e.g. ``XidError`` or ``xid-79`` (made a CamelCase condition reason)."""
        ...

    @property
    def message(self) -> str: ...


class PreparedClaim(Protocol):
    """A claim prepared on this node (``state.checkpoint.CheckpointClaim`` fits)."""

    @property
    def ref(self) -> ClaimRef: ...

    @property
    def devices(self) -> Sequence[PlannedDevice]: ...


@dataclass
class _Prepared:
    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]
    ready_since: str


def _matches(device: PlannedDevice, device_name: str, gpu_uuid: str) -> bool:
    if device_name:
        return device.device_name == device_name
    return bool(gpu_uuid) and device.gpu_uuid == gpu_uuid


def _mps_on(device: PlannedDevice, gpu_uuid: str) -> bool:
    """An MPS share served by the daemon for ``gpu_uuid``: a GPU's, or a MIG instance's."""
    match device:
        case MpsInMig(mig=mig):
            return mig.mig_uuid == gpu_uuid
        case MpsShare():
            return device.gpu_uuid == gpu_uuid
        case _:
            return False


class ClaimReporter:
    """Claim status and Events for one node; see the module docstring.

    ``status``: None turns ``status.devices`` off (``--claim-status=off``);
    ``events``: None turns Events off.
    """

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        status: ClaimStatusWriter | None,
        events: EventRecorder | None,
        clock: Callable[[], str] = now_rfc3339,
        activity: CallActivity | None = None,
    ) -> None:
        """``activity``: the kubelet's calls in flight (the plugin's
        :class:`~dra_driver.plugin.activity.CallActivity`); status writes wait for
        a lull in them. None: they start at once."""
        self.driver_name = driver_name
        self.node_name = node_name
        self.status_writer = status
        self.events = events
        self._clock = clock
        self._activity = activity
        self._prepared: dict[ClaimUID, _Prepared] = {}
        self._written: set[ClaimUID] = set()
        self._health_by_device: dict[str, HealthSnapshot] = {}
        self._health_by_gpu: dict[str, HealthSnapshot] = {}
        self._wanted: dict[ClaimUID, tuple[ClaimRef, list[JsonObj]]] = {}
        self._writers: dict[ClaimUID, asyncio.Task[None]] = {}

    # --- DriverObserver ---------------------------------------------------------------

    def claim_done(self, op: ClaimOperation) -> None:
        if op.operation == "prepare":
            if op.ok:
                self._prepared_ok(op)
            else:
                self._failed(op, "prepare")
        elif op.ok:
            self._prepared.pop(op.ref.uid, None)
            self._want(op.ref, [])
        else:
            self._failed(op, "unprepare")

    def _prepared_ok(self, op: ClaimOperation) -> None:
        known = self._prepared.get(op.ref.uid)
        if known is None:
            known = _Prepared(op.ref, op.devices, self._clock())
            self._prepared[op.ref.uid] = known
        else:
            known.devices = op.devices
        if op.repeated and (op.ref.uid in self._written or op.ref.uid in self._wanted):
            return
        self._want(op.ref, self._entries(known))

    def _failed(self, op: ClaimOperation, what: str) -> None:
        if op.reason in _NO_EVENT_REASONS:
            return
        message = f"{what} on node {self.node_name} failed: {op.error}"
        self._event(InvolvedObject.claim(op.ref), op.reason or "Failed", message, WARNING)

    # --- device health ----------------------------------------------------------------

    def remember(self, claims: Iterable[PreparedClaim]) -> None:
        """Claims prepared before this process started (the checkpoint's), for health
        changes; claims already known are kept as they are."""
        for claim in claims:
            if claim.ref.uid not in self._prepared:
                self._prepared[claim.ref.uid] = _Prepared(
                    claim.ref, tuple(claim.devices), self._clock()
                )

    def devices_health_changed(self, changes: Sequence[DeviceHealthChange]) -> None:
        """:meth:`device_health_changed` for each change: a health monitor listener."""
        for change in changes:
            self.device_health_changed(change)

    def device_health_changed(
        self, change: DeviceHealthChange, claims: Iterable[PreparedClaim] = ()
    ) -> None:
        """Report ``change``: Events on the Node and affected claims, their entries rewritten.

        ``claims``: claims prepared on this node that this process may not know
        (see :meth:`remember`); those using the device are told. A report that
        repeats the device's current health (status and reason) changes nothing;
        the first report of a healthy device updates the claims' conditions
        without Events. Call on the event loop.
        """
        status = HealthStatus.parse(change.status)
        if status.value.lower() != change.status.strip().lower():
            log.warning(
                "device %s: unknown health status %r, taken as Unknown",
                change.device_name or change.gpu_uuid,
                change.status,
            )
        health_map = self._health_by_device if change.device_name else self._health_by_gpu
        key = change.device_name or change.gpu_uuid
        if not key:
            log.warning("a device health change names no device and no GPU; ignored: %r", change)
            return
        old = health_map.get(key)
        if old is not None and (old.status, old.reason) == (status, change.reason):
            return
        health = HealthSnapshot(status, change.reason, change.message, self._clock())
        health_map[key] = health
        self.remember(claims)
        affected = self._claims_on(change.device_name, change.gpu_uuid)
        for claim in affected:
            self._want(claim.ref, self._entries(claim))
        if old is None and status is HealthStatus.HEALTHY:
            return  # the first report of a healthy device is no news worth an Event

        label = change.device_name or "every device"
        detail = f"{change.reason}: {change.message}" if change.reason else change.message
        message = (
            f"{label} (GPU {change.gpu_uuid or 'unknown'}) on node {self.node_name} is "
            f"{status.value.lower()}" + (f": {detail}" if detail else "")
        )
        reason = {
            HealthStatus.HEALTHY: "DeviceHealthy",
            HealthStatus.UNHEALTHY: "DeviceUnhealthy",
            HealthStatus.UNKNOWN: "DeviceHealthUnknown",
        }[status]
        event_type = NORMAL if status is HealthStatus.HEALTHY else WARNING
        self._event(InvolvedObject.node(self.node_name), reason, message, event_type)
        for claim in affected:
            self._event(InvolvedObject.claim(claim.ref), reason, message, event_type)

    # --- legacy MPS: a client waiting on another UID ----------------------------------

    def mps_uid_waiting(self, wait: MpsUidWait) -> None:
        """A Warning ``MpsUidWait`` on the Node and the claims whose share waits.

        Called at every poll while the wait lasts: the recorder writes each Event
        once per its interval (counted on the one before); a new wait (other UIDs)
        has another message, so it is a new Event at once.
        """
        gpu = f"GPU {wait.gpu_uuid} on node {self.node_name}"
        unknown = wait.claim_uids is None
        node_message = f"{gpu}: {wait.describe()}"
        if unknown:
            node_message += (
                ". Which claims' containers wait is not known (the mps-agent records no UID "
                "for this GPU's shares): every claim with an MPS share on it is told"
            )
        elif not wait.claim_uids:
            node_message += (
                ". No claim's share on it is of a waiting UID: a container runs as another "
                "UID than its claim's share was made for"
            )
        self._event(InvolvedObject.node(self.node_name), "MpsUidWait", node_message, WARNING)
        for claim in self._prepared.values():
            devices = sorted({d.device_name for d in claim.devices if _mps_on(d, wait.gpu_uuid)})
            if not devices:
                continue
            if wait.claim_uids is not None and claim.ref.uid not in wait.claim_uids:
                continue
            where = f"This claim's MPS share of {', '.join(devices)} ({gpu})"
            lead = (
                f"{where} may be the one waiting (the mps-agent records no UID for it)"
                if unknown
                else f"{where} is of a waiting UID: its containers wait"
            )
            self._event(
                InvolvedObject.claim(claim.ref), "MpsUidWait", f"{lead}: {wait.describe()}", WARNING
            )

    def mps_uid_wait_cleared(self, wait: MpsUidWait) -> None:
        """A Normal ``MpsUidWaitCleared`` on the Node: nothing waits there any more."""
        server = "another UID" if wait.server_uid is None else f"UID {wait.server_uid}"
        message = (
            f"GPU {wait.gpu_uuid} on node {self.node_name}: no MPS client waits on another "
            f"UID's server now (client(s) of UID {', '.join(map(str, wait.waiting_uids))} "
            f"waited on the server of {server})"
        )
        self._event(InvolvedObject.node(self.node_name), "MpsUidWaitCleared", message, NORMAL)

    def _claims_on(self, device_name: str, gpu_uuid: str) -> list[_Prepared]:
        return [
            p
            for p in self._prepared.values()
            if any(_matches(d, device_name, gpu_uuid) for d in p.devices)
        ]

    def _health(self, device: PlannedDevice) -> HealthSnapshot | None:
        return self._health_by_device.get(device.device_name) or self._health_by_gpu.get(
            device.gpu_uuid
        )

    # --- writing ----------------------------------------------------------------------

    def _entries(self, claim: _Prepared) -> list[JsonObj]:
        return claim_status_entries(
            claim.devices,
            driver_name=self.driver_name,
            ready_since=claim.ready_since,
            health=self._health,
        )

    def _event(self, involved: InvolvedObject, reason: str, message: str, kind: str) -> None:
        if self.events is not None:
            self.events.emit(involved, reason, message, kind)

    def _want(self, ref: ClaimRef, entries: list[JsonObj]) -> None:
        """Make ``entries`` the claim's next write; one writer task per claim."""
        if self.status_writer is None or not self.status_writer.enabled:
            return
        self._wanted[ref.uid] = (ref, entries)
        if ref.uid not in self._writers:
            self._writers[ref.uid] = asyncio.get_running_loop().create_task(
                self._write(ref.uid), name=f"claim-status-{ref.name}"
            )

    async def _write(self, uid: ClaimUID) -> None:
        assert self.status_writer is not None
        try:
            while uid in self._wanted:
                if self._activity is not None:
                    # Off the kubelet's path: let the claims still being prepared
                    # or unprepared have the CPU first.
                    await self._activity.lull()
                wanted = self._wanted.pop(uid, None)
                if wanted is None:
                    break
                ref, entries = wanted
                try:
                    result = await self.status_writer.apply(ref, entries)
                except Exception:  # a bug must not end the plugin; the claim is fine
                    log.exception("writing status.devices of claim %s failed", ref)
                    continue
                if entries and result is ApplyResult.WRITTEN:
                    self._written.add(uid)
                elif not entries:
                    self._written.discard(uid)
        finally:
            self._writers.pop(uid, None)

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait up to ``timeout_s`` for pending status writes and Events; True when done."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._writers and loop.time() < deadline:
            await asyncio.wait(set(self._writers.values()), timeout=deadline - loop.time())
        events_done = (
            await self.events.flush(max(0.0, deadline - loop.time()))
            if self.events is not None
            else True
        )
        return not self._writers and events_done

    async def close(self, timeout_s: float = 5.0) -> None:
        """Finish pending writes (up to ``timeout_s``), then cancel what is left."""
        if not await self.flush(timeout_s):
            pending = set(self._writers.values())
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if pending:
                log.warning("dropped %d claim status write(s) at shutdown", len(pending))
        if self.events is not None:
            await self.events.close(0)
