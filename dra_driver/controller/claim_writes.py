"""The controller's reads and writes of claims, in its write threads; every answer is
assumed (:mod:`.assume`), so the next decision sees it before the watch does. Each
holds the :class:`~dra_driver.k8s.event_queue.WriteLane` from before it waits for a
thread to its answer: the Events give way to it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dra_driver.base.errors import ApiError, ApiNotFoundError
from dra_driver.controller.assume import AssumeCache
from dra_driver.controller.events import ClaimEventRecorder
from dra_driver.core import claim_shape
from dra_driver.k8s.event_queue import WriteLane
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.watch import MERGE_PATCH, send_json


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
        api_client: Any,
        writer: ThreadPoolExecutor,
        assumed: AssumeCache,
        events: ClaimEventRecorder,
        lane: WriteLane | None = None,
    ) -> None:
        self._api = api_client
        self.lane = lane if lane is not None else WriteLane()
        self._writer = writer
        self._assumed = assumed
        self._events = events
        self.writes = 0
        """Claim writes sent and answered (tests, the benchmark)."""

    async def _call(self, call: Callable[[], JsonObj]) -> JsonObj:
        """``call`` in one of the write threads."""
        with self.lane.held():
            return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    async def get(self, claim: JsonObj) -> JsonObj | None:
        """The claim as the API server has it now (after a conflict); None once gone."""
        try:
            fresh = await self._call(
                functools.partial(send_json, self._api, "GET", claim_path(claim))
            )
        except ApiNotFoundError:
            return None
        self._assumed.assume(fresh)
        return fresh

    async def patch(self, claim: JsonObj, patch: JsonObj, *, status: bool = False) -> JsonObj:
        """A JSON merge patch of the claim (or its ``/status``); the answer is assumed."""
        written = await self._call(
            functools.partial(
                send_json,
                self._api,
                "PATCH",
                claim_path(claim, status),
                patch,
                content_type=MERGE_PATCH,
            )
        )
        self.writes += 1
        self._assumed.assume(written)
        return written

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
            return claim
