"""Publish this node's ResourceSlices: desired vs stored, then create, update, delete.

One pool per node. :meth:`SlicePublisher.publish` lists the slices of *our
driver on our node* (field selector ``spec.nodeName=<node>,spec.driver=<driver>``,
the same one the kubelet wipes with), plans with the pure :func:`plan_publish`
and applies the plan. Every slice that selector returns is ours, whoever
wrote it; nothing else is ever touched. The rules of the plan (names,
metadata, generations, device taints' ``timeAdded``) are documented in
:mod:`dra_driver.k8s.slice_plan`; the requests live in
:mod:`dra_driver.k8s.slice_api`.

Each create/update response is compared with what was sent; fields that did
not come back are logged once per write and returned in
:attr:`PublishResult.dropped_fields`. 409 Conflict (stale resourceVersion,
AlreadyExists, a failed delete precondition) and a PUT that finds the object
gone re-list and re-plan at once, a few times; :class:`ApiUnavailableError`
(transport, 429, 5xx) re-lists after an exponential backoff with jitter, up to
``max_attempts``; then the error is raised.

Requests go on the event loop (:class:`~dra_driver.k8s.transport.ApiTransport`).
Writes send our raw JSON, never the client's models: newer clients validate
bodies against their models and would reject or reshape fields they do not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, TypeVar

from dra_driver.base.errors import ApiConflictError, ApiError, ApiUnavailableError
from dra_driver.core.slices import DesiredSlice
from dra_driver.k8s.backoff import Backoff
from dra_driver.k8s.rest import DEFAULT_REQUEST_TIMEOUT_S
from dra_driver.k8s.slice_api import FIELD_MANAGER, SLICES_PATH, SliceApi, StaleView
from dra_driver.k8s.slice_plan import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_NAME_LEN,
    SLICE_KEY_ANNOTATION,
    PublishPlan,
    SentSpec,
    check_desired,
    dns_subdomain,
    missing_fields,
    node_owner,
    plan_publish,
    slice_name,
)
from dra_driver.k8s.transport import ApiTransport

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_CONFLICT_RETRIES",
    "FIELD_MANAGER",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MAX_NAME_LEN",
    "SLICES_PATH",
    "SLICE_KEY_ANNOTATION",
    "Backoff",
    "DesiredFn",
    "PublishPlan",
    "PublishResult",
    "SentSpec",
    "SlicePublisher",
    "check_desired",
    "dns_subdomain",
    "missing_fields",
    "node_owner",
    "plan_publish",
    "slice_name",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_ATTEMPTS = 5
"""Tries of one publish while the API server is unavailable, before raising."""
DEFAULT_MAX_CONFLICT_RETRIES = 5
"""Re-lists of one publish after conflicts, before raising :class:`ApiConflictError`."""


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


DesiredFn = Callable[[], Sequence[DesiredSlice] | Awaitable[Sequence[DesiredSlice]]]


class SlicePublisher:
    """Keeps this node's ResourceSlices equal to the desired ones.

    Two ways to drive it: ``await publish(desired)`` once, or run
    :meth:`run` as a background task and call :meth:`request_publish` after
    every kubelet registration and on every inventory or health change; the
    task then rebuilds the desired slices and publishes, coalescing bursts.

    The caller owns ``http`` (and closes it).
    """

    def __init__(
        self,
        http: ApiTransport,
        *,
        driver_name: str,
        node_name: str,
        node_uid: str | None = None,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        backoff: Backoff | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_conflict_retries: int = DEFAULT_MAX_CONFLICT_RETRIES,
        rng: random.Random | None = None,
    ) -> None:
        """``node_uid`` None: read the Node once (GET /api/v1/nodes/<node>) and keep its uid."""
        self._driver = driver_name
        self._node = node_name
        self._api = SliceApi(
            http,
            node_name=node_name,
            field_selector=self.field_selector,
            timeout_s=request_timeout_s,
        )
        self._node_uid = node_uid
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
        on_failure: Callable[[Exception, int], object] | None = None,
    ) -> NoReturn:
        """Publish now, then whenever requested, until cancelled.

        ``desired_fn`` (sync or async) builds the desired slices each time, so
        it sees the current inventory and capabilities (it may re-probe
        them). When a publish still fails after :meth:`publish`'s own retries,
        or ``desired_fn`` raises, the error is logged and the publish is
        retried after a growing backoff, or at once on the next request.
        ``on_publish`` is called with every successful result, ``on_failure``
        with every failed attempt's error and the failures in a row.
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
                if on_failure is not None:
                    on_failure(err, failures)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._requested.wait(), timeout=delay)
                self._requested.set()
                continue
            failures = 0
            if on_publish is not None:
                on_publish(result)

    # Internals

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        failures = conflicts = 0
        while True:
            try:
                return await attempt()
            except StaleView as stale:
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
        stored = await self._api.list_ours()
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
                stored_obj = await self._api.create(body)
                created.append(name)
            else:
                stored_obj = await self._api.replace(body)
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
            await self._api.delete(name, uid)
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
        stored = await self._api.list_ours()
        names = []
        for obj in stored:
            meta = obj["metadata"]
            await self._api.delete(meta["name"], str(meta.get("uid", "")))
            self._sent.pop(meta["name"], None)
            names.append(str(meta["name"]))
        log.info("deleted %d ResourceSlices of pool %s", len(names), self._node)
        return tuple(names)

    async def _node_uid_cached(self) -> str:
        if self._node_uid is None:
            self._node_uid = await self._api.read_node_uid()
        return self._node_uid
