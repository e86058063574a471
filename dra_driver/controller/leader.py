"""Leader election with a ``coordination.k8s.io/v1`` Lease, as client-go does it.

A candidate takes the Lease when it is free (no holder) or expired
(``renewTime + leaseDurationSeconds`` in the past), renews it every
``renew_interval_s`` while it leads, and gives it up on shutdown (holder
cleared, duration 1 s). Every write carries the resourceVersion read, so two
candidates never both win. Leadership is lost when a renewal has not
succeeded for ``lease_duration_s`` (or the Lease names someone else).

:func:`lease_action` is the pure rule; :class:`LeaderElector` does the I/O.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
from typing import Any, Literal

from dra_driver.base.errors import ApiError, ApiNotFoundError
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
        renew_interval_s: float = 5.0,
        retry_interval_s: float = 2.0,
    ) -> None:
        self._api = api_client
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration_s = lease_duration_s
        self.renew_interval_s = renew_interval_s
        self.retry_interval_s = retry_interval_s
        self.is_leader = False
        self.leading = asyncio.Event()
        self.lost = asyncio.Event()
        self._last_renew = 0.0

    @property
    def _path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this candidate holds the Lease afterwards."""
        now = datetime.datetime.now(datetime.UTC)
        try:
            lease: JsonObj | None = await asyncio.to_thread(
                send_json, self._api, "GET", f"{self._path}/{self.name}"
            )
        except ApiNotFoundError:
            lease = None
        action = lease_action(lease, self.identity, now)
        if action == "wait":
            if self.is_leader:  # someone else holds it now
                self._step_down("another candidate holds it")
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
        """Campaign, then renew, until cancelled; releases the Lease when cancelled."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    held = await self.try_acquire_or_renew()
                except ApiError as err:  # conflict: someone else won; others: retry
                    log.debug("lease %s/%s: %s", self.namespace, self.name, err)
                    held = False
                now = loop.time()
                if held:
                    self._last_renew = now
                    if not self.is_leader:
                        log.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)
                        self.is_leader = True
                        self.lost.clear()
                        self.leading.set()
                elif self.is_leader and now - self._last_renew > self.lease_duration_s:
                    self._step_down("no renewal within the lease duration")
                elif self.is_leader:
                    pass  # a failed renewal within the lease: keep trying
                await asyncio.sleep(self.renew_interval_s if held else self.retry_interval_s)
        finally:
            if self.is_leader:
                self._step_down("shutting down")
                await self.release()

    def _step_down(self, why: str) -> None:
        log.info("%s gives up the lease %s/%s: %s", self.identity, self.namespace, self.name, why)
        self.is_leader = False
        self.leading.clear()
        self.lost.set()

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
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, err)
