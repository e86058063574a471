"""The disruption guard: pods using a prepared, guarded claim carry do-not-disrupt.

:class:`DisruptionGuard` is a :class:`~dra_driver.core.prepare.DriverObserver`
(what it decides is in :mod:`dra_driver.core.claim_writes.disruption_guard`):

* a prepare that succeeded, of a claim the node's :class:`GuardMode` guards,
  annotates the pods on this node that use the claim (one LIST of the claim's
  namespace on this node, one merge patch per pod that lacks something);
* an unprepare that succeeded removes that claim from the pods' markers, and
  our annotations from pods no guarded claim is left on;
* :meth:`run`, every ``interval_s``, lists every pod on the node: it guards pods
  that started using an already-prepared claim (the kubelet prepares a shared
  claim once, for the first pod), drops claims that are no longer prepared (an
  unprepare while the plugin was down), and counts the guarded pods for
  ``fractional_gpu_dra_disruption_guarded_pods``. Its first pass, at start,
  learns from the pods' markers which prepared claims guard (a restarted
  plugin does not know otherwise).

Nothing here ever fails a prepare or unprepare: the observer runs after the
kubelet's answer is decided, API work is one task per claim (the newest wish
wins, so a prepare then a quick unprepare never leaves a guard), and an API
error is logged and, for a claim, recorded as a Warning ``DisruptionGuardFailed``
Event. A 403 (RBAC, or the ValidatingAdmissionPolicy) says which permission is
missing. A patch refused as a conflict (the pod changed since it was read) is
tried again on a fresh read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Literal, Protocol

from dra_driver.base.errors import ApiConflictError, ApiError, ApiNotFoundError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.claim_writes import (
    GuardMode,
    annotation_changes,
    annotations_of,
    claim_wants_guard,
    guarded_claims,
    pod_finished,
    pod_uses_claim,
)
from dra_driver.core.prepare import ClaimOperation
from dra_driver.k8s.events import WARNING, EventRecorder, InvolvedObject
from dra_driver.k8s.rest import JsonObj

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0
CONFLICT_ATTEMPTS = 4

Action = Literal["guard", "release"]


class PodStore(Protocol):
    """The node's pods (``k8s.pods.PodApi`` is one)."""

    async def list_on_node(self, namespace: str | None = None) -> list[JsonObj]: ...

    async def patch_annotations(
        self, pod: Mapping[str, Any], changes: Mapping[str, str | None]
    ) -> JsonObj: ...

    async def get(self, namespace: str, name: str) -> JsonObj: ...


PreparedClaims = Callable[[], Mapping[ClaimUID, ClaimRef]]
"""The claims prepared on this node now (the checkpoint's PrepareCompleted); blocks."""


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


class DisruptionGuard:
    """See the module docstring. ``prepared``: the claims prepared now (the runtime's
    checkpoint); without it the periodic pass only adds guards and never drops a claim.
    ``on_count``: told the number of guarded pods after each change (metrics)."""

    def __init__(
        self,
        pods: PodStore,
        *,
        driver_name: str,
        node_name: str,
        mode: GuardMode,
        events: EventRecorder | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_count: Callable[[int], None] | None = None,
        prepared: PreparedClaims | None = None,
    ) -> None:
        self.pods = pods
        self.driver_name = driver_name
        self.node_name = node_name
        self.mode = mode
        self.events = events
        self.interval_s = interval_s
        self.on_count = on_count
        self.prepared = prepared
        self._guarded: dict[ClaimUID, ClaimRef] = {}
        """Prepared claims that guard their pods (this process's prepares, and the
        ones the first pass found in markers)."""
        self._synced = False
        self._wanted: dict[ClaimUID, tuple[ClaimRef, Action]] = {}
        self._workers: dict[ClaimUID, asyncio.Task[None]] = {}
        self._pods: dict[str, frozenset[str]] = {}
        """Pod key -> the claims its marker names, as last read or written."""
        self._forbidden_logged = False
        self._lock = asyncio.Lock()
        """One pass at a time over the API: claim work and the periodic pass."""

    # --- DriverObserver ---------------------------------------------------------------

    def claim_done(self, op: ClaimOperation) -> None:
        if not op.ok or self.mode is GuardMode.OFF:
            return
        if op.operation == "prepare":
            if op.claim is None:
                return
            wants, warning = claim_wants_guard(self.mode, op.claim.annotations, self.driver_name)
            if warning and not op.repeated:
                log.warning("claim %s: %s", op.ref, warning)
            if wants:
                self._guarded[op.ref.uid] = op.ref
                self._want(op.ref, "guard")
        elif op.ref.uid in self._guarded or not self._synced:
            self._guarded.pop(op.ref.uid, None)
            self._want(op.ref, "release")

    @property
    def synced(self) -> bool:
        """The first pass over the node's pods, with the checkpoint, is done."""
        return self._synced

    @property
    def guarded_pods(self) -> int:
        return sum(1 for claims in self._pods.values() if claims)

    # --- work -------------------------------------------------------------------------

    def _want(self, ref: ClaimRef, action: Action) -> None:
        self._wanted[ref.uid] = (ref, action)
        if ref.uid not in self._workers:
            self._workers[ref.uid] = asyncio.get_running_loop().create_task(
                self._work(ref.uid), name=f"disruption-guard-{ref.name}"
            )

    async def _work(self, uid: ClaimUID) -> None:
        try:
            while (wanted := self._wanted.pop(uid, None)) is not None:
                ref, action = wanted
                try:
                    async with self._lock:
                        await self._apply(ref, action)
                except ApiError as err:
                    self._failed(ref, action, err)
                except Exception:  # a bug must not end the plugin; the claim is fine
                    log.exception("disruption guard: %s for claim %s failed", action, ref)
        finally:
            self._workers.pop(uid, None)

    async def _apply(self, ref: ClaimRef, action: Action) -> None:
        pods = await self.pods.list_on_node(ref.namespace)
        for pod in pods:
            ann = annotations_of(pod)
            if action == "guard":
                if pod_finished(pod) or not pod_uses_claim(pod, ref.name):
                    continue
                if ref.uid in guarded_claims(ann, self.driver_name):
                    self._pods[_pod_key(pod)] = guarded_claims(ann, self.driver_name)
                    continue
                await self._patch(pod, add={ref.uid})
            elif ref.uid in guarded_claims(ann, self.driver_name):
                await self._patch(pod, remove={ref.uid})
        self._count()

    async def _patch(
        self,
        pod: JsonObj,
        *,
        add: AbstractSet[str] = frozenset(),
        remove: AbstractSet[str] = frozenset(),
    ) -> None:
        """Patch ``pod`` so ``add`` guard it and ``remove`` no longer; a conflict is
        tried again on a fresh read, a pod gone is nothing to do."""
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            changes = annotation_changes(
                annotations_of(pod), self.driver_name, add=add, remove=remove
            )
            if not changes:
                break
            try:
                pod = await self.pods.patch_annotations(pod, changes)
            except ApiNotFoundError:
                self._pods.pop(_pod_key(pod), None)
                return
            except ApiConflictError:
                if attempt == CONFLICT_ATTEMPTS:
                    raise
                try:
                    fresh = await self.pods.get(namespace, name)
                except ApiNotFoundError:
                    self._pods.pop(_pod_key(pod), None)
                    return
                if _pod_key(fresh) != _pod_key(pod):  # replaced: not the pod we decided on
                    self._pods.pop(_pod_key(pod), None)
                    return
                pod = fresh
                continue
            log.info(
                "disruption guard: pod %s on node %s %s (claims %s)",
                _pod_name(pod),
                self.node_name,
                "guarded" if guarded_claims(annotations_of(pod), self.driver_name) else "released",
                ", ".join(sorted(add | remove)),
            )
            break
        self._pods[_pod_key(pod)] = guarded_claims(annotations_of(pod), self.driver_name)

    def _failed(self, ref: ClaimRef, action: Action, err: ApiError) -> None:
        what = "adding" if action == "guard" else "removing"
        message = (
            f"disruption guard on node {self.node_name}: {what} karpenter.sh/do-not-disrupt "
            f"and cluster-autoscaler.kubernetes.io/safe-to-evict on the claim's pods failed: {err}"
        )
        if err.status == 403 and not self._forbidden_logged:
            self._forbidden_logged = True
            log.warning(
                "%s. Fix: grant the kubelet plugin's ServiceAccount get, list and patch on "
                "pods (Helm: kubeletPlugin.disruptionGuard.enabled=true, which also installs "
                "the ValidatingAdmissionPolicy that allows only those annotations on pods of "
                "the plugin's node), or set --disruption-guard=off",
                message,
            )
        else:
            log.warning("%s", message)
        if self.events is not None:
            self.events.emit(InvolvedObject.claim(ref), "DisruptionGuardFailed", message, WARNING)

    def _count(self) -> None:
        if self.on_count is not None:
            self.on_count(self.guarded_pods)

    # --- the periodic pass ------------------------------------------------------------

    async def run(self) -> None:
        """:meth:`resync` now and every ``interval_s`` (0: only now), until cancelled."""
        while True:
            try:
                await self.resync()
            except ApiError as err:
                log.warning(
                    "disruption guard: reading the pods of node %s failed: %s", self.node_name, err
                )
            if self.interval_s <= 0:
                await asyncio.Event().wait()  # only the first pass; the task lives on
            await asyncio.sleep(self.interval_s)

    async def resync(self) -> None:
        """One pass over every pod on the node; see the module docstring."""
        if self.mode is GuardMode.OFF:
            return
        async with self._lock:
            # Pods first, then the checkpoint: a claim in a marker was prepared
            # before its guard was written, so it is in the checkpoint read after
            # unless it was unprepared since (and then dropping it is right).
            pods = await self.pods.list_on_node(None)
            prepared = await asyncio.to_thread(self.prepared) if self.prepared else None
            if not self._synced and prepared is not None:
                for pod in pods:
                    for uid in guarded_claims(annotations_of(pod), self.driver_name):
                        if ClaimUID(uid) in prepared:
                            self._guarded.setdefault(ClaimUID(uid), prepared[ClaimUID(uid)])
                self._synced = True
            seen: dict[str, frozenset[str]] = {}
            for pod in pods:
                key = _pod_key(pod)
                marked = guarded_claims(annotations_of(pod), self.driver_name)
                stale: set[str] = set()
                if prepared is not None:
                    stale = {u for u in marked if u not in prepared and u not in self._guarded}
                add: set[str] = set()
                if not pod_finished(pod):
                    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
                    add = {
                        ref.uid
                        for ref in self._guarded.values()
                        if ref.namespace == namespace
                        and ref.uid not in marked
                        and pod_uses_claim(pod, ref.name)
                    }
                seen[key] = marked
                if add or stale:
                    try:
                        await self._patch(pod, add=add, remove=stale)
                    except ApiError as err:
                        log.warning(
                            "disruption guard: updating pod %s failed: %s", _pod_name(pod), err
                        )
                    seen[key] = self._pods.get(key, marked)
            self._pods = seen
            self._count()

    # --- shutdown ---------------------------------------------------------------------

    async def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait up to ``timeout_s`` for pending claim work; True when done."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._workers and loop.time() < deadline:
            await asyncio.wait(set(self._workers.values()), timeout=deadline - loop.time())
        return not self._workers

    async def close(self, timeout_s: float = 5.0) -> None:
        """Finish pending claim work (up to ``timeout_s``), then cancel what is left."""
        if await self.flush(timeout_s):
            return
        pending = set(self._workers.values())
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        log.warning("disruption guard: dropped work for %d claim(s) at shutdown", len(pending))
