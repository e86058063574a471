"""The controller's reads and writes of claims. Each write moves the claim's in-flight
record (:mod:`.inflight`): ``WRITING`` before it is sent, ``WRITTEN`` with its answer
(laid over the informer's copy, so the next decision sees it before the watch does),
``FAILED`` when it is refused or abandoned. Each holds the
:class:`~dra_driver.k8s.event_queue.WriteLane` from before it is sent to its answer:
the Events give way to it.

The patches are sent on the event loop (:mod:`dra_driver.k8s.transport`). A claim's
finalizer and allocation go one after the other when nothing makes the allocation
wait (:meth:`ClaimWriter.allocate`), as one write of the in-flight record. The watch
shows the finalizer's write before the loop has its answer; such an echo of a claim
``WRITING`` is not queued: a change by anyone else meanwhile makes the guarded
allocation write fail (409, and the claim is read again), and one after it is newer
than the allocation's answer, and the claim is queued then.

This module knows neither the worker nor the informer (an import contract): a claim's
turn comes as :class:`AllocationTurn`, and what it reads of the caches comes through
:class:`~.inflight.InFlight`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from dra_driver.allocator import Allocation
from dra_driver.base.errors import ApiError, ApiNotFoundError
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.controller.inflight import InFlight
from dra_driver.controller.reconcile import (
    FINALIZER,
    PodConsumer,
    allocation_patch,
    finalizer_patch,
)
from dra_driver.core import claim_shape
from dra_driver.k8s.claims import claim_path as claim_url
from dra_driver.k8s.event_queue import WriteLane
from dra_driver.k8s.events import now_rfc3339
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import MERGE_PATCH


def claim_path(claim: JsonObj, status: bool = False) -> str:
    """The claim's URL (:func:`dra_driver.k8s.claims.claim_path`, its names quoted), or
    its ``/status``; a claim without a namespace (built by a test) is in ``default``."""
    ref = claim_shape.ref(claim)
    path = claim_url(replace(ref, namespace=ref.namespace or "default"))
    return path + "/status" if status else path


class AllocationTurn(Protocol):
    """A claim's place in its batch (:class:`~.worker.ClaimSlot`): its allocation is
    written once every larger claim started before it has had its own answered."""

    def turn_passed(self) -> bool: ...

    async def wait_turn(self) -> None: ...


class ClaimWriter:
    def __init__(
        self,
        http: ApiTransport,
        inflight: InFlight,
        events: ClaimEventRecorder,
        *,
        lane: WriteLane | None = None,
        missed: Callable[[str], None] = lambda uid: None,
    ) -> None:
        """``missed(uid)``: a change of the claim came while its writes were in flight
        and is newer than their answer (the caller queues the claim)."""
        self._http = http
        self.lane = lane if lane is not None else WriteLane()
        self._inflight = inflight
        self._events = events
        self._missed = missed
        self.writes = 0
        """Claim writes sent and answered (tests, the benchmark)."""

    async def get(self, claim: JsonObj) -> JsonObj | None:
        """The claim as the API server has it now (after a conflict); None once gone."""
        try:
            with self.lane.held():
                fresh = await self._http.send_json("GET", claim_path(claim))
        except ApiNotFoundError:
            return None
        self._inflight.refreshed(fresh)
        return fresh

    async def patch(self, claim: JsonObj, patch: JsonObj, *, status: bool = False) -> JsonObj:
        """A JSON merge patch of the claim (or its ``/status``), as one write of its
        in-flight record; the answer. Raises what the API server answered."""
        uid = claim_shape.key(claim)
        self._inflight.writing(uid)
        try:
            written = await self._patch(claim, patch, status)
        except BaseException as err:
            self._inflight.failed(uid, err)
            raise
        self._written(written)
        return written

    async def patch_metadata(self, claim: JsonObj, patch: JsonObj, what: str) -> JsonObj:
        """:meth:`patch` of the metadata, which the claim may refuse for good
        (:meth:`_refusable`); then it goes on without, and the claim is returned."""
        uid = claim_shape.key(claim)
        self._inflight.writing(uid)
        try:
            written = await self._refusable(claim, patch, what)
        except BaseException as err:
            self._inflight.failed(uid, err)
            raise
        if written is None:
            self._inflight.failed(uid, "refused for good")
            return claim
        self._written(written)
        return written

    async def allocate(
        self,
        claim: JsonObj,
        allocation: Allocation,
        turn: AllocationTurn | None = None,
        *,
        node: str = "",
        reserve_for: PodConsumer | None = None,
    ) -> JsonObj:
        """The finalizer (unless there), then ``status.allocation`` (and ``reservedFor``
        = ``reserve_for``, in the same write) once the claim's turn came (``turn``:
        every larger claim started before it answered); both in one hand-off
        (:meth:`_protect_and_allocate`) when the turn already came. One write of the
        claim's in-flight record (decided on ``node``); the allocation's answer."""
        protect, what = finalizer_patch(claim), "the finalizer " + FINALIZER

        def status(base: JsonObj) -> JsonObj:
            return allocation_patch(
                base, allocation, now_rfc3339(), keep_shares=True, reserve_for=reserve_for
            )

        uid = claim_shape.key(claim)
        self._inflight.writing(uid)
        try:
            if protect is not None and (turn is None or turn.turn_passed()):
                written = await self._protect_and_allocate(claim, protect, what, status)
            else:
                if protect is not None:
                    protected = await self._refusable(claim, protect, what)
                    claim = protected if protected is not None else claim
                if turn is not None:
                    await turn.wait_turn()
                written = await self._patch(claim, status(claim), True)
        except BaseException as err:
            self._inflight.failed(uid, err)
            raise
        self._written(written, allocated_on=node)
        return written

    def _written(self, written: JsonObj, *, allocated_on: str | None = None) -> None:
        if self._inflight.written(written, allocated_on=allocated_on):
            self._missed(claim_shape.key(written))

    async def _patch(self, claim: JsonObj, patch: JsonObj, status: bool) -> JsonObj:
        """One patch sent and answered, the answer laid over (the claim ``WRITING``)."""
        with self.lane.held():
            written = await self._send_patch(claim, patch, status)
        self.writes += 1
        self._inflight.answered(written)
        return written

    async def _protect_and_allocate(
        self,
        claim: JsonObj,
        protect: JsonObj,
        what: str,
        allocation_of: Callable[[JsonObj], JsonObj],
    ) -> JsonObj:
        """The metadata patch ``protect`` (the finalizer, ``what``; refused for good as
        :meth:`_refusable` tells), then the ``/status`` patch ``allocation_of(the
        claim as the first answer shows it)``, in one hold of the write lane; each
        answer laid over. Raises as :meth:`patch` does, after the first answer."""
        with self.lane.held():
            both = await self._both(claim, protect, allocation_of)
        if both.protected is not None:
            self.writes += 1
            self._inflight.answered(both.protected)
        if both.refused is not None:
            self._refused(claim, what, both.refused)
        if both.allocated is None:
            assert both.error is not None
            raise both.error
        self.writes += 1
        self._inflight.answered(both.allocated)
        return both.allocated

    async def _both(
        self, claim: JsonObj, protect: JsonObj, allocation_of: Callable[[JsonObj], JsonObj]
    ) -> _Both:
        """Both writes, and what became of each."""
        both = _Both()
        try:
            both.protected = await self._send_patch(claim, protect, False)
        except ApiError as err:
            if err.status != 422:
                raise  # nothing written
            both.refused = err
        base = both.protected if both.protected is not None else claim
        try:
            both.allocated = await self._send_patch(base, allocation_of(base), True)
        except Exception as err:  # raised by the caller, after the first answer is assumed
            both.error = err
        return both

    async def _send_patch(self, claim: JsonObj, patch: JsonObj, status: bool) -> JsonObj:
        """A JSON merge patch of the claim (or its ``/status``), on the loop."""
        path = claim_path(claim, status)
        return await self._http.send_json("PATCH", path, patch, content_type=MERGE_PATCH)

    async def _refusable(self, claim: JsonObj, patch: JsonObj, what: str) -> JsonObj | None:
        """A metadata patch that the claim may refuse for good: its answer, or None.

        A claim created with opaque parameters in a form the API server does not
        write back itself (spaces, as the Python client's ``json.dumps`` sends them)
        refuses every JSON write to the main resource: the server compacts the
        stored bytes and sees the spec change (422 ``field is immutable``). Its
        ``/status`` can still be written, so the claim is still allocated, without
        the finalizer (this controller deallocates it when its pods are gone) and
        with a Warning Event that says how to recreate it.
        """
        try:
            return await self._patch(claim, patch, False)
        except ApiError as err:
            if err.status != 422:
                raise
            self._refused(claim, what, err)
            return None

    def _refused(self, claim: JsonObj, what: str, err: ApiError) -> None:
        self._events.post(
            claim,
            "MetadataWriteRefused",
            f"could not write {what}: {err}. The API server refuses any JSON write of "
            "this claim's metadata when its opaque parameters were sent in another form "
            "than the server's own (e.g. with spaces, as the Python client's json.dumps "
            "writes them); the claim is allocated without it. Recreate the claim with "
            "kubectl (compact JSON) to make it writable",
            "Warning",
        )


@dataclass
class _Both:
    """What became of a claim's two writes in one hand-off."""

    protected: JsonObj | None = None
    """The metadata patch's answer; None: refused for good (``refused``) or not sent."""
    refused: ApiError | None = None
    allocated: JsonObj | None = None
    """The ``/status`` patch's answer; None: it failed with ``error``."""
    error: Exception | None = None
