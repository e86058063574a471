"""Leader election with a ``coordination.k8s.io/v1`` Lease, as client-go does it.

A candidate takes the Lease when it is free (no holder) or expired
(``renewTime + leaseDurationSeconds`` in the past), renews it every
``renew_interval_s`` while it leads, and gives it up on shutdown (holder
cleared, duration 1 s). Every write carries the resourceVersion read, so two
candidates never both win.

Nothing fails silently: every failed attempt is logged with its cause (the
call, HTTP status, reason and the API server's message), a leader's at
WARNING. A failed renewal is retried every ``retry_interval_s``; when none has
succeeded within ``renew_deadline_s`` (shorter than the lease, so the Lease is
still ours when we stop), or the Lease names another holder, leadership is
lost: :meth:`LeaderElector.run` raises :class:`LeadershipLostError`, which ends
the controller with exit status 2 so that its pod restarts and another replica
(or this one, anew) takes over. A replica never stays up neither leading nor
trying to.

:func:`lease_action` is the pure rule; :class:`LeaderElector` does the I/O.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
from typing import Any, Literal

from dra_driver.base.errors import (
    ApiConflictError,
    ApiError,
    ApiNotFoundError,
    ConfigError,
    LeadershipLostError,
)
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.watch import MERGE_PATCH, send_json

log = logging.getLogger(__name__)

Action = Literal["take", "renew", "wait"]


def _parse(stamp: str | None) -> datetime.datetime | None:
    if not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None


def micro_time(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_action(lease: JsonObj | None, identity: str, now: datetime.datetime) -> Action:
    """What ``identity`` may do with ``lease`` at ``now`` (pure)."""
    if lease is None:
        return "take"
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == identity:
        return "renew"
    if not holder:
        return "take"
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if renewed is None or renewed + datetime.timedelta(seconds=duration) < now:
        return "take"
    return "wait"


class LeaderElector:
    def __init__(
        self,
        api_client: Any,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        renew_interval_s: float = 5.0,
        retry_interval_s: float = 2.0,
    ) -> None:
        if not (0 < max(retry_interval_s, renew_interval_s) < renew_deadline_s < lease_duration_s):
            raise ConfigError(
                f"leader election needs 0 < retry period ({retry_interval_s:g}s) and renew "
                f"interval ({renew_interval_s:g}s) < renew deadline ({renew_deadline_s:g}s) < "
                f"lease duration ({lease_duration_s:g}s), as client-go does: change "
                "--retry-period, --renew-deadline or --lease-duration"
            )
        self._api = api_client
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.renew_interval_s = renew_interval_s
        self.retry_interval_s = retry_interval_s
        self.is_leader = False
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self._last_renew = 0.0
        self._last_error: ApiError | None = None

    @property
    def _path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    @property
    def lease(self) -> str:
        return f"{self.namespace}/{self.name}"

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards. Raises
        :class:`ApiError` when a call fails, :class:`LeadershipLostError` when this
        leader finds the Lease held by another."""
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease: JsonObj | None = await asyncio.to_thread(
                send_json, self._api, "GET", f"{self._path}/{self.name}"
            )
        except ApiNotFoundError:
            lease = None
        action = lease_action(lease, self.identity, now)
        if action == "wait":
            if self.is_leader:
                holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
                self._lose(f"the Lease is held by {holder!r} now")
            return False
        spec: JsonObj = dict((lease or {}).get("spec") or {})
        if action == "take":
            spec["holderIdentity"] = self.identity
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if lease is not None else 0
            )
        spec["leaseDurationSeconds"] = max(1, int(self.lease_duration_s))
        spec["renewTime"] = micro_time(now)
        if lease is None:
            body: JsonObj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": spec,
            }
            await asyncio.to_thread(send_json, self._api, "POST", self._path, body)
        else:
            await self._patch_spec(lease, spec)
        return True

    async def _patch_spec(self, lease: JsonObj, spec: JsonObj) -> None:
        """Write ``spec`` over the Lease as read: a merge patch guarded by its
        resourceVersion, so two candidates cannot both take it (one gets 409)."""
        version = (lease.get("metadata") or {}).get("resourceVersion")
        patch = {"metadata": {"resourceVersion": version}, "spec": spec}
        await asyncio.to_thread(
            functools.partial(
                send_json,
                self._api,
                "PATCH",
                f"{self._path}/{self.name}",
                patch,
                content_type=MERGE_PATCH,
            )
        )

    async def run(self) -> None:
        """Campaign, then renew, until cancelled (then the Lease is released) or until
        leadership is lost (:class:`LeadershipLostError`)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                held = await self._attempt()
                now = loop.time()
                if held:
                    self._last_renew = now
                    self._last_error = None
                    if not self.is_leader:
                        log.info("%s leads (lease %s)", self.identity, self.lease)
                        self.is_leader = True
                        self.lost.clear()
                        self.leading.set()
                elif self.is_leader and now - self._last_renew >= self.renew_deadline_s:
                    self._lose(
                        f"no renewal succeeded within the renew deadline "
                        f"({self.renew_deadline_s:g}s); the last attempt: {self._last_error}"
                    )
                await asyncio.sleep(self.renew_interval_s if held else self.retry_interval_s)
        finally:
            if self.is_leader:  # cancelled while leading: shutting down
                self._step_down("shutting down")
                await self.release()

    async def _attempt(self) -> bool:
        """One attempt, its failure logged with its cause (never silently)."""
        try:
            return await self.try_acquire_or_renew()
        except ApiError as err:
            self._last_error = err
            if self.is_leader:
                log.warning(
                    "%s could not renew the lease %s (retrying in %gs, leadership ends "
                    "%gs after the last renewal): %s",
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

    def _lose(self, why: str) -> None:
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
            lease = await asyncio.to_thread(
                send_json, self._api, "GET", f"{self._path}/{self.name}"
            )
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = ""
            spec["leaseDurationSeconds"] = 1
            await self._patch_spec(lease, spec)
        except ApiError as err:
            log.warning("could not release the lease %s: %s", self.lease, err)
