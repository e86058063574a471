"""Publish this node's ResourceSlices: desired vs stored, then create, update, delete.

One pool per node. :meth:`SlicePublisher.publish` lists the slices of *our
driver on our node* (field selector ``spec.nodeName=<node>,spec.driver=<driver>``,
the same one the kubelet wipes with), plans with the pure :func:`plan_publish`
and applies the plan. Every slice that selector returns is ours, whoever
wrote it; nothing else is ever touched.

Rules (``plan_publish``):

* object name ``<node>-<driver, '.' -> '-'>-<key>`` (:func:`slice_name`), made
  a DNS subdomain of at most 253 characters; when that had to change the name
  (case, odd characters, length) a hash of the unchanged name is appended, so
  two keys never share an object;
* label ``app.kubernetes.io/managed-by: fractional-gpu-dra``, annotation
  ``gpu.fractional.dev/slice-key: <key>``, and the Node as controlling owner
  (``apiVersion: v1, kind: Node, controller: true``) so the garbage collector
  removes the slices with their Node;
* the pool is unchanged when the stored slices are exactly the desired names,
  share one generation and have the desired specs (ignoring
  ``pool.generation``); then nothing is written at all. Otherwise every slice
  gets generation ``max(stored generations, last one we wrote) + 1``; writes
  go first (creates, updates), deletions of slices no longer desired last;
* the spec to compare with is what we sent when the stored resourceVersion is
  still the one our write got back, else the stored spec. So fields the server
  drops (gates off) or canonicalises (quantities) do not look like a change on
  every publish; after a restart they cause one extra generation at most;
* a device taint's ``timeAdded`` is the API server's (it sets it on create and
  update when unset): it is left out of the comparison, and every write
  carries the stored ``timeAdded`` of a taint that is still desired on the
  same device (same key, value and effect), so rewriting a slice for another
  reason does not restart the clock of ``tolerationSeconds``.

Each create/update response is compared with what was sent; fields that did
not come back are logged once per write and returned in
:attr:`PublishResult.dropped_fields`. 409 Conflict (stale resourceVersion,
AlreadyExists, a failed delete precondition) and a PUT that finds the object
gone re-list and re-plan at once, a few times; :class:`ApiUnavailableError`
(transport, 429, 5xx) re-lists after an exponential backoff with jitter, up to
``max_attempts``; then the error is raised.

Blocking client calls run in a small executor of the publisher's own. Writes
send our raw JSON (:func:`request_json`), never the client's models: newer
clients validate bodies against their models and would reject or reshape
fields they do not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import functools
import hashlib
import inspect
import logging
import random
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar
from urllib.parse import quote

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api

from dra_driver.core.errors import (
    ApiConflictError,
    ApiError,
    ApiNotFoundError,
    ApiUnavailableError,
)
from dra_driver.core.slices import DesiredSlice
from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import (
    DEFAULT_REQUEST_TIMEOUT_S,
    JsonObj,
    json_object,
    read_raw,
    request_json,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
FIELD_MANAGER = "fractional-gpu-dra"
"""``fieldManager`` of our writes (managedFields)."""
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "fractional-gpu-dra"
SLICE_KEY_ANNOTATION = "gpu.fractional.dev/slice-key"
"""The :attr:`DesiredSlice.key` an object was written for (informational)."""
MAX_NAME_LEN = 253

DEFAULT_MAX_WORKERS = 2
DEFAULT_MAX_ATTEMPTS = 5
"""Tries of one publish while the API server is unavailable, before raising."""
DEFAULT_MAX_CONFLICT_RETRIES = 5
"""Re-lists of one publish after conflicts, before raising :class:`ApiConflictError`."""


# --- Pure: names, objects, plan ------------------------------------------------------

_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
_BAD_DOTS = re.compile(r"[.-]*\.[.-]*")  # a dot next to '-' or '.' starts no valid label


def dns_subdomain(raw: str, max_len: int = MAX_NAME_LEN) -> str:
    """``raw`` as a DNS subdomain (RFC 1123) of at most ``max_len`` characters.

    Lower-cased, runs of other characters become ``-``, dots keep only where
    they separate labels. If that changed anything, or the name is too long,
    ``-<10 hex digits of sha256(raw)>`` is appended (after cutting), so that
    distinct inputs stay distinct.
    """
    name = _BAD_DOTS.sub(".", _NOT_DNS.sub("-", raw.lower())).strip(".-")
    if name == raw and len(name) <= max_len:
        return name
    digest = hashlib.sha256(raw.encode()).hexdigest()[:10]
    stem = name[: max_len - len(digest) - 1].rstrip(".-")
    return f"{stem}-{digest}" if stem else digest


def slice_name(node_name: str, driver_name: str, key: str) -> str:
    """The object name of our slice ``key`` on ``node_name``."""
    return dns_subdomain(f"{node_name}-{driver_name.replace('.', '-')}-{key}")


def node_owner(node_name: str, node_uid: str) -> JsonObj:
    """The ownerReference that lets the garbage collector delete slices with their Node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node_name,
        "uid": node_uid,
        "controller": True,
    }


def missing_fields(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Paths of non-empty values in ``sent`` that ``stored`` lacks.

    Changed scalars are not reported (the server canonicalises quantities);
    neither are empty lists and maps (the server omits them).
    """
    if isinstance(sent, dict) and isinstance(stored, dict):
        found = []
        for key, value in sent.items():
            sub = f"{path}.{key}" if path else key
            if key not in stored:
                if value not in (None, {}, []):
                    found.append(sub)
            else:
                found.extend(missing_fields(value, stored[key], sub))
        return found
    if isinstance(sent, list) and isinstance(stored, list):
        found = []
        for index, value in enumerate(sent):
            sub = f"{path}[{index}]"
            if index >= len(stored):
                found.append(sub)
            else:
                found.extend(missing_fields(value, stored[index], sub))
        return found
    return []


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter; pure, so it is tested as a table."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    """Each delay is scaled by a uniform factor in ``[1 - jitter, 1 + jitter]``."""

    def delay(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` >= 1 failures so far)."""
        base = min(self.max_s, self.initial_s * self.factor ** max(0, attempt - 1))
        return float(base * (1 - self.jitter + 2 * self.jitter * rand()))


@dataclass(frozen=True)
class SentSpec:
    """What one of our writes sent, and the resourceVersion the server gave it."""

    resource_version: str
    spec: Mapping[str, Any]


@dataclass(frozen=True)
class PublishPlan:
    """The writes that bring the stored slices to the desired ones (pure output)."""

    generation: int
    """The pool's generation after the plan; 0 for an empty pool."""
    create: tuple[JsonObj, ...] = ()
    update: tuple[JsonObj, ...] = ()
    """Full objects for PUT, ``metadata.resourceVersion`` set to the stored one."""
    delete: tuple[tuple[str, str], ...] = ()
    """``(name, uid)`` of stored slices no longer desired."""

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.update) + len(self.delete)


@dataclass(frozen=True)
class PublishResult:
    """What one :meth:`SlicePublisher.publish` did."""

    generation: int
    """The pool generation now stored (0 when nothing is published)."""
    created: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    """Object names."""
    dropped_fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per slice key, the fields (``spec.devices[0].taints``) the API server did not
    store in this publish's writes: its feature gates are off, or it is older."""

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)


def check_desired(desired: Sequence[DesiredSlice], driver_name: str, node_name: str) -> None:
    """Raise ``ValueError`` when ``desired`` breaks the :class:`DesiredSlice` contract."""
    keys = [d.key for d in desired]
    if len(set(keys)) != len(keys):
        raise ValueError(f"desired slices have duplicate keys: {sorted(keys)}")
    pools = {str((d.spec.get("pool") or {}).get("name")) for d in desired}
    if len(pools) > 1:
        raise ValueError(f"desired slices span several pools {sorted(pools)}; expected one")
    for d in desired:
        spec = d.spec
        if spec.get("driver") != driver_name or spec.get("nodeName") != node_name:
            raise ValueError(
                f"desired slice {d.key!r} is for driver {spec.get('driver')!r} on node "
                f"{spec.get('nodeName')!r}; this publisher serves {driver_name!r} on "
                f"{node_name!r}"
            )
        count = (spec.get("pool") or {}).get("resourceSliceCount")
        if count != len(desired):
            raise ValueError(
                f"desired slice {d.key!r} has pool.resourceSliceCount {count!r}, "
                f"but {len(desired)} slices are desired"
            )


def plan_publish(
    desired: Sequence[DesiredSlice],
    stored: Sequence[Mapping[str, Any]],
    *,
    driver_name: str,
    node_name: str,
    owner: Mapping[str, Any],
    last_generation: int = 0,
    sent: Mapping[str, SentSpec] | None = None,
) -> PublishPlan:
    """Desired slices + the stored slices of our driver on our node → the writes (pure).

    ``last_generation`` is the highest generation this process wrote, so the
    pool never goes back to an old generation after the kubelet wiped it;
    ``sent`` maps object names to what we last wrote there (see module docs).
    """
    sent = sent or {}
    wanted = {slice_name(node_name, driver_name, d.key): d for d in desired}
    by_name = {str(o["metadata"]["name"]): o for o in stored}

    def comparable(name: str, obj: Mapping[str, Any]) -> Any:
        meta = obj["metadata"]
        mine = sent.get(name)
        spec = mine.spec if mine and mine.resource_version == meta.get("resourceVersion") else None
        return _comparable_spec(spec if spec is not None else obj.get("spec") or {})

    generations = {_generation(o) for o in stored}
    unchanged = (
        set(wanted) == set(by_name)
        and len(generations) <= 1
        and all(comparable(n, by_name[n]) == _comparable_spec(d.spec) for n, d in wanted.items())
    )
    times = _stored_taint_times(stored)
    if unchanged:
        generation = next(iter(generations), 0)
    else:
        generation = max([*generations, last_generation]) + 1
    create, update = [], []
    for name, d in wanted.items():
        spec = copy.deepcopy(dict(d.spec))
        spec["pool"] = {**spec["pool"], "generation": generation}
        _keep_taint_times(spec, times)
        current = by_name.get(name)
        if current is None:
            meta = _our_metadata(name, d.key, owner, None)
            create.append({**_TYPE, "metadata": meta, "spec": spec})
        elif not unchanged or not _has_our_metadata(current["metadata"], d.key, owner):
            meta = _our_metadata(name, d.key, owner, current["metadata"])
            update.append({**_TYPE, "metadata": meta, "spec": spec})
    delete = [
        (name, str(obj["metadata"].get("uid", "")))
        for name, obj in sorted(by_name.items())
        if name not in wanted
    ]
    return PublishPlan(generation if wanted else 0, tuple(create), tuple(update), tuple(delete))


_TYPE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}


def _generation(obj: Mapping[str, Any]) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _without_generation(spec: Mapping[str, Any]) -> JsonObj:
    out = dict(spec)
    out["pool"] = {k: v for k, v in (spec.get("pool") or {}).items() if k != "generation"}
    return out


_TaintId = tuple[str, str, str, str]
"""(device name, key, value, effect)"""


def _taint_id(device: Mapping[str, Any], taint: Mapping[str, Any]) -> _TaintId:
    return (
        str(device.get("name")),
        str(taint.get("key")),
        str(taint.get("value") or ""),
        str(taint.get("effect")),
    )


def _comparable_spec(spec: Mapping[str, Any]) -> JsonObj:
    """``spec`` without what the server decides: the pool generation, taints' ``timeAdded``."""
    out = _without_generation(spec)
    devices = out.get("devices")
    if isinstance(devices, list):
        out["devices"] = [_without_taint_times(device) for device in devices]
    return out


def _without_taint_times(device: Any) -> Any:
    if not isinstance(device, Mapping) or not device.get("taints"):
        return device
    taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]]
    return {**device, "taints": taints}


def _stored_taint_times(stored: Sequence[Mapping[str, Any]]) -> dict[_TaintId, Any]:
    """When each stored device taint was added, by device and taint."""
    times: dict[_TaintId, Any] = {}
    for obj in stored:
        for device in (obj.get("spec") or {}).get("devices") or []:
            for taint in device.get("taints") or []:
                if taint.get("timeAdded"):
                    times[_taint_id(device, taint)] = taint["timeAdded"]
    return times


def _keep_taint_times(spec: JsonObj, times: Mapping[_TaintId, Any]) -> None:
    """Give each desired taint without ``timeAdded`` the stored one of the same taint."""
    for device in spec.get("devices") or []:
        for taint in device.get("taints") or []:
            if "timeAdded" not in taint and (when := times.get(_taint_id(device, taint))):
                taint["timeAdded"] = when


def _our_metadata(
    name: str, key: str, owner: Mapping[str, Any], stored: Mapping[str, Any] | None
) -> JsonObj:
    """Metadata to write: ours merged over what is stored (others' labels stay)."""
    stored = stored or {}
    others = [
        ref
        for ref in stored.get("ownerReferences") or []
        if (ref.get("apiVersion"), ref.get("kind")) != ("v1", "Node")
    ]
    meta: JsonObj = {
        "name": name,
        "labels": {**(stored.get("labels") or {}), MANAGED_BY_LABEL: MANAGED_BY},
        "annotations": {**(stored.get("annotations") or {}), SLICE_KEY_ANNOTATION: key},
        "ownerReferences": [dict(owner), *others],
    }
    for attr in ("resourceVersion", "finalizers"):
        if stored.get(attr):
            meta[attr] = stored[attr]
    return meta


def _has_our_metadata(meta: Mapping[str, Any], key: str, owner: Mapping[str, Any]) -> bool:
    return (
        (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
        and (meta.get("annotations") or {}).get(SLICE_KEY_ANNOTATION) == key
        and dict(owner) in (meta.get("ownerReferences") or [])
    )


# --- The publisher ----------------------------------------------------------------------

DesiredFn = Callable[[], Sequence[DesiredSlice] | Awaitable[Sequence[DesiredSlice]]]


class _StaleView(Exception):
    """Our list is out of date: re-list and re-plan at once."""


class SlicePublisher:
    """Keeps this node's ResourceSlices equal to the desired ones.

    Two ways to drive it: ``await publish(desired)`` once, or run
    :meth:`run` as a background task and call :meth:`request_publish` after
    every kubelet registration and on every inventory or health change; the
    task then rebuilds the desired slices and publishes, coalescing bursts.

    The caller owns ``api_client``; :meth:`close` only stops the worker pool
    the publisher made for itself (not an ``executor`` passed in).
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        driver_name: str,
        node_name: str,
        node_uid: str | None = None,
        executor: Executor | None = None,
        max_workers: int = DEFAULT_MAX_WORKERS,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        backoff: Backoff | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_conflict_retries: int = DEFAULT_MAX_CONFLICT_RETRIES,
        rng: random.Random | None = None,
    ) -> None:
        """``node_uid`` None: read the Node once (GET /api/v1/nodes/<node>) and keep its uid."""
        self._api_client = api_client
        self._driver = driver_name
        self._node = node_name
        self._node_uid = node_uid
        self._own_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="k8s-slices"
        )
        self._timeout_s = request_timeout_s
        self._backoff = backoff or Backoff()
        self._max_attempts = max(1, max_attempts)
        self._max_conflict_retries = max(0, max_conflict_retries)
        self._rng = rng or random.Random()
        self._lock = asyncio.Lock()
        self._requested = asyncio.Event()
        self._sent: dict[str, SentSpec] = {}
        self._last_generation = 0

    @property
    def field_selector(self) -> str:
        """Selects exactly our slices (and is what the kubelet wipes)."""
        return f"spec.nodeName={self._node},spec.driver={self._driver}"

    # Publishing

    async def publish(self, desired: Sequence[DesiredSlice]) -> PublishResult:
        """Make the stored slices of our driver on our node equal ``desired``.

        ``desired`` must hold one pool, our driver and node, unique keys and
        the right ``pool.resourceSliceCount`` (``ValueError`` otherwise);
        ``pool.generation`` is ignored and set here. Idempotent: an unchanged
        pool costs one LIST and no write. Raises :class:`ApiError` once the
        retries described in the module docstring are used up.
        """
        check_desired(desired, self._driver, self._node)
        async with self._lock:
            return await self._retrying("publish ResourceSlices", lambda: self._publish(desired))

    async def unpublish(self) -> tuple[str, ...]:
        """Delete every slice of our driver on our node; returns their names.

        For ``dra-driver cleanup`` (uninstall). The plugin does NOT call this
        on a normal shutdown: the kubelet deletes a driver's slices itself
        30 s after the driver disconnects, and a rolling update (new pod
        registers while the old one exits) must not make the slices flap.
        """
        async with self._lock:
            return await self._retrying("unpublish ResourceSlices", self._unpublish)

    # Background republishing

    def request_publish(self) -> None:
        """Ask the :meth:`run` task to publish again soon; cheap, never blocks.

        Call it from the event loop's thread after every kubelet registration
        (the kubelet wipes the node's slices when it starts) and whenever the
        inventory or device health changes. Requests made while a publish is
        running lead to exactly one more publish afterwards.
        """
        self._requested.set()

    async def run(
        self,
        desired_fn: DesiredFn,
        *,
        on_publish: Callable[[PublishResult], object] | None = None,
    ) -> NoReturn:
        """Publish now, then whenever requested, until cancelled.

        ``desired_fn`` (sync or async) builds the desired slices each time, so
        it sees the current inventory and capabilities (it may re-probe
        them). When a publish still fails after :meth:`publish`'s own retries,
        or ``desired_fn`` raises, the error is logged and the publish is
        retried after a growing backoff, or at once on the next request.
        ``on_publish`` is called with every successful result.
        """
        self._requested.set()
        failures = 0
        while True:
            await self._requested.wait()
            self._requested.clear()
            try:
                desired = desired_fn()
                if inspect.isawaitable(desired):
                    desired = await desired
                result = await self.publish(desired)
            except Exception as err:
                failures += 1
                delay = self._backoff.delay(failures, self._rng.random)
                log.warning(
                    "publishing ResourceSlices failed (%d in a row), retrying in %.1f s: %s",
                    failures,
                    delay,
                    err,
                    exc_info=not isinstance(err, ApiError),
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._requested.wait(), timeout=delay)
                self._requested.set()
                continue
            failures = 0
            if on_publish is not None:
                on_publish(result)

    def close(self) -> None:
        """Stop the publisher's own worker pool; calls still running finish in the background."""
        if self._own_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # Internals

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        failures = conflicts = 0
        while True:
            try:
                return await attempt()
            except _StaleView as stale:
                conflicts += 1
                if conflicts > self._max_conflict_retries:
                    raise ApiConflictError(
                        f"{what}: still conflicting after {conflicts} tries: {stale}"
                    ) from stale.__cause__
                log.info("%s: %s; listing again", what, stale)
            except ApiUnavailableError as err:
                failures += 1
                if failures >= self._max_attempts:
                    raise
                delay = self._backoff.delay(failures, self._rng.random)
                log.warning("%s: %s; try %d in %.2f s", what, err, failures + 1, delay)
                await asyncio.sleep(delay)

    async def _publish(self, desired: Sequence[DesiredSlice]) -> PublishResult:
        owner = node_owner(self._node, await self._node_uid_cached())
        stored = await self._call(self._list_ours)
        plan = plan_publish(
            desired,
            stored,
            driver_name=self._driver,
            node_name=self._node,
            owner=owner,
            last_generation=self._last_generation,
            sent=self._sent,
        )
        if plan.writes == 0:
            log.debug("ResourceSlices of pool %s unchanged", self._node)
            return PublishResult(plan.generation)
        keys = {slice_name(self._node, self._driver, d.key): d.key for d in desired}
        dropped: dict[str, tuple[str, ...]] = {}
        created, updated = [], []
        for body, is_new in [(b, True) for b in plan.create] + [(b, False) for b in plan.update]:
            name = body["metadata"]["name"]
            if is_new:
                stored_obj = await self._call(self._create, body)
                created.append(name)
            else:
                stored_obj = await self._call(self._replace, body)
                updated.append(name)
            self._last_generation = max(self._last_generation, plan.generation)
            self._sent[name] = SentSpec(
                str(stored_obj["metadata"]["resourceVersion"]), body["spec"]
            )
            missing = missing_fields(body["spec"], stored_obj.get("spec") or {}, "spec")
            if missing:
                dropped[keys[name]] = tuple(sorted(missing))
                log.warning(
                    "ResourceSlice %s: the API server did not store %s (feature gates off, "
                    "or a server older than these fields)",
                    name,
                    ", ".join(missing),
                )
        deleted = []
        for name, uid in plan.delete:
            await self._call(self._delete, name, uid)
            self._sent.pop(name, None)
            deleted.append(name)
        log.info(
            "published ResourceSlices of pool %s at generation %d: %d created, %d updated, "
            "%d deleted",
            self._node,
            plan.generation,
            len(created),
            len(updated),
            len(deleted),
        )
        return PublishResult(
            plan.generation, tuple(created), tuple(updated), tuple(deleted), dropped
        )

    async def _unpublish(self) -> tuple[str, ...]:
        stored = await self._call(self._list_ours)
        names = []
        for obj in stored:
            meta = obj["metadata"]
            await self._call(self._delete, meta["name"], str(meta.get("uid", "")))
            self._sent.pop(meta["name"], None)
            names.append(str(meta["name"]))
        log.info("deleted %d ResourceSlices of pool %s", len(names), self._node)
        return tuple(names)

    async def _node_uid_cached(self) -> str:
        if self._node_uid is None:
            self._node_uid = await self._call(self._read_node_uid)
        return self._node_uid

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        # Like asyncio.to_thread: carry contextvars into the thread.
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await loop.run_in_executor(self._executor, call)

    # Blocking calls (run in the executor)

    def _read_node_uid(self) -> str:
        what = f"GET nodes {self._node}"
        try:
            with translate_api_errors(what):
                raw = CoreV1Api(self._api_client).read_node(
                    self._node, _preload_content=False, _request_timeout=self._timeout_s
                )
                node = json_object(what, read_raw(raw))
        except ApiNotFoundError as err:
            raise ApiNotFoundError(
                f"{err}; ResourceSlices are owned by their Node: is the node name "
                f"{self._node!r} right?",
                status=err.status,
            ) from err
        uid = (node.get("metadata") or {}).get("uid")
        if not uid:
            raise ApiError(f"{what}: the Node has no metadata.uid")
        return str(uid)

    def _list_ours(self) -> list[JsonObj]:
        what = f"LIST resourceslices {self.field_selector}"
        with translate_api_errors(what):
            raw = ResourceV1Api(self._api_client).list_resource_slice(
                field_selector=self.field_selector,
                _preload_content=False,
                _request_timeout=self._timeout_s,
            )
            listed = json_object(what, read_raw(raw))
        items = listed.get("items") or []
        return [i for i in items if isinstance(i, dict) and (i.get("metadata") or {}).get("name")]

    def _create(self, body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        try:
            with translate_api_errors(f"POST resourceslices {name}"):
                return request_json(
                    self._api_client,
                    "POST",
                    SLICES_PATH,
                    query=[("fieldManager", FIELD_MANAGER)],
                    body=body,
                    timeout_s=self._timeout_s,
                )
        except ApiConflictError as err:
            raise _StaleView(f"ResourceSlice {name} already exists") from err

    def _replace(self, body: JsonObj) -> JsonObj:
        name = body["metadata"]["name"]
        try:
            with translate_api_errors(f"PUT resourceslices {name}"):
                return request_json(
                    self._api_client,
                    "PUT",
                    f"{SLICES_PATH}/{quote(name, safe='')}",
                    query=[("fieldManager", FIELD_MANAGER)],
                    body=body,
                    timeout_s=self._timeout_s,
                )
        except ApiConflictError as err:
            raise _StaleView(f"ResourceSlice {name} changed since it was listed") from err
        except ApiNotFoundError as err:
            raise _StaleView(f"ResourceSlice {name} was deleted since it was listed") from err

    def _delete(self, name: str, uid: str) -> None:
        options: JsonObj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if uid:
            options["preconditions"] = {"uid": uid}
        try:
            with translate_api_errors(f"DELETE resourceslices {name}"):
                request_json(
                    self._api_client,
                    "DELETE",
                    f"{SLICES_PATH}/{quote(name, safe='')}",
                    body=options,
                    timeout_s=self._timeout_s,
                )
        except ApiNotFoundError:
            pass  # already gone (the kubelet wipes slices too)
        except ApiConflictError as err:
            raise _StaleView(f"ResourceSlice {name} was replaced since it was listed") from err
