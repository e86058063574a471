"""Device health (pure): the health model, from inputs to per-device state and recovery.

Inputs, each with the time it was seen (``now``, unix seconds; never read here):

* XID events from the GPU backend (:class:`~dra_driver.core.model.HealthEvent`),
  classified by :func:`classify_xid`;
* the backend's liveness probe: per GPU, answered or why not (fallen off the bus);
* which GPUs' MPS control daemons are down (from the mps-agent's status).

A problem belongs to a *subject*, a GPU or one MIG device. A published device
(:func:`~dra_driver.core.published.device_names`) sees the problems of its GPU and,
for an existing MIG instance, its own; its message says which is which. An XID
that NVML attributes to one MIG device stays on that device unless it is fatal:
a GPU that needs a reset takes all its MIG devices with it.

Recovery:

* a device problem (:attr:`XidClass.DEVICE`) and an event-source failure clear
  once the subject has been quiet for :attr:`HealthSettings.recovery_s`;
* a fatal problem (:attr:`XidClass.FATAL`) clears only when a reset of the GPU
  is seen, i.e. the probe finds the GPU answering again after it was lost (or
  the plugin restarts: this state lives in memory). NVML offers no event for
  a reset done by hand, so after ``nvidia-smi -r`` restart the plugin pod;
* "GPU lost" clears when the probe answers again (which counts as a reset);
* "MPS daemon down" clears when the mps-agent reports the daemon running.

The XID catalogue lives in :mod:`dra_driver.core.health.xid`, the per-device record in
:mod:`dra_driver.core.health.device` and the ResourceSlice taints made from it
in :mod:`dra_driver.core.health.taints`; the package (:mod:`dra_driver.core.health`)
re-exports their names with this module's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dra_driver.base.errors import ConfigError
from dra_driver.base.ids import DeviceName, GpuUUID, MigUUID
from dra_driver.core.health.device import DeviceHealth, Status
from dra_driver.core.health.taints import TaintEffect
from dra_driver.core.health.xid import NOT_AN_XID, XidClass, classify_xid, describe_xid
from dra_driver.core.model import GpuInfo, HealthEvent, Inventory
from dra_driver.core.published import device_names, mig_targets

__all__ = [
    "EVENTS_FAILED",
    "GPU_LOST",
    "MPS_DAEMON_DOWN",
    "PROBE_FAILED",
    "HealthModel",
    "HealthSettings",
    "Problem",
    "Source",
    "xid_reason",
]

# --- settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthSettings:
    """How device health is judged (the kubelet plugin's ``--health-*`` flags)."""

    recovery_s: float = 300.0
    """A device problem clears after the subject has been quiet this long."""
    fatal_effect: TaintEffect = TaintEffect.NO_SCHEDULE
    """Taint effect for fatal problems; NoExecute evicts the pods using the device."""
    ignored_xids: frozenset[int] = frozenset()

    def validate(self) -> None:
        if self.recovery_s < 0:
            raise ConfigError(
                f"--health-recovery-seconds must be 0 or more, not {self.recovery_s}: seconds "
                "a device must stay free of errors before it is healthy again"
            )
        if self.fatal_effect not in tuple(TaintEffect):
            raise ConfigError(
                f"--fatal-xid-taint-effect must be one of {', '.join(TaintEffect)}, "
                f"not {self.fatal_effect!r}"
            )


# --- device health ----------------------------------------------------------------------


class Source(enum.Enum):
    """Where a problem came from; a subject has at most one problem per source."""

    XID = "xid"
    EVENTS = "events"
    PROBE = "probe"
    MPS = "mps"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a GPU or a MIG device."""

    source: Source
    status: Status
    reason: str
    message: str
    since: float
    last_seen: float
    fatal: bool = False
    clears_by_time: bool = False
    """Clears once ``recovery_s`` has passed since ``last_seen`` (else: by a reset or
    by its source saying so)."""

    def rank(self) -> tuple[bool, bool, float]:
        """Bigger is worse: unhealthy over unknown, fatal first, then the oldest."""
        return (self.status is Status.UNHEALTHY, self.fatal, -self.since)


@dataclass(frozen=True)
class _Published:
    """What one published device stands for."""

    name: DeviceName
    gpu: GpuInfo
    is_mig: bool
    """A MIG instance or placement (its GPU is its parent), not a whole GPU."""
    mig_uuid: MigUUID | None
    """The instance's UUID, when it exists now."""


def _published(inventory: Inventory) -> list[_Published]:
    targets = mig_targets(inventory)
    by_name = {gpu.device_name: gpu for gpu in inventory.gpus}
    out = []
    for name in device_names(inventory):
        target = targets.get(name)
        if target is not None:
            mig = target.existing.uuid if target.existing is not None else None
            out.append(_Published(name, target.gpu, True, mig))
        else:
            out.append(_Published(name, by_name[name], False, None))
    return out


GPU_LOST = "gpu-lost"
PROBE_FAILED = "probe-failed"
EVENTS_FAILED = "health-events-failed"
MPS_DAEMON_DOWN = "mps-daemon-down"


def xid_reason(xid: int) -> str:
    return f"xid-{xid}"


class HealthModel:
    """The health of every device this node publishes; pure and synchronous.

    Every ``record_*`` method and :meth:`tick` return the devices whose state
    changed (devices new to the list included), in publishing order. ``now``
    is when the model starts: every device is healthy since then.
    """

    def __init__(self, settings: HealthSettings, inventory: Inventory, now: float) -> None:
        self.settings = settings
        self.inventory = inventory
        self._problems: dict[str, dict[Source, Problem]] = {}
        """Subject (GPU or MIG UUID) → its problems, one per source."""
        self._published = _published(inventory)
        self._last: dict[DeviceName, DeviceHealth] = {}
        self._refresh(now)

    # -- views ---------------------------------------------------------------------------

    def devices(self) -> list[DeviceHealth]:
        """The health of every published device, in publishing order."""
        return [self._last[p.name] for p in self._published]

    def problems(self, subject: str) -> Mapping[Source, Problem]:
        """The problems of a GPU (by UUID) or MIG device (by MIG UUID)."""
        return dict(self._problems.get(subject, {}))

    # -- inputs --------------------------------------------------------------------------

    def set_inventory(self, inventory: Inventory, now: float) -> list[DeviceHealth]:
        """The node's GPUs changed: follow them; problems of subjects gone are forgotten."""
        self.inventory = inventory
        self._published = _published(inventory)
        alive: set[str] = {gpu.uuid for gpu in inventory.gpus}
        alive |= {mig.uuid for gpu in inventory.gpus for mig in gpu.mig_devices}
        for subject in [s for s in self._problems if s not in alive]:
            del self._problems[subject]
        return self._refresh(now)

    def record_event(self, event: HealthEvent, now: float) -> list[DeviceHealth]:
        """An XID (or an event-source failure, XID 0) from the backend."""
        gpu = self._gpu(event.gpu_uuid)
        if gpu is None:
            return []
        if event.xid == NOT_AN_XID:
            detail = event.message or "the GPU's event source failed"
            self._add(
                gpu.uuid,
                Problem(
                    Source.EVENTS,
                    Status.UNKNOWN,
                    EVENTS_FAILED,
                    f"health events unavailable: {detail}",
                    now,
                    now,
                    clears_by_time=True,
                ),
            )
            return self._refresh(now)
        kind = classify_xid(event.xid, self.settings.ignored_xids)
        if kind not in (XidClass.FATAL, XidClass.DEVICE):
            return []
        fatal = kind is XidClass.FATAL
        text = describe_xid(event.xid)
        if event.message and event.message.lower() not in text.lower():
            text += f": {event.message}"
        text += " (needs a GPU reset)" if fatal else ""
        # A fatal XID takes the whole GPU; any other stays on the MIG device it names.
        subject = event.mig_uuid if event.mig_uuid is not None and not fatal else gpu.uuid
        problem = Problem(
            Source.XID,
            Status.UNHEALTHY,
            xid_reason(event.xid),
            text,
            now,
            now,
            fatal=fatal,
            clears_by_time=not fatal,
        )
        self._add(subject, problem)
        return self._refresh(now)

    def record_probe(self, results: Mapping[GpuUUID, str | None], now: float) -> list[DeviceHealth]:
        """The liveness probe: per GPU, None when it answered, else why not.

        A GPU that answers again after it was lost has been reset: every problem
        of it and its MIG devices clears. GPUs the probe does not name keep
        their state.
        """
        for uuid, why in results.items():
            gpu = self._gpu(uuid)
            if gpu is None:
                continue
            previous = self._problems.get(uuid, {}).get(Source.PROBE)
            if why is not None:
                self._add(
                    uuid,
                    Problem(
                        Source.PROBE,
                        Status.UNHEALTHY,
                        GPU_LOST,
                        f"the GPU does not answer: {why}",
                        now,
                        now,
                        fatal=True,
                    ),
                )
            elif previous is not None and previous.reason == GPU_LOST:
                self._reset(gpu)
            else:
                self._drop(uuid, Source.PROBE)
        return self._refresh(now)

    def record_probe_failure(self, why: str, now: float) -> list[DeviceHealth]:
        """The probe could not run at all: health is unknown (a lost GPU stays lost)."""
        for gpu in self.inventory.gpus:
            previous = self._problems.get(gpu.uuid, {}).get(Source.PROBE)
            if previous is None or previous.reason != GPU_LOST:
                self._add(
                    gpu.uuid,
                    Problem(
                        Source.PROBE,
                        Status.UNKNOWN,
                        PROBE_FAILED,
                        f"the liveness probe failed: {why}",
                        now,
                        now,
                    ),
                )
        return self._refresh(now)

    def record_mps(self, down: Mapping[GpuUUID, str], now: float) -> list[DeviceHealth]:
        """The GPUs and MIG instances whose MPS control daemon is down now (why), all of
        them; others are fine. A MIG instance's daemon (keyed by its MIG UUID) marks
        that MIG device, so every MPS share of the instance, and not its GPU (the
        agent keys daemons by the UUID they serve, ``down`` too)."""
        subjects = [
            subject
            for gpu in self.inventory.gpus
            for subject in (gpu.uuid, *(mig.uuid for mig in gpu.mig_devices))
        ]
        for subject in subjects:
            why = down.get(GpuUUID(subject))
            if why is None:
                self._drop(subject, Source.MPS)
            else:
                self._add(
                    subject,
                    Problem(
                        Source.MPS,
                        Status.UNHEALTHY,
                        MPS_DAEMON_DOWN,
                        f"MPS control daemon down: {why}",
                        now,
                        now,
                    ),
                )
        return self._refresh(now)

    def reset(self, gpu_uuid: GpuUUID, now: float) -> list[DeviceHealth]:
        """A reset of the GPU was seen: it and its MIG devices start afresh."""
        gpu = self._gpu(gpu_uuid)
        if gpu is not None:
            self._reset(gpu)
        return self._refresh(now)

    def tick(self, now: float) -> list[DeviceHealth]:
        """Let time pass: problems quiet for ``recovery_s`` clear."""
        limit = self.settings.recovery_s
        for subject, problems in list(self._problems.items()):
            for source, problem in list(problems.items()):
                if problem.clears_by_time and now - problem.last_seen >= limit:
                    del problems[source]
            if not problems:
                del self._problems[subject]
        return self._refresh(now)

    # -- internals -----------------------------------------------------------------------

    def _gpu(self, uuid: str) -> GpuInfo | None:
        return next((gpu for gpu in self.inventory.gpus if gpu.uuid == uuid), None)

    def _add(self, subject: str, new: Problem) -> None:
        """Record ``new``; a worse problem of the same source is kept, a same one refreshed."""
        problems = self._problems.setdefault(subject, {})
        old = problems.get(new.source)
        if old is None or new.rank()[:2] > old.rank()[:2]:
            problems[new.source] = new
        elif new.rank()[:2] == old.rank()[:2]:
            # Same severity: the latest words, the first sighting, the latest sighting.
            problems[new.source] = replace(new, since=old.since)
        else:
            problems[new.source] = replace(old, last_seen=new.last_seen)

    def _drop(self, subject: str, source: Source) -> None:
        problems = self._problems.get(subject)
        if problems is not None:
            problems.pop(source, None)
            if not problems:
                del self._problems[subject]

    def _reset(self, gpu: GpuInfo) -> None:
        # The daemon's state is the mps-agent's to report; everything else starts afresh.
        for subject in (gpu.uuid, *(mig.uuid for mig in gpu.mig_devices)):
            for source in (Source.XID, Source.EVENTS, Source.PROBE):
                self._drop(subject, source)

    def _evaluate(self, device: _Published, now: float) -> DeviceHealth:
        found: list[tuple[Problem, str]] = []
        mig = device.mig_uuid
        if mig is not None:
            found += [(p, "this MIG device") for p in self._problems.get(mig, {}).values()]
        where = f"its GPU {device.gpu.uuid}" if device.is_mig else ""
        found += [(p, where) for p in self._problems.get(device.gpu.uuid, {}).values()]
        if not found:
            health = DeviceHealth(device.name, device.gpu.uuid, Status.HEALTHY, mig_uuid=mig)
        else:
            found.sort(key=lambda item: item[0].rank(), reverse=True)
            worst = found[0][0]
            message = "; ".join(f"{at}: {p.message}" if at else p.message for p, at in found)
            health = DeviceHealth(
                device.name,
                device.gpu.uuid,
                worst.status,
                reason=worst.reason,
                message=message,
                fatal=worst.fatal,
                mig_uuid=mig,
            )
        last = self._last.get(device.name)
        same = last is not None and (last.status, last.reason) == (health.status, health.reason)
        return replace(health, since=last.since if same and last is not None else now)

    def _refresh(self, now: float) -> list[DeviceHealth]:
        changed = []
        current: dict[DeviceName, DeviceHealth] = {}
        for device in self._published:
            health = self._evaluate(device, now)
            current[device.name] = health
            last = self._last.get(device.name)
            if last is None or not last.same_state(health):
                changed.append(health)
        self._last = current
        return changed
