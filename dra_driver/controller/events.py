"""Events on claims from the controller: :mod:`dra_driver.k8s.events` bound to claim JSON.

The same (claim, reason, message) is written at most once per ``interval_s``
(a claim that does not fit is retried often; its Event is not). A failed
Event write is logged and dropped: Events are advice, never a reason to stop.
:meth:`ClaimEventRecorder.record` awaits the write: the controller calls it from
its per-claim worker, which may wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from dra_driver.k8s import events as k8s_events
from dra_driver.k8s.events import InvolvedObject
from dra_driver.k8s.rest import JsonObj

COMPONENT = "fractional-gpu-dra-controller"


def event_object(claim: JsonObj, reason: str, message: str, event_type: str, stamp: str) -> JsonObj:
    """The Event JSON on ``claim`` (pure but for the generated name)."""
    return k8s_events.event_object(
        InvolvedObject.claim_json(claim), reason, message, event_type, stamp, component=COMPONENT
    )


class ClaimEventRecorder:
    """The controller's Events on claims (:class:`~dra_driver.k8s.events.EventRecorder`)."""

    def __init__(
        self,
        api_client: Any,
        *,
        interval_s: float = k8s_events.DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        executor: Executor | None = None,
    ) -> None:
        """``executor``: the controller's write threads, so that a claim's Event is not
        queued behind the few threads of ``asyncio.to_thread``."""
        self._events = k8s_events.EventRecorder(
            api_client, component=COMPONENT, interval_s=interval_s, clock=clock, executor=executor
        )

    def should_send(self, claim: JsonObj, reason: str, message: str) -> bool:
        return self._events.should_send(InvolvedObject.claim_json(claim), reason, message)

    async def record(
        self, claim: JsonObj, reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        await self._events.record(InvolvedObject.claim_json(claim), reason, message, event_type)
