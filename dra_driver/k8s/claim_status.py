"""Writes this driver's ``status.devices`` entries on a ResourceClaim by server-side apply.

One call, ``PATCH /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>/status``
with ``Content-Type: application/apply-patch+yaml``, ``fieldManager=<driver>/<node>``
and ``force=true``. The API server merges the list by its keys (driver, pool,
device, shareID) and tracks who set which entry, so:

* other drivers' entries (other field managers) are never touched;
* the entries we send are all of ours on that claim: an entry we sent before
  and leave out now is removed; an empty list removes all of them (unprepare);
* ``metadata.uid`` is sent too, so a claim deleted and recreated under the same
  name is refused (422), never written.

Failures, none of them raised to the caller:

* 404: the claim is gone (deleted before unprepare, say): nothing to do;
* 403: the ServiceAccount may not write claim status (RBAC, or the 1.36+
  granular authorization): logged once at WARNING with the rule to add, then
  no more writes until the plugin restarts;
* 409, 429, 5xx, no answer: retried with exponential backoff a few times;
* 422 and the rest: the write is refused for this claim (deallocated since,
  or denied by the ValidatingAdmissionPolicy): logged, dropped;
* an answer without our entries after we sent some means the API server drops
  ``status.devices`` (gate DRAResourceClaimDeviceStatus off): logged once and
  no more writes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dra_driver.base.errors import (
    ApiConflictError,
    ApiError,
    ApiNotFoundError,
    ApiUnavailableError,
)
from dra_driver.base.ids import ClaimRef
from dra_driver.core import claim_shape
from dra_driver.k8s.backoff import Backoff
from dra_driver.k8s.claims import claim_path
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport

log = logging.getLogger(__name__)

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
FIELD_MANAGER_LIMIT = 128
"""The API server refuses longer ``fieldManager`` values."""


class ApplyResult(enum.Enum):
    WRITTEN = "written"
    GONE = "gone"
    """404: the claim no longer exists."""
    REFUSED = "refused"
    """This claim's write was refused (422, 400, ...); others may still work."""
    FAILED = "failed"
    """Retries ran out (conflicts, server unavailable)."""
    DISABLED = "disabled"
    """Not attempted: writes were forbidden (403) or status.devices is dropped."""


def field_manager(driver_name: str, node_name: str) -> str:
    """``<driver>/<node>``: one manager per node, so nodes never remove each other's entries."""
    return f"{driver_name}/{node_name}"[:FIELD_MANAGER_LIMIT]


def claim_status_path(ref: ClaimRef) -> str:
    return f"{claim_path(ref)}/status"


def apply_body(ref: ClaimRef, entries: Sequence[JsonObj]) -> JsonObj:
    """The apply configuration: the claim's identity and our entries, nothing else."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
        "status": {"devices": list(entries)},
    }


def dropped_by_server(driver_name: str, sent: Sequence[JsonObj], answer: JsonObj) -> bool:
    """Whether the stored claim lacks every entry of ours that we just applied."""
    if not sent:
        return False
    stored = claim_shape.device_statuses(answer)
    return not any(isinstance(e, dict) and e.get("driver") == driver_name for e in stored)


def refusal_hint(err: ApiError) -> str:
    """Why an apply on an allocated claim can be refused for good: its allocation's
    opaque parameters were stored in another form than the API server writes them
    (apply re-encodes them and sees a change; fact sheet 5.3)."""
    if err.status == 422 and "status.allocation: Invalid value" in str(err):
        return (
            " (the claim's status.allocation holds opaque parameters in another form than "
            "the API server writes them, e.g. with spaces as the Python client's json.dumps "
            "sends them: no JSON client can write this claim's status; recreate the claim "
            "with kubectl)"
        )
    return ""


MAX_WRITES_IN_FLIGHT = 2
"""Status writes sent at once. A wave's writes wait for its answers, then all go
together; two at once wrote as fast as ten (when they ran in threads, GIL-bound) and
leave the CPU to a new wave that arrives while they run."""


class ClaimStatusWriter:
    """Applies our ``status.devices`` entries on claims; see the module docstring."""

    def __init__(
        self,
        http: ApiTransport,
        *,
        driver_name: str,
        node_name: str,
        attempts: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        timeout_s: float = 10.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        max_in_flight: int = MAX_WRITES_IN_FLIGHT,
    ) -> None:
        self._http = http
        self._max_in_flight = max_in_flight
        self._in_flight: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self.driver_name = driver_name
        self.field_manager = field_manager(driver_name, node_name)
        self._attempts = max(1, attempts)
        # No jitter: one writer per node, retrying one claim's write.
        self._backoff = Backoff(initial_s=backoff_s, max_s=max_backoff_s, jitter=0.0)
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._disabled_because = ""

    @property
    def enabled(self) -> bool:
        return not self._disabled_because

    async def apply(self, ref: ClaimRef, entries: Sequence[JsonObj]) -> ApplyResult:
        """Make ``entries`` all of our entries on the claim (empty: remove ours)."""
        for attempt in range(1, self._attempts + 1):
            if self._disabled_because:
                return ApplyResult.DISABLED
            result = await self._attempt(ref, entries, attempt)
            if result is not None:
                return result
            await self._sleep(self._backoff.delay(attempt))
        raise AssertionError("unreachable: the last attempt always has a result")

    async def _attempt(
        self, ref: ClaimRef, entries: Sequence[JsonObj], attempt: int
    ) -> ApplyResult | None:
        """One write; None: retry it."""
        try:
            async with self._slots():
                answer = await self._patch(ref, entries)
        except ApiError as err:
            return self._failed(ref, entries, err, attempt)
        if dropped_by_server(self.driver_name, entries, answer):
            self._dropped(ref)
            return ApplyResult.DISABLED
        return ApplyResult.WRITTEN

    def _slots(self) -> asyncio.Semaphore:
        """At most ``max_in_flight`` writes at once, in this event loop."""
        loop = asyncio.get_running_loop()
        if self._in_flight is None or self._in_flight[0] is not loop:
            self._in_flight = (loop, asyncio.Semaphore(self._max_in_flight))
        return self._in_flight[1]

    def _failed(
        self, ref: ClaimRef, entries: Sequence[JsonObj], err: ApiError, attempt: int
    ) -> ApplyResult | None:
        what = (
            f"writing {len(entries)} status.devices entries of"
            if entries
            else ("removing our status.devices entries from")
        )
        if isinstance(err, ApiNotFoundError):
            log.debug("claim %s is gone; %s it is not needed", ref, what)
            return ApplyResult.GONE
        if isinstance(err, ApiConflictError | ApiUnavailableError):
            if attempt < self._attempts:
                log.debug("%s claim %s: %s; retrying", what, ref, err)
                return None
            log.warning("%s claim %s failed after %d attempts: %s", what, ref, attempt, err)
            return ApplyResult.FAILED
        if err.status == 403:
            self._forbidden(ref, err)
            return ApplyResult.DISABLED
        # A removal refused (422) is usually a claim deallocated meanwhile: the
        # API server dropped its status.devices with the allocation.
        level = logging.WARNING if entries else logging.INFO
        log.log(level, "%s claim %s was refused: %s%s", what, ref, err, refusal_hint(err))
        return ApplyResult.REFUSED

    async def _patch(self, ref: ClaimRef, entries: Sequence[JsonObj]) -> JsonObj:
        path = claim_status_path(ref)
        return await self._http.send_json(
            "PATCH",
            path,
            apply_body(ref, entries),
            query=[("fieldManager", self.field_manager), ("force", "true")],
            what=f"APPLY {path}",
            content_type=APPLY_CONTENT_TYPE,
            timeout_s=self._timeout_s,
        )

    def _forbidden(self, ref: ClaimRef, err: ApiError) -> None:
        self._disabled_because = "forbidden"
        log.warning(
            "writing status.devices of claim %s is forbidden (%s); the plugin stops writing "
            "claim status until it restarts. Fix: grant the kubelet plugin's ServiceAccount "
            "patch on resourceclaims/status (apiGroups [resource.k8s.io]) and, on Kubernetes "
            "1.36+, associated-node:patch on resourceclaims/driver with resourceNames [%s] "
            "(Helm: kubeletPlugin.writeDeviceStatus=true); or turn claim status off with "
            "--claim-status=off (CLAIM_STATUS=off)",
            ref,
            err,
            self.driver_name,
        )

    def _dropped(self, ref: ClaimRef) -> None:
        self._disabled_because = "dropped"
        log.warning(
            "the API server dropped status.devices from claim %s (feature gate "
            "DRAResourceClaimDeviceStatus is off); the plugin stops writing claim status "
            "until it restarts. Enable the gate on kube-apiserver, or set --claim-status=off",
            ref,
        )
