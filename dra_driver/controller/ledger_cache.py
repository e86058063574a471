"""The allocator's state kept in step with the caches: built once, updated per claim.

Building an :class:`~dra_driver.allocator.AllocatorState` parses every slice and every
allocated claim; doing that per claim made the controller's CPU grow with the cluster
times the claims (200 ms a claim at 50 nodes and 600 claims, ``hack/bench/controller.py``).
Here one state lives across claims:

* a decision the controller is about to write is recorded at once (:meth:`record`, by
  :class:`~.inflight.InFlight`, which holds it), before the first write is sent, so the
  next decision sees it while its writes are in flight; the write's outcome then
  either keeps it (:meth:`hold_written`) or drops the state (:meth:`invalidate`);
* a claim the informer shows allocated that the state does not hold yet (allocated
  by another replica before a failover, or seen after a restart) is added
  (:meth:`claim_seen`);
* nothing is ever taken out of a state: an allocation that goes away (a claim
  deallocated, cleared by the scheduler, deleted), a ResourceSlice or DeviceClass
  that changes, or a relist drops it (:meth:`invalidate`), and the next
  :meth:`state` builds a new one from the caches, the holds in flight laid over.

The ledger is thus never short of an allocation, written or about to be: no device
is given twice. Restart builds it from the informer's allocated claims, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator import Allocation, AllocatorState, SelectorCache
from dra_driver.controller.inflight import Hold
from dra_driver.core import claim_shape
from dra_driver.core.claim_shape import is_allocated

log = logging.getLogger(__name__)

JsonObj = dict[str, Any]


@dataclass(frozen=True)
class Sources:
    """What a state is built from, read from the caches when one is needed."""

    slices: Callable[[], Iterable[Mapping[str, Any]]]
    classes: Callable[[], Iterable[Mapping[str, Any]]]
    allocated_claims: Callable[[], Iterable[Mapping[str, Any]]]
    """Every allocated claim: the informer's, our written claims laid over."""
    holds: Callable[[], Mapping[str, Hold]]
    """Claim UID -> its allocation decided and not yet answered
    (:attr:`~.inflight.InFlight.holds`)."""


class LedgerCache:
    def __init__(self, driver_name: str, sources: Sources, selectors: SelectorCache) -> None:
        self._driver_name = driver_name
        self._sources = sources
        self._selectors = selectors
        self._state: AllocatorState | None = None
        self._held: set[str] = set()
        """Claim UIDs whose allocation the current state holds as an allocated claim
        (ours written, or anyone's seen): one freed among them makes a new state."""
        self.builds = 0

    def state(self) -> AllocatorState:
        """The current state; built from the caches (and the writes in flight) if none."""
        if self._state is None:
            holds = self._sources.holds()
            claims = [
                c
                for c in self._sources.allocated_claims()
                if is_allocated(c) and claim_shape.key(c) not in holds
            ]
            state = AllocatorState(
                slices=self._sources.slices(),
                classes=self._sources.classes(),
                allocated_claims=claims,
                driver_name=self._driver_name,
                cache=self._selectors,
            )
            for hold in holds.values():
                state.record_allocation(hold.namespace, hold.allocation)
            self._held = {claim_shape.key(c) for c in claims}
            self._state = state
            self.builds += 1
            log.debug(
                "allocator state built (%d): %d allocated claims, %d in flight",
                self.builds,
                len(claims),
                len(holds),
            )
        return self._state

    def invalidate(self) -> None:
        """Something was freed or the inventory changed: build anew when next needed."""
        self._state = None

    def record(self, namespace: str, allocation: Allocation) -> None:
        """An allocation decided (held), to be written: the current state counts it."""
        self.state().record_allocation(namespace, allocation)

    def hold_written(self, uid: str) -> None:
        """The claim's held allocation is written (and assumed): it stays, now as the
        allocated claim's."""
        self._held.add(uid)

    def claim_seen(self, claim: Mapping[str, Any]) -> None:
        """A claim as the informer (or our own write) shows it now."""
        uid = claim_shape.key(claim)
        if uid in self._sources.holds():
            return
        if is_allocated(claim):
            if self._state is not None and uid not in self._held:
                self._state.record_claim(claim)
                self._held.add(uid)
        elif uid in self._held:
            self._held.discard(uid)
            self.invalidate()

    def claim_gone(self, uid: str) -> None:
        if uid in self._held:
            self._held.discard(uid)
            self.invalidate()
