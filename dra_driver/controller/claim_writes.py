"""The controller's reads and writes of claims; every answer is assumed
(:mod:`.assume`), so the next decision sees it before the watch does. Each holds the
:class:`~dra_driver.k8s.event_queue.WriteLane` from before it is sent to its answer:
the Events give way to it.

The patches are sent on the event loop (:mod:`dra_driver.k8s.transport`). A claim's
finalizer and allocation go one after the other when nothing makes the allocation
wait (:meth:`ClaimWriter.protect_and_allocate`). The watch shows the finalizer's
write before the loop has its answer; such an echo of a claim with writes in flight
is not queued (:meth:`ClaimWriter.echo`): a change by anyone else meanwhile makes
the guarded allocation write fail (409, and the claim is read again), and one after
it is newer than the allocation's answer, and the claim is queued then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.allocator import Allocation
from dra_driver.base.errors import ApiError, ApiNotFoundError
from dra_driver.controller.assume import AssumeCache
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.controller.informer import resource_version_of, uid_of
from dra_driver.controller.reconcile import (
    FINALIZER,
    PodConsumer,
    allocation_patch,
    finalizer_patch,
)
from dra_driver.controller.worker import ClaimSlot
from dra_driver.core import claim_shape
from dra_driver.k8s.event_queue import WriteLane
from dra_driver.k8s.events import now_rfc3339
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import MERGE_PATCH


def claim_path(claim: JsonObj, status: bool = False) -> str:
    ref = claim_shape.ref(claim)
    path = (
        f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace or 'default'}"
        f"/resourceclaims/{ref.name}"
    )
    return path + "/status" if status else path


class ClaimWriter:
    def __init__(
        self,
        http: ApiTransport,
        assumed: AssumeCache,
        events: ClaimEventRecorder,
        *,
        lane: WriteLane | None = None,
        missed: Callable[[str], None] = lambda uid: None,
    ) -> None:
        """``missed(uid)``: a change of the claim came while its writes were in flight
        and is newer than their answer (the caller queues the claim)."""
        self._http = http
        self.lane = lane if lane is not None else WriteLane()
        self._assumed = assumed
        self._events = events
        self._missed = missed
        self.writes = 0
        """Claim writes sent and answered (tests, the benchmark)."""
        self._writing: dict[str, int] = {}
        """Claim UID -> the newest resourceVersion the watch showed while both its
        writes were in flight (0: none yet)."""

    async def get(self, claim: JsonObj) -> JsonObj | None:
        """The claim as the API server has it now (after a conflict); None once gone."""
        try:
            with self.lane.held():
                fresh = await self._http.send_json("GET", claim_path(claim))
        except ApiNotFoundError:
            return None
        self._assumed.assume(fresh)
        return fresh

    async def patch(self, claim: JsonObj, patch: JsonObj, *, status: bool = False) -> JsonObj:
        """A JSON merge patch of the claim (or its ``/status``); the answer is assumed."""
        with self.lane.held():
            written = await self._send_patch(claim, patch, status)
        self.writes += 1
        self._assumed.assume(written)
        return written

    async def allocate(
        self,
        claim: JsonObj,
        allocation: Allocation,
        slot: ClaimSlot | None = None,
        *,
        reserve_for: PodConsumer | None = None,
    ) -> JsonObj:
        """The finalizer (unless there), then ``status.allocation`` (and ``reservedFor``
        = ``reserve_for``, in the same write) once the claim's turn came (``slot``:
        every larger claim started before it answered); both at once
        (:meth:`protect_and_allocate`) when the turn already came. The allocation's
        answer."""
        protect, what = finalizer_patch(claim), "the finalizer " + FINALIZER

        def status(base: JsonObj) -> JsonObj:
            return allocation_patch(
                base, allocation, now_rfc3339(), keep_shares=True, reserve_for=reserve_for
            )

        if protect is not None and (slot is None or slot.turn_passed()):
            return await self.protect_and_allocate(claim, protect, what, status)
        if protect is not None:
            claim = await self.patch_metadata(claim, protect, what)
        if slot is not None:
            await slot.wait_turn()
        return await self.patch(claim, status(claim), status=True)

    def echo(self, claim: JsonObj) -> bool:
        """The watch shows ``claim`` while its writes are in flight: True (not to be
        queued), and its version is kept to compare with their answer."""
        uid = uid_of(claim)
        seen = self._writing.get(uid)
        if seen is None:
            return False
        self._writing[uid] = max(seen, resource_version_of(claim))
        return True

    async def protect_and_allocate(
        self,
        claim: JsonObj,
        protect: JsonObj,
        what: str,
        allocation_of: Callable[[JsonObj], JsonObj],
    ) -> JsonObj:
        """The metadata patch ``protect`` (the finalizer, ``what``; refused for good as
        :meth:`patch_metadata` tells), then the ``/status`` patch ``allocation_of(the
        claim as the first answer shows it)``; both answers are assumed. Raises as
        :meth:`patch` does."""
        uid = uid_of(claim)
        self._writing[uid] = 0
        try:
            with self.lane.held():
                both = await self._both(claim, protect, allocation_of)
        finally:
            echoed = self._writing.pop(uid, 0)
        if both.protected is not None:
            self.writes += 1
            self._assumed.assume(both.protected)
        if both.refused is not None:
            self._refused(claim, what, both.refused)
        if both.allocated is None:
            assert both.error is not None
            raise both.error
        self.writes += 1
        self._assumed.assume(both.allocated)
        if echoed > resource_version_of(both.allocated):
            self._missed(uid)
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

    async def patch_metadata(self, claim: JsonObj, patch: JsonObj, what: str) -> JsonObj:
        """A metadata patch that the claim may refuse for good; then it goes on without.

        A claim created with opaque parameters in a form the API server does not
        write back itself (spaces, as the Python client's ``json.dumps`` sends them)
        refuses every JSON write to the main resource: the server compacts the
        stored bytes and sees the spec change (422 ``field is immutable``). Its
        ``/status`` can still be written, so the claim is still allocated, without
        the finalizer (this controller deallocates it when its pods are gone) and
        with a Warning Event that says how to recreate it.
        """
        try:
            return await self.patch(claim, patch)
        except ApiError as err:
            if err.status != 422:
                raise
            self._refused(claim, what, err)
            return claim

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
