"""The informers' events routed into the caches and the work queue (on the loop).

Every replica routes: its caches stay warm and its queue fills whether or not it
leads; only the leader's worker takes from the queue (:mod:`.processing`). A claim of
ours is queued when it changes, unless the change is the echo of our own write
(:meth:`~.inflight.InFlight.observed`: it was decided upon when written); when a pod
that may use it changes; and, while it is unallocated, when capacity may have come
free (a slice, a class, a node, an allocation freed) or its namespace's quota changed.
"""

from __future__ import annotations

from dra_driver.controller.caches import ControllerCaches, Informers
from dra_driver.controller.claim_index import pod_uses
from dra_driver.controller.lenient import allocated
from dra_driver.controller.lenient import namespace as claim_namespace
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.reconcile import is_ours
from dra_driver.core import claim_shape
from dra_driver.k8s.rest import JsonObj


class ChangeRouter:
    """The change handlers, one per kind (:data:`~.informer.ChangeHandler`)."""

    def __init__(self, caches: ControllerCaches, queue: WorkQueue) -> None:
        self._caches = caches
        self._queue = queue
        self._unallocated_ours: set[str] = set()
        """UIDs of the claims of ours the informer shows unallocated: with our answers
        not yet echoed, every claim a change of capacity may let through
        (:meth:`enqueue_ours` with ``pending_only`` looks at these, not at every claim
        cached: a claim deleted or freed would otherwise cost a pass over all of them
        on the loop)."""

    def listen(self, informers: Informers) -> None:
        """Each informer tells its kind's handler from now on."""
        informers.claims.on_change = self.claim_changed
        informers.pods.on_change = self.pod_changed
        informers.slices.on_change = self.capacity_changed
        informers.classes.on_change = self.capacity_changed
        informers.nodes.on_change = self.nodes_changed
        informers.namespaces.on_change = self.namespace_changed

    def claim_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        caches = self._caches
        caches.changed = True
        if etype == "SYNCED":
            claims = caches.claims.values()
            caches.index.reset_claims(claims)
            self._unallocated_ours = {
                claim_shape.key(c) for c in claims if is_ours(c) and not allocated(c)
            }
            uids = caches.claims.uids()
            caches.sizes.retain(uids)
            caches.inflight.retain(uids)
            caches.ledger.invalidate()  # a relist may have dropped or changed anything
            self.enqueue_ours()
            return
        uid = claim_shape.key(new)
        known = caches.inflight.observed(new)
        if etype == "DELETED" or not is_ours(new) or allocated(new):
            self._unallocated_ours.discard(uid)
        else:
            self._unallocated_ours.add(uid)
        if etype == "DELETED":
            caches.inflight.released(uid)
            caches.index.claim_gone(uid)
            caches.ledger.claim_gone(uid)
            caches.sizes.forget(uid)
        else:
            caches.index.claim_changed(new)
            current = caches.current_claim(uid)
            if current is not None:
                caches.ledger.claim_seen(current)
        echo = etype == "MODIFIED" and known
        if is_ours(new) and not echo:
            # The echo of our own write was decided upon when it was written (and the
            # worker goes on from its answer): deciding it again finds nothing to do.
            self._queue.add(uid)
        freed = etype == "DELETED" or not allocated(new)
        if freed and allocated(old):
            self.enqueue_ours(pending_only=True)

    def pod_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        caches = self._caches
        if etype == "SYNCED":
            caches.index.reset_pods(caches.pods.values())
            self.enqueue_ours()
            return
        if etype == "DELETED":
            caches.index.pod_gone(claim_shape.key(new))
        else:
            caches.index.pod_changed(new)
        for uid in caches.index.claims_of(new) | (caches.index.claims_of(old) if old else set()):
            claim = caches.claims.get(uid)
            if claim is not None and is_ours(claim) and (pod_uses(new, claim) or old):
                self._queue.add(uid)

    def capacity_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        """A ResourceSlice or a DeviceClass: what is free may have changed."""
        self._caches.changed = True
        self._caches.ledger.invalidate()
        self.enqueue_ours(pending_only=True)

    def nodes_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        """A Node's labels and taints decide where a pod may go, not what is free."""
        self._caches.nodes_changed()
        self._caches.changed = True
        self.enqueue_ours(pending_only=True)

    def namespace_changed(self, etype: str, new: JsonObj, old: JsonObj) -> None:
        """A namespace's quota may have changed: its pending claims are tried again."""
        self._caches.namespaces_changed()
        if etype == "SYNCED":
            self.enqueue_ours(pending_only=True)
            return
        self.enqueue_ours(
            pending_only=True, namespace=str((new.get("metadata") or {}).get("name", ""))
        )

    def enqueue_ours(self, pending_only: bool = False, namespace: str | None = None) -> None:
        """Queue the claims of ours (``pending_only``: those unallocated as we know
        them; ``namespace``: of that namespace only)."""
        claims = self._pending_claims() if pending_only else self._caches.all_claims()
        for claim in claims:
            if not is_ours(claim):
                continue
            if pending_only and allocated(claim):
                continue
            if namespace is not None and claim_namespace(claim) != namespace:
                continue
            self._queue.add(claim_shape.key(claim))

    def _pending_claims(self) -> list[JsonObj]:
        """A superset of the claims of ours unallocated as we know them: those the
        informer shows so, and those we wrote (their current copy may be ours)."""
        caches = self._caches
        uids = self._unallocated_ours | set(caches.inflight.assumed_uids())
        return [c for c in (caches.current_claim(u) for u in uids) if c is not None]
