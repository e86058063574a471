"""Kubernetes Events (core/v1 ``Event``) on any object, rate-limited, optionally aggregated.

One :class:`EventRecorder` per process; the controller records on claims, the
kubelet plugin on claims and on its Node. Rules:

* **Rate limit**: the same (object, reason, message) is written at most once
  per ``interval_s``; a claim the kubelet retries every few seconds gets one
  Event, not hundreds.
* **Aggregation** (``aggregate=True``): a repeat after the interval patches
  the Event written before (``count`` + 1, ``lastTimestamp``), as client-go's
  recorder does, instead of creating another object; when that Event has
  expired (404) a new one is created. Needs ``patch`` on ``events``; a 403 on
  the patch turns aggregation off (logged once) and creates instead.
* **Never a reason to stop**: a failed write is logged and dropped. A 403 on
  create means the ServiceAccount may not write Events at all: logged once at
  WARNING with the RBAC rule to add, then no more Events until restart.
* **Never blocking**: :meth:`EventRecorder.emit` schedules the write as a task
  and returns (at most ``max_in_flight`` writes at once; more are dropped);
  :meth:`EventRecorder.record` awaits the write. :meth:`EventRecorder.close` waits
  for scheduled writes, then cancels what is left. The controller queues its Events
  instead (:mod:`dra_driver.k8s.event_queue`: one sender, behind its claim writes).

Events are the legacy core/v1 kind (``firstTimestamp``/``lastTimestamp``/
``count``, no ``eventTime``): every supported release serves it, and the API
server validates it the legacy way, so a cluster-scoped object's Events live in
namespace ``default`` with an empty ``involvedObject.namespace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.base.errors import ApiError, ApiNotFoundError
from dra_driver.base.ids import ClaimRef
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import MERGE_PATCH

log = logging.getLogger(__name__)

MESSAGE_LIMIT = 1024
"""The API server's limit on an Event's message (``note``)."""
REASON_LIMIT = 128
INSTANCE_LIMIT = 128
"""``reportingInstance`` is at most 128 characters."""
NAME_LIMIT = 253
CLUSTER_EVENTS_NAMESPACE = "default"
"""Where Events about cluster-scoped objects (Nodes) go."""
DEFAULT_INTERVAL_S = 60.0
DEFAULT_MAX_IN_FLIGHT = 64
_MEMORY = 10_000
"""Remembered (object, reason, message) keys; the oldest half is forgotten beyond this."""

NORMAL = "Normal"
WARNING = "Warning"


_STAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@functools.lru_cache(maxsize=4)
def _stamp_of(second: int) -> str:
    """The text of one second; cached, since the controller stamps two writes per claim,
    many a second (lru_cache is safe from several threads; no module state of ours)."""
    return time.strftime(_STAMP_FORMAT, time.gmtime(second))


def now_rfc3339(now: datetime.datetime | None = None) -> str:
    """A timestamp as the API writes ``metav1.Time`` (seconds, UTC, ``Z``)."""
    if now is not None:
        return now.strftime(_STAMP_FORMAT)
    return _stamp_of(int(time.time()))


@dataclass(frozen=True)
class InvolvedObject:
    """What an Event is about (``involvedObject``)."""

    api_version: str
    kind: str
    name: str
    namespace: str = ""
    """Empty for cluster-scoped objects."""
    uid: str = ""
    resource_version: str = ""

    @classmethod
    def claim(cls, ref: ClaimRef) -> InvolvedObject:
        return cls("resource.k8s.io/v1", "ResourceClaim", ref.name, ref.namespace, ref.uid)

    @classmethod
    def claim_json(cls, claim: JsonObj) -> InvolvedObject:
        """A ResourceClaim as read from the API (name, namespace, uid, resourceVersion)."""
        meta = claim.get("metadata") or {}
        return cls(
            "resource.k8s.io/v1",
            "ResourceClaim",
            str(meta.get("name", "claim")),
            str(meta.get("namespace", "default")),
            str(meta.get("uid", "")),
            str(meta.get("resourceVersion", "")),
        )

    @classmethod
    def node(cls, name: str) -> InvolvedObject:
        """A Node; its uid is its name, as the kubelet's own Node Events have it."""
        return cls("v1", "Node", name, "", name)

    @property
    def event_namespace(self) -> str:
        return self.namespace or CLUSTER_EVENTS_NAMESPACE

    @property
    def key(self) -> str:
        """Identity for rate limiting: the uid, else kind/namespace/name."""
        return self.uid or f"{self.kind}/{self.namespace}/{self.name}"

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


def event_name(involved: InvolvedObject) -> str:
    """``<object name>.<16 hex>``, cut to stay a valid object name."""
    suffix = uuid.uuid4().hex[:16]
    return f"{involved.name[: NAME_LIMIT - len(suffix) - 1]}.{suffix}"


def event_object(
    involved: InvolvedObject,
    reason: str,
    message: str,
    event_type: str,
    stamp: str,
    *,
    component: str,
    instance: str = "",
    name: str | None = None,
) -> JsonObj:
    """The Event JSON (pure but for the generated name when ``name`` is None).

    ``component``: who reports (``source.component``, ``reportingComponent``);
    ``instance``: which one of them (``reportingInstance``, and
    ``source.host`` as the kubelet sets it: the node name).
    """
    ref: JsonObj = {"apiVersion": involved.api_version, "kind": involved.kind}
    ref["name"] = involved.name
    if involved.namespace:
        ref["namespace"] = involved.namespace
    if involved.uid:
        ref["uid"] = involved.uid
    if involved.resource_version:
        ref["resourceVersion"] = involved.resource_version
    source: JsonObj = {"component": component}
    event: JsonObj = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": name or event_name(involved),
            "namespace": involved.event_namespace,
        },
        "involvedObject": ref,
        "reason": reason[:REASON_LIMIT],
        "message": message[:MESSAGE_LIMIT],
        "type": event_type,
        "source": source,
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if instance:
        source["host"] = instance
        event["reportingInstance"] = instance[:INSTANCE_LIMIT]
    return event


@dataclass
class _Written:
    """An Event we wrote: where, and how often it has been counted."""

    name: str
    namespace: str
    count: int


_Key = tuple[str, str, str]
"""(object key, reason, message)"""


class EventRecorder:
    """Writes Events on the event loop (``http``); see the module docstring."""

    def __init__(
        self,
        http: ApiTransport,
        *,
        component: str,
        instance: str = "",
        interval_s: float = DEFAULT_INTERVAL_S,
        aggregate: bool = False,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self.component = component
        self.instance = instance
        self.interval_s = interval_s
        self._aggregate = aggregate
        self._max_in_flight = max_in_flight
        self._clock = clock
        self._last: dict[_Key, float] = {}
        self._written: dict[_Key, _Written] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._forbidden = False

    @property
    def enabled(self) -> bool:
        """False once the API refused us Events (403): nothing more is written."""
        return not self._forbidden

    def should_send(self, involved: InvolvedObject, reason: str, message: str) -> bool:
        """Whether this Event is due (and, if so, remember it as sent now)."""
        key = (involved.key, reason, message)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        if len(self._last) > _MEMORY:
            for old in sorted(self._last, key=self._last.__getitem__)[: _MEMORY // 2]:
                del self._last[old]
                self._written.pop(old, None)
        return True

    async def record(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str = NORMAL
    ) -> None:
        """Write the Event now (unless rate-limited); failures are logged, never raised."""
        if self._forbidden or not self.should_send(involved, reason, message):
            return
        await self._write(involved, reason, message, event_type)

    async def send(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str = NORMAL
    ) -> None:
        """Write an Event already let through :meth:`should_send` (a queue's sender,
        :mod:`dra_driver.k8s.event_queue`); failures are logged, never raised."""
        if not self._forbidden:
            await self._write(involved, reason, message, event_type)

    def emit(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str = NORMAL
    ) -> None:
        """Schedule the Event's write and return at once; call on the event loop."""
        if self._forbidden:
            return
        if len(self._tasks) >= self._max_in_flight:
            log.debug(
                "dropping Event %s on %s: %d writes in flight", reason, involved, len(self._tasks)
            )
            return
        if not self.should_send(involved, reason, message):
            return
        task = asyncio.get_running_loop().create_task(
            self._write(involved, reason, message, event_type), name=f"event-{reason}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait up to ``timeout_s`` for scheduled writes; True when none is left."""
        tasks = set(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        return not self._tasks

    async def close(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` for scheduled writes; cancel the rest."""
        if await self.flush(timeout_s):
            return
        pending = set(self._tasks)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        log.warning("dropped %d Event write(s) still running at shutdown", len(pending))

    # --- writing ---------------------------------------------------------------------

    async def _write(
        self, involved: InvolvedObject, reason: str, message: str, event_type: str
    ) -> None:
        key = (involved.key, reason, message)
        stamp = now_rfc3339()
        try:
            prior = self._written.get(key) if self._aggregate else None
            if prior is not None and await self._counted(prior, stamp, message):
                return
            event = event_object(
                involved,
                reason,
                message,
                event_type,
                stamp,
                component=self.component,
                instance=self.instance,
            )
            namespace = involved.event_namespace
            await self._http.send_json("POST", f"/api/v1/namespaces/{namespace}/events", event)
            self._written[key] = _Written(event["metadata"]["name"], namespace, 1)
        except ApiError as err:
            if err.status == 403:
                self._refused(err)
            else:
                log.warning("could not write Event %s on %s: %s", reason, involved, err)
        except Exception:  # a bug here must not end the caller's task or the plugin
            log.exception("writing Event %s on %s failed", reason, involved)

    async def _counted(self, prior: _Written, stamp: str, message: str) -> bool:
        """Count a repeat on the Event written before; False when a new one is needed."""
        patch = {
            "count": prior.count + 1,
            "lastTimestamp": stamp,
            "message": message[:MESSAGE_LIMIT],
        }
        path = f"/api/v1/namespaces/{prior.namespace}/events/{prior.name}"
        try:
            await self._http.send_json("PATCH", path, patch, content_type=MERGE_PATCH)
        except ApiNotFoundError:
            return False  # expired (Events live an hour by default): write a fresh one
        except ApiError as err:
            if err.status != 403:
                raise
            self._aggregate = False
            log.warning(
                "may not patch Events (%s); repeated Events are now written as new objects. "
                "Grant the ServiceAccount the verb patch on events (core group) to count them "
                "on one Event instead",
                err,
            )
            return False
        prior.count += 1
        return True

    def _refused(self, err: ApiError) -> None:
        if self._forbidden:
            return
        self._forbidden = True
        log.warning(
            "writing Events is forbidden (%s): no more Events from %s until it restarts. "
            "Grant its ServiceAccount the verb create (and patch) on events in the core API "
            'group (apiGroups: [""], resources: ["events"]); the Helm chart\'s ClusterRole '
            "has this rule",
            err,
            self.component,
        )
