"""List+watch one kind into an in-memory cache (one informer per kind).

The informer lists, then watches from the list's resourceVersion; a stream that
ends (server timeout, idle read timeout, cut connection) is resumed from the
last resourceVersion seen at once; a 410 ``Expired`` (history compacted) relists
and replaces the cache, and other errors retry from the last version, each after
a backoff as client-go's reflector takes one (:data:`REFLECTOR_BACKOFF`: 0.8 s
doubling to 30 s, with jitter; the count starts again once two minutes pass
without a failure). So a LIST or a watch that keeps failing, 410 included, is
retried ever more slowly, never in a tight loop.

With a :class:`~dra_driver.k8s.transport.ApiTransport` the list and the watch run on
the event loop (:mod:`dra_driver.k8s.watch_loop`) and each event is applied as it is
read. Without one (a configuration the loop transport does not speak) the blocking
client calls run in a thread of the informer's own: a watch holds its thread for up
to the read timeout, and six informers in ``asyncio.to_thread``'s default pool
(``min(32, CPUs + 4)`` threads: 6 on 2 CPUs) left the controller's writes and the
Lease waiting for a watch to time out; cache changes are then applied on the event
loop (``call_soon_threadsafe``, once for all the events read meanwhile), so readers
on the loop never see a half-applied event. ``on_change(type, new, old)``
runs on the loop after each change (``type``: ADDED, MODIFIED, DELETED, or SYNCED
after a (re)list with ``new``/``old`` empty).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dra_driver.base.errors import ApiError
from dra_driver.controller import slim
from dra_driver.controller.cache import ObjectCache, PackedCache, PlainCache
from dra_driver.core import claim_shape
from dra_driver.k8s.backoff import Backoff
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import (
    WatchCanceller,
    WatchExpiredError,
    list_in_chunks,
    watch_events,
)
from dra_driver.k8s.watch_loop import list_in_chunks as list_on_loop
from dra_driver.k8s.watch_loop import watch_events as watch_on_loop

log = logging.getLogger(__name__)

REFLECTOR_BACKOFF = Backoff(initial_s=0.8, max_s=30.0, factor=2.0, jitter=0.5)
"""client-go's reflector: 800 ms doubling to 30 s, jittered (ours symmetric, +-50 %)."""
BACKOFF_RESET_S = 120.0
"""A failure this long after the previous one starts the count again (client-go: 2 min)."""

ChangeHandler = Callable[[str, JsonObj, JsonObj], None]

LIST_CHUNK = 100
"""Objects per chunk of a list (client-go's reflector asks 500; a ResourceSlice of
eight GPUs with their MIG partitions is far larger than most objects)."""


@dataclass(frozen=True)
class KindPath:
    """Where a kind is listed and watched across the cluster, and how it is kept."""

    name: str
    path: str
    keeper: Callable[[], Callable[[JsonObj], JsonObj]] = slim.whole_keeper
    """Makes what the cache keeps of each object as decoded (:mod:`.slim`): one per
    informer, so what it shares between objects is that informer's own."""
    packed: bool = False
    """Kept as compact JSON, decoded when read: for a kind read whole and seldom (the
    ResourceSlices, read only when the allocator's state is built), whose decoded
    objects would be the largest part of the process's memory."""


CLAIMS = KindPath("resourceclaims", "/apis/resource.k8s.io/v1/resourceclaims", slim.claim_keeper)
SLICES = KindPath("resourceslices", "/apis/resource.k8s.io/v1/resourceslices", packed=True)
CLASSES = KindPath("deviceclasses", "/apis/resource.k8s.io/v1/deviceclasses")
NODES = KindPath("nodes", "/api/v1/nodes", slim.node_keeper)
PODS = KindPath("pods", "/api/v1/pods", slim.pod_keeper)
NAMESPACES = KindPath("namespaces", "/api/v1/namespaces", slim.namespace_keeper)
"""Read for the VRAM quota annotation (:mod:`dra_driver.allocator.quota`)."""


class Informer:
    """The cache of one kind, keyed by UID, kept current by list+watch."""

    def __init__(
        self,
        api_client: Any,
        kind: KindPath,
        *,
        on_change: ChangeHandler | None = None,
        read_timeout_s: float = 30.0,
        backoff: Backoff = REFLECTOR_BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        transport: ApiTransport | None = None,
    ) -> None:
        """``transport``: list and watch on the loop (None: in a thread, through
        ``api_client``'s own transport)."""
        self.kind = kind
        self._keep = kind.keeper()
        self._api = api_client
        self._transport = transport
        self.on_change = on_change
        """Told of each change (None: no one); set before :meth:`run` (the controller's
        change router subscribes itself, :meth:`~.routing.ChangeRouter.listen`)."""
        self._read_timeout_s = read_timeout_s
        self._backoff = backoff
        self._sleep = sleep
        self._failures = 0
        self._last_failure = -BACKOFF_RESET_S
        self.objects: ObjectCache = self._new_cache()
        self.synced = asyncio.Event()
        self.relists = 0
        self._version = ""
        self._canceller = WatchCanceller()
        self._arrived: deque[tuple[str, JsonObj]] = deque()
        """Watch events read by the watch thread, not yet applied on the loop."""
        self._drain_due = False
        """A :meth:`_drain` is scheduled on the loop and has not started."""

    def get(self, uid: str) -> JsonObj | None:
        return self.objects.get(uid)

    def values(self) -> list[JsonObj]:
        return self.objects.values()

    def each(self) -> Iterator[JsonObj]:
        """One at a time: what the allocator's state is built from (a packed kind is
        never decoded whole at once)."""
        return self.objects.each()

    def uids(self) -> set[str]:
        return self.objects.uids()

    async def run(self) -> None:
        """List+watch until cancelled."""
        if self._transport is not None:
            await self._list_and_watch(self._list_on_loop, self._watch_on_loop)
            return
        loop = asyncio.get_running_loop()
        thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"informer-{self.kind.name}")

        def listed() -> Awaitable[tuple[ObjectCache, str]]:
            return loop.run_in_executor(thread, self._list)

        def watched() -> Awaitable[None]:
            return loop.run_in_executor(thread, self._watch_once, loop)

        try:
            await self._list_and_watch(listed, watched)
        finally:
            self._canceller.cancel()  # the blocked watch returns now, not at its read timeout
            thread.shutdown(wait=False)

    async def _list_and_watch(
        self,
        listed: Callable[[], Awaitable[tuple[ObjectCache, str]]],
        watched: Callable[[], Awaitable[None]],
    ) -> None:
        while True:
            try:
                if not self._version:
                    await self._relist(listed)
                await watched()
                continue  # a watch that ended: resumed from the last version at once
            except ApiError as err:
                failure = err
            delay = self._next_delay()
            if isinstance(failure, WatchExpiredError) or failure.status == 410:
                # History compacted (an event, or Gone as an HTTP status): relist.
                self._version = ""
                log.info("%s: %s; relisting in %.1fs", self.kind.name, failure, delay)
            else:
                log.warning("%s: %s; retrying in %.1fs", self.kind.name, failure, delay)
            await self._sleep(delay)

    def _next_delay(self) -> float:
        """The backoff before the next try, counting this failure."""
        now = asyncio.get_running_loop().time()
        if now - self._last_failure > BACKOFF_RESET_S:
            self._failures = 0
        self._failures += 1
        self._last_failure = now
        return self._backoff.delay(self._failures)

    async def _relist(self, listed: Callable[[], Awaitable[tuple[ObjectCache, str]]]) -> None:
        objects, version = await listed()
        self.objects = objects
        self._version = version
        self.relists += 1
        self.synced.set()
        if self.on_change is not None:
            self.on_change("SYNCED", {}, {})

    def _new_cache(self) -> ObjectCache:
        return PackedCache() if self.kind.packed else PlainCache()

    def _list(self) -> tuple[ObjectCache, str]:
        """The list, kept as the cache keeps it (in the informer's thread, off the loop),
        :data:`LIST_CHUNK` objects at a time."""
        objects, keep = self._new_cache(), self._keep

        def add(obj: JsonObj) -> None:
            objects.put(claim_shape.key(obj), keep(obj))

        version = list_in_chunks(self._api, self.kind.path, LIST_CHUNK, add)
        return objects, version

    async def _list_on_loop(self) -> tuple[ObjectCache, str]:
        assert self._transport is not None
        objects, keep = self._new_cache(), self._keep

        def add(obj: JsonObj) -> None:
            objects.put(claim_shape.key(obj), keep(obj))

        version = await list_on_loop(self._transport, self.kind.path, LIST_CHUNK, add)
        return objects, version

    async def _watch_on_loop(self) -> None:
        assert self._transport is not None
        await watch_on_loop(
            self._transport,
            self.kind.path,
            self._version,
            self._arrive_on_loop,
            read_timeout_s=self._read_timeout_s,
        )

    def _arrive_on_loop(self, etype: str, obj: JsonObj) -> None:
        """On the loop: one event read, applied at once."""
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._version = str(version)
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            self._apply(etype, self._keep(obj))

    def _watch_once(self, loop: asyncio.AbstractEventLoop) -> None:
        watch_events(
            self._api,
            self.kind.path,
            self._version,
            functools.partial(self._arrive, loop),
            read_timeout_s=self._read_timeout_s,
            canceller=self._canceller,
        )

    def _arrive(self, loop: asyncio.AbstractEventLoop, etype: str, obj: JsonObj) -> None:
        """In the watch thread: one event read, handed to the loop."""
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._version = str(version)
        if etype not in ("ADDED", "MODIFIED", "DELETED"):
            return
        self._arrived.append((etype, self._keep(obj)))
        if self._drain_due:
            return  # the loop has a drain to run: it takes this one too
        self._drain_due = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed under us: shutting down
            self._canceller.cancel()

    def _drain(self) -> None:
        """On the loop: every event arrived so far, in order. One wake of the loop for
        all the events its watch thread read meanwhile (a burst's come many at a time)."""
        self._drain_due = False  # first: an event arriving from now on schedules a drain
        arrived = self._arrived
        while arrived:
            etype, obj = arrived.popleft()
            self._apply(etype, obj)

    def _apply(self, etype: str, obj: JsonObj) -> None:
        uid = claim_shape.key(obj)
        old = self.objects.get(uid) or {}
        if etype == "DELETED":
            self.objects.pop(uid)
        else:
            if old and claim_shape.resource_version(old) > claim_shape.resource_version(obj):
                return  # a relist already brought a newer copy
            self.objects.put(uid, obj)
        if self.on_change is not None:
            self.on_change(etype, obj, old)
