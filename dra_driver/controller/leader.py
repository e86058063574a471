"""Leader election with a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

A candidate takes the Lease when it is free (no holder) or expired, renews it
every ``renew_interval_s`` while it leads, and gives it up on shutdown (holder
cleared, duration 1 s). Every write carries the resourceVersion read, so two
candidates never both win.

**Expiry is judged on this process's own monotonic clock**, as client-go's
``leaderelection`` does: a Lease held by another is expired once
``leaseDurationSeconds`` have passed since this candidate last *saw the record
change* (:class:`Observed`). The holder's ``renewTime`` is never compared with
the local wall clock, so clock skew between nodes cannot let a candidate take
a live Lease; the cost is that a new candidate waits a full lease duration
before taking the Lease of a holder that died (a released Lease is taken at
once).

**Every renewal is bounded by the renew deadline**, measured from the start of
the last renewal that succeeded (the write of a successful attempt lands after
it starts, so every other candidate's observation, and so its expiry, comes
later). The attempts in between, their calls included, run under that
deadline: a renewal whose GET or PATCH hangs is abandoned at the deadline, the
leader stops leading (``leading`` cleared, ``lost`` set) while the Lease is
still valid for everyone else (``renew_deadline_s < lease_duration_s``), and
:meth:`LeaderElector.run` raises :class:`LeadershipLostError`, which ends the
controller with exit status 2 so that its pod restarts. Losing the Lease to
another holder does the same. A replica never stays up neither leading nor
trying to.

Nothing fails silently: every failed attempt is logged with its cause (the
call, HTTP status, reason and the API server's message), a leader's at
WARNING.

:func:`observe` and :func:`lease_action` are the pure rules; :class:`LeaseApi`
is the I/O (:class:`LoopLeaseApi`: on the event loop); :class:`LeaderElector`
runs the campaign.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NoReturn, Protocol

from dra_driver.base.errors import (
    ApiConflictError,
    ApiError,
    ApiNotFoundError,
    ConfigError,
    LeadershipLostError,
)
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import MERGE_PATCH

log = logging.getLogger(__name__)

Action = Literal["take", "renew", "wait"]


def micro_time(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Record = tuple[str, str, str, int, int]
"""What identifies a holder's write: holder, renewTime, acquireTime, duration, transitions."""


def _record(lease: JsonObj) -> Record:
    spec = lease.get("spec") or {}
    return (
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        str(spec.get("acquireTime") or ""),
        int(spec.get("leaseDurationSeconds") or 0),
        int(spec.get("leaseTransitions") or 0),
    )


@dataclass(frozen=True)
class Observed:
    """The Lease record as this candidate last saw it, and when (its monotonic clock)
    it first saw it so."""

    record: Record
    at: float


def observe(previous: Observed | None, lease: JsonObj | None, now: float) -> Observed | None:
    """The observation after reading ``lease`` at ``now`` (pure): a record that changed
    is new as of ``now``; an unchanged one keeps the time it was first seen."""
    if lease is None:
        return None
    record = _record(lease)
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


def lease_action(
    lease: JsonObj | None, identity: str, now: float, observed: Observed | None
) -> Action:
    """What ``identity`` may do with ``lease`` at ``now`` (pure; ``now`` and
    ``observed.at`` on this process's monotonic clock): another holder's Lease is
    expired once its duration has passed since the record was seen to change."""
    if lease is None:
        return "take"
    holder, _, _, duration, _ = _record(lease)
    if holder == identity:
        return "renew"
    if not holder:
        return "take"
    if observed is None or observed.record != _record(lease):
        return "wait"  # just seen: its duration starts now
    return "take" if observed.at + duration <= now else "wait"


class LeaseApi(Protocol):
    """The Lease's reads and writes (raising :class:`ApiError` subclasses)."""

    async def get(self) -> JsonObj | None: ...
    async def create(self, body: JsonObj) -> None: ...
    async def patch(self, lease: JsonObj, spec: JsonObj) -> None: ...


class LoopLeaseApi:
    """:class:`LeaseApi` on the event loop (:class:`~dra_driver.k8s.transport.ApiTransport`),
    so a renewal waits for no thread."""

    def __init__(self, transport: ApiTransport, namespace: str, name: str) -> None:
        self._transport = transport
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._name = name

    async def get(self) -> JsonObj | None:
        try:
            return await self._transport.send_json("GET", f"{self._path}/{self._name}")
        except ApiNotFoundError:
            return None

    async def create(self, body: JsonObj) -> None:
        await self._transport.send_json("POST", self._path, body)

    async def patch(self, lease: JsonObj, spec: JsonObj) -> None:
        """Write ``spec`` over the Lease as read: a merge patch guarded by its
        resourceVersion, so two candidates cannot both take it (one gets 409)."""
        version = (lease.get("metadata") or {}).get("resourceVersion")
        patch = {"metadata": {"resourceVersion": version}, "spec": spec}
        await self._transport.send_json(
            "PATCH", f"{self._path}/{self._name}", patch, content_type=MERGE_PATCH
        )


class LeaderElector:
    def __init__(
        self,
        lease_api: LeaseApi,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        renew_interval_s: float = 5.0,
        retry_interval_s: float = 2.0,
        wall_clock: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        """``lease_api``: the Lease's I/O (:class:`LoopLeaseApi`);
        ``wall_clock``: what stamps ``acquireTime``/``renewTime`` (a callable giving an
        aware datetime; default: UTC now). Neither stamp is ever used for expiry."""
        if not (0 < max(retry_interval_s, renew_interval_s) < renew_deadline_s < lease_duration_s):
            raise ConfigError(
                f"leader election needs 0 < retry period ({retry_interval_s:g}s) and renew "
                f"interval ({renew_interval_s:g}s) < renew deadline ({renew_deadline_s:g}s) < "
                f"lease duration ({lease_duration_s:g}s), as client-go does: change "
                "--retry-period, --renew-deadline or --lease-duration"
            )
        self._leases = lease_api
        self._wall_clock = wall_clock or (lambda: datetime.datetime.now(datetime.UTC))
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.renew_interval_s = renew_interval_s
        self.retry_interval_s = retry_interval_s
        self.is_leader = False
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self._observed: Observed | None = None
        self._last_renew = 0.0
        """Monotonic start of the last attempt that held the Lease."""
        self._last_error: ApiError | None = None

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards. Raises
        :class:`ApiError` when a call fails, :class:`LeadershipLostError` when this
        leader finds the Lease held by another."""
        lease = await self._leases.get()
        seen = asyncio.get_running_loop().time()
        self._observed = observe(self._observed, lease, seen)
        action = lease_action(lease, self.identity, seen, self._observed)
        if action == "wait":
            if self.is_leader:
                holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
                self._lose(f"the Lease is held by {holder!r} now")
            return False
        stamp = micro_time(self._wall_clock())
        spec: JsonObj = dict((lease or {}).get("spec") or {})
        if action == "take":
            spec["holderIdentity"] = self.identity
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if lease is not None else 0
            )
        # Whole seconds in the API: rounded up, so no candidate waits less than configured.
        spec["leaseDurationSeconds"] = max(1, math.ceil(self.lease_duration_s))
        spec["renewTime"] = stamp
        if lease is None:
            await self._leases.create(
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": spec,
                }
            )
        else:
            await self._leases.patch(lease, spec)
        return True

    async def run(self) -> None:
        """Campaign, then renew, until cancelled (then the Lease is released) or until
        leadership is lost (:class:`LeadershipLostError`)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                held = await self._bounded_attempt(started)
                if held:
                    self._last_renew = started
                    self._last_error = None
                    if not self.is_leader:
                        log.info("%s leads (lease %s)", self.identity, self.lease)
                        self.is_leader = True
                        self.lost.clear()
                        self.leading.set()
                    await asyncio.sleep(self.renew_interval_s)
                    continue
                pause = self.retry_interval_s
                if self.is_leader:
                    left = self._deadline() - loop.time()
                    if left <= 0:
                        self._lose(self._deadline_passed())
                    pause = min(pause, left)
                await asyncio.sleep(pause)
        finally:
            if self.is_leader:  # cancelled while leading: shutting down
                self._step_down("shutting down")
                await self.release()

    def _deadline(self) -> float:
        return self._last_renew + self.renew_deadline_s

    def _deadline_passed(self) -> str:
        return (
            f"no renewal succeeded within the renew deadline ({self.renew_deadline_s:g}s after "
            f"the last one began); the last attempt: {self._last_error or 'no answer in time'}"
        )

    async def _bounded_attempt(self, started: float) -> bool:
        """One attempt; a leader's runs under the renew deadline, and one that has not
        answered by then ends the leadership (its calls are abandoned)."""
        if not self.is_leader:
            return await self._attempt()
        try:
            async with asyncio.timeout_at(self._deadline()):
                return await self._attempt()
        except TimeoutError:
            self._last_error = None
            self._lose(self._deadline_passed())

    async def _attempt(self) -> bool:
        """One attempt, its failure logged with its cause (never silently)."""
        try:
            return await self.try_acquire_or_renew()
        except ApiError as err:
            self._last_error = err
            if self.is_leader:
                log.warning(
                    "%s could not renew the lease %s (retrying in %gs, leadership ends "
                    "%gs after the last renewal began): %s",
                    self.identity,
                    self.lease,
                    self.retry_interval_s,
                    self.renew_deadline_s,
                    err,
                )
            elif isinstance(err, ApiConflictError):
                log.info(
                    "%s: another candidate wrote the lease %s first", self.identity, self.lease
                )
            else:
                log.warning(
                    "%s could not take the lease %s (retrying in %gs): %s",
                    self.identity,
                    self.lease,
                    self.retry_interval_s,
                    err,
                )
            return False

    def _step_down(self, why: str) -> None:
        log.info("%s gives up the lease %s: %s", self.identity, self.lease, why)
        self.is_leader = False
        self.leading.clear()
        self.lost.set()

    def _lose(self, why: str) -> NoReturn:
        """Leadership is gone while running: stop leading and end the process."""
        self.is_leader = False
        self.leading.clear()
        self.lost.set()
        raise LeadershipLostError(
            f"{self.identity} lost the leadership (lease {self.lease}): {why}; exiting so "
            "that the pod restarts and a replica that can hold the Lease leads"
        )

    async def release(self) -> None:
        """Give the Lease up so another candidate need not wait for it to expire."""
        try:
            async with asyncio.timeout(self.renew_deadline_s):
                lease = await self._leases.get()
                if lease is None:
                    return
                spec = dict(lease.get("spec") or {})
                if spec.get("holderIdentity") != self.identity:
                    return
                spec["holderIdentity"] = ""
                spec["leaseDurationSeconds"] = 1
                await self._leases.patch(lease, spec)
        except (ApiError, TimeoutError) as err:
            log.warning("could not release the lease %s: %s", self.lease, err or "no answer")
