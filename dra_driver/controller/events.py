"""Events on claims (core/v1 ``Event``), rate-limited per claim, reason and message.

The same (claim, reason, message) is written at most once per ``interval_s``
(a claim that does not fit is retried often; its Event is not). A failed
Event write is logged and dropped: Events are advice, never a reason to stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from dra_driver.controller.reconcile import now_rfc3339
from dra_driver.core.errors import ApiError
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.watch import send_json

log = logging.getLogger(__name__)

COMPONENT = "fractional-gpu-dra-controller"


def event_object(claim: JsonObj, reason: str, message: str, event_type: str, stamp: str) -> JsonObj:
    """The Event JSON (pure)."""
    meta = claim.get("metadata") or {}
    name = str(meta.get("name", "claim"))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{name}.{uuid.uuid4().hex[:16]}",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "name": name,
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "reason": reason,
        "message": message[:1024],
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    def __init__(
        self,
        api_client: Any,
        *,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api_client
        self._interval_s = interval_s
        self._clock = clock
        self._last: dict[tuple[str, str, str], float] = {}

    def should_send(self, claim: JsonObj, reason: str, message: str) -> bool:
        key = (str((claim.get("metadata") or {}).get("uid", "")), reason, message)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            return False
        self._last[key] = now
        if len(self._last) > 10_000:  # forget the oldest half
            for k in sorted(self._last, key=self._last.__getitem__)[:5_000]:
                del self._last[k]
        return True

    async def record(
        self, claim: JsonObj, reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        if not self.should_send(claim, reason, message):
            return
        event = event_object(claim, reason, message, event_type, now_rfc3339())
        namespace = event["metadata"]["namespace"]
        try:
            await asyncio.to_thread(
                send_json, self._api, "POST", f"/api/v1/namespaces/{namespace}/events", event
            )
        except ApiError as err:
            log.warning("could not write Event %s on claim %s: %s", reason, namespace, err)
