"""Events on claims from the controller: :mod:`dra_driver.k8s.events` bound to claim JSON.

The same (claim, reason, message) is written at most once per ``interval_s``
(a claim that does not fit is retried often; its Event is not). A failed
Event write is logged and dropped: Events are advice, never a reason to stop.

The controller queues its Events (``queued``): :meth:`ClaimEventRecorder.post`
returns at once, and one sender (:meth:`ClaimEventRecorder.run`, on the event loop)
writes them after the claim writes in flight (:mod:`dra_driver.k8s.event_queue`:
the allocations pods wait for land first, their Events after). :meth:`record`
awaits the write instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dra_driver.k8s import event_queue
from dra_driver.k8s import events as k8s_events
from dra_driver.k8s.event_queue import EventQueue, WriteLane
from dra_driver.k8s.events import InvolvedObject
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport

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
        http: ApiTransport,
        *,
        interval_s: float = k8s_events.DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        lane: WriteLane | None = None,
        queued: bool = False,
        depth: int = event_queue.DEFAULT_DEPTH,
        on_drop: Callable[[], None] = lambda: None,
    ) -> None:
        """``queued``: :meth:`post` queues for one sender, giving way to ``lane``'s
        writes; otherwise each write is a task of its own. Both on the loop."""
        self._events = k8s_events.EventRecorder(
            http, component=COMPONENT, interval_s=interval_s, clock=clock
        )
        self.queue: EventQueue | None = None
        if queued:
            self.queue = EventQueue(self._events, depth=depth, lane=lane, on_drop=on_drop)

    def should_send(self, claim: JsonObj, reason: str, message: str) -> bool:
        return self._events.should_send(InvolvedObject.claim_json(claim), reason, message)

    async def record(
        self, claim: JsonObj, reason: str, message: str, event_type: str = "Normal"
    ) -> None:
        """Write the Event now (unless rate-limited)."""
        await self._events.record(InvolvedObject.claim_json(claim), reason, message, event_type)

    def post(self, claim: JsonObj, reason: str, message: str, event_type: str = "Normal") -> None:
        """The Event, without waiting: queued (``queued``), else its write scheduled as a
        task (:meth:`~dra_driver.k8s.events.EventRecorder.emit`). Call on the loop."""
        involved = InvolvedObject.claim_json(claim)
        if self.queue is not None:
            self.queue.post(involved, reason, message, event_type)
        else:
            self._events.emit(involved, reason, message, event_type)

    async def run(self) -> None:
        """The queue's sender, until cancelled (``queued`` only)."""
        if self.queue is None:
            raise RuntimeError("run() is the sender of a queued recorder; this one is not")
        await self.queue.run()

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Up to ``timeout_s`` for the Events not yet written; True when none is left."""
        if self.queue is not None:
            return await self.queue.flush(timeout_s)
        return await self._events.flush(timeout_s)
