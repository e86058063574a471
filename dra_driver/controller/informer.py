"""List+watch one kind into an in-memory cache (one informer per kind).

The informer lists, then watches from the list's resourceVersion; a stream that
ends (server timeout, idle read timeout, cut connection) is resumed from the
last resourceVersion seen at once; a 410 ``Expired`` (history compacted) relists
and replaces the cache, and other errors retry from the last version, each after
a backoff as client-go's reflector takes one (:data:`REFLECTOR_BACKOFF`: 0.8 s
doubling to 30 s, with jitter; the count starts again once two minutes pass
without a failure). So a LIST or a watch that keeps failing, 410 included, is
retried ever more slowly, never in a tight loop.

The list and the watch run on the event loop, through the process's
:class:`~dra_driver.k8s.transport.ApiTransport` (:mod:`dra_driver.k8s.watch_loop`),
and each event is applied as it is read, so readers on the loop never see a
half-applied event; no thread reads the API server. ``on_change(type, new, old)``
runs on the loop after each change (``type``: ADDED, MODIFIED, DELETED, or SYNCED
after a (re)list with ``new``/``old`` empty).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from dra_driver.base.errors import ApiError
from dra_driver.controller import slim
from dra_driver.controller.cache import ObjectCache, PackedCache, PlainCache
from dra_driver.core import claim_shape
from dra_driver.k8s.backoff import Backoff
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import WatchExpiredError
from dra_driver.k8s.watch_loop import list_in_chunks, watch_events

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
        transport: ApiTransport,
        kind: KindPath,
        *,
        on_change: ChangeHandler | None = None,
        read_timeout_s: float = 30.0,
        backoff: Backoff = REFLECTOR_BACKOFF,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.kind = kind
        self._keep = kind.keeper()
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
        while True:
            try:
                if not self._version:
                    await self._relist()
                await self._watch()
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

    async def _relist(self) -> None:
        objects, version = await self._list()
        self.objects = objects
        self._version = version
        self.relists += 1
        self.synced.set()
        if self.on_change is not None:
            self.on_change("SYNCED", {}, {})

    def _new_cache(self) -> ObjectCache:
        return PackedCache() if self.kind.packed else PlainCache()

    async def _list(self) -> tuple[ObjectCache, str]:
        """The list, kept as the cache keeps it, :data:`LIST_CHUNK` objects at a time."""
        objects, keep = self._new_cache(), self._keep

        def add(obj: JsonObj) -> None:
            objects.put(claim_shape.key(obj), keep(obj))

        version = await list_in_chunks(self._transport, self.kind.path, LIST_CHUNK, add)
        return objects, version

    async def _watch(self) -> None:
        await watch_events(
            self._transport,
            self.kind.path,
            self._version,
            self._arrive,
            read_timeout_s=self._read_timeout_s,
        )

    def _arrive(self, etype: str, obj: JsonObj) -> None:
        """On the loop: one event read, applied at once."""
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._version = str(version)
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            self._apply(etype, self._keep(obj))

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
