"""A claim's in-flight life in one place: from the controller's decision to the informer's
echo of its write, as a state machine with one table of the moves it allows.

::

    (none) ─decided─▶ DECIDED ─writing─▶ WRITING ─written─▶ WRITTEN ─echo─▶ ECHOED
                         │                 │  │
                         └─failed─▶ FAILED ◀┘  └─released─▶ RELEASED ─▶ (none)

* ``DECIDED``: an allocation is chosen and its capacity *held*: recorded in the
  allocator's state (:class:`~.ledger_cache.LedgerCache`) before any write is sent, so
  the next decision, taken while this claim's writes are in flight, sees it.
* ``WRITING``: the claim's write is sent (a decision's finalizer and allocation are one
  write here: the allocation's answer ends it). A change the watch shows meanwhile is
  not queued; its version is kept and compared with the answer: a newer one is news,
  and the claim is queued then (:meth:`InFlight.written` says so).
* ``WRITTEN``: the API server answered 2xx. Its answer is laid over the informer's copy
  (client-go's assume cache) until the watch shows that version or a newer one; a held
  allocation is now the answer's, which the allocator's state keeps.
* ``ECHOED``: the informer shows our version or a newer one: its copy is the truth again.
  The node of an allocation we wrote is remembered (:attr:`InFlight.written_nodes`)
  until it is taken back: the scheduler clearing it then names a rejected node.
* ``FAILED``: the write was refused (a conflict, a 404, anything else) or abandoned
  (leadership lost, the worker cancelled): a hold is dropped, so the allocator's state
  is built anew without it; the caller reads the claim again or queues it.
* ``RELEASED``: the claim was deleted while its decision was held or its write in
  flight: the hold is dropped at once, and the write's outcome, when it comes, only
  ends the record.

The drawing shows a claim's first allocation; :data:`TRANSITIONS` holds every move (a
claim at rest is decided or written again: a cleared allocation, a deallocation, a
write that is not an allocation starts at ``WRITING``). A move not in it is refused:
logged and counted (:attr:`InFlight.refused`, and the metrics), the record left as it
was. A decision's capacity is held while the claim is ``DECIDED`` and then ``WRITING``;
from ``WRITTEN`` on, the claim's allocated copy (ours, then the informer's) holds it,
so no device is given twice and none is kept for a decision that failed. Nothing here
is persisted: a new leader rebuilds from the informer's claims.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from dra_driver.allocator import Allocation
from dra_driver.core import claim_shape
from dra_driver.k8s.rest import JsonObj

log = logging.getLogger(__name__)


class Phase(enum.Enum):
    DECIDED = "decided"
    WRITING = "writing"
    WRITTEN = "written"
    ECHOED = "echoed"
    FAILED = "failed"
    RELEASED = "released"


TRANSITIONS: Mapping[Phase | None, frozenset[Phase | None]] = {
    None: frozenset({Phase.DECIDED, Phase.WRITING}),
    Phase.DECIDED: frozenset({Phase.WRITING, Phase.FAILED, Phase.RELEASED}),
    Phase.WRITING: frozenset({Phase.WRITTEN, Phase.FAILED, Phase.RELEASED}),
    Phase.WRITTEN: frozenset({Phase.ECHOED, Phase.DECIDED, Phase.WRITING, None}),
    Phase.ECHOED: frozenset({Phase.DECIDED, Phase.WRITING, None}),
    Phase.FAILED: frozenset({Phase.DECIDED, Phase.WRITING, None}),
    Phase.RELEASED: frozenset({None}),
}
"""Phase -> the phases it may move to (None: no record, a claim with nothing in flight)."""

HELD = frozenset({Phase.DECIDED, Phase.WRITING})
"""The phases in which a claim's decided allocation is held for it."""


@dataclass(frozen=True)
class Hold:
    """An allocation decided and not yet answered, as the allocator's state records it."""

    namespace: str
    allocation: Allocation


@dataclass(slots=True)
class Flight:
    """One claim's record."""

    phase: Phase
    node: str | None = None
    """The node of an allocation we wrote and did not take back (None: none)."""
    mine: JsonObj | None = None
    """Our newest answer (or read), until the informer shows its version or a newer one."""
    seen: int = 0
    """The newest version the watch showed while ``WRITING``."""


class ClaimsSeen(Protocol):
    """The informer's claims, as this module reads them."""

    def get(self, uid: str) -> JsonObj | None: ...

    def uids(self) -> set[str]: ...


class Ledger(Protocol):
    """What a hold does to the allocator's state (:class:`~.ledger_cache.LedgerCache`)."""

    def record(self, namespace: str, allocation: Allocation) -> None: ...

    def hold_written(self, uid: str) -> None: ...

    def invalidate(self) -> None: ...


class InFlight:
    """Every claim's in-flight record, keyed by UID."""

    def __init__(
        self,
        claims: ClaimsSeen,
        ledger: Ledger,
        on_refused: Callable[[str, str], None] = lambda from_phase, to_phase: None,
    ) -> None:
        """``on_refused(from, to)``: a move was refused (the metrics count it)."""
        self._claims = claims
        self._ledger = ledger
        self._on_refused = on_refused
        self._flights: dict[str, Flight] = {}
        self.holds: dict[str, Hold] = {}
        """Claim UID -> its held allocation (``DECIDED`` or ``WRITING``): what the
        allocator's state lays over the allocated claims when it is built."""
        self._assumed: set[str] = set()
        """The claims whose record holds a copy of ours (:attr:`Flight.mine`): the
        change router reads them on every freed allocation, a pass over every record
        would cost as much as the claims we wrote."""
        self.written_nodes: Mapping[str, str] = _WrittenNodes(self._flights)
        """Claim UID -> node of an allocation we wrote and did not take back."""
        self.refused: Counter[tuple[Phase | None, Phase | None]] = Counter()
        """Moves refused (not in :data:`TRANSITIONS`), by (from, to)."""

    # --- reading ---------------------------------------------------------------------

    def phase(self, uid: str) -> Phase | None:
        flight = self._flights.get(uid)
        return flight.phase if flight is not None else None

    def current(self, uid: str) -> JsonObj | None:
        """The claim: the newer of the informer's copy and ours."""
        seen = self._claims.get(uid)
        flight = self._flights.get(uid)
        mine = flight.mine if flight is not None else None
        if mine is not None and (
            seen is None or claim_shape.resource_version(mine) > claim_shape.resource_version(seen)
        ):
            return mine
        return seen

    def all(self) -> list[JsonObj]:
        uids = self._claims.uids() | set(self.assumed_uids())
        return [c for c in (self.current(u) for u in uids) if c is not None]

    def assumed_uids(self) -> Iterator[str]:
        """The claims whose copy of ours the informer has not caught up with."""
        return iter(self._assumed)

    # --- moves -----------------------------------------------------------------------

    def decided(self, uid: str, namespace: str, allocation: Allocation) -> None:
        """An allocation is chosen for the claim: held from now on."""
        if self._move(uid, Phase.DECIDED) is None:
            return
        # Recorded first: a state built by this call must not lay the hold over as well.
        self._ledger.record(namespace, allocation)
        self.holds[uid] = Hold(namespace, allocation)

    def writing(self, uid: str) -> None:
        """The claim's write is about to be sent."""
        flight = self._move(uid, Phase.WRITING)
        if flight is not None:
            flight.seen = 0

    def answered(self, claim: JsonObj) -> None:
        """One answer of a write still ``WRITING`` (a decision's finalizer): laid over."""
        flight = self._flights.get(claim_shape.key(claim))
        if flight is not None and flight.phase is not Phase.RELEASED:
            self._assume(flight, claim)

    def refreshed(self, claim: JsonObj) -> None:
        """The claim as read back after its write failed (a conflict): laid over as an
        answer is, so the next decision reads it even before the watch shows it."""
        self.answered(claim)

    def written(self, claim: JsonObj, *, allocated_on: str | None = None) -> bool:
        """The write is answered with ``claim``; ``allocated_on``: it wrote an allocation
        on that node ("" for none). True when the watch showed a newer version
        meanwhile: news that was not queued, the caller queues the claim."""
        uid = claim_shape.key(claim)
        flight = self._flights.get(uid)
        if flight is not None and flight.phase is Phase.RELEASED:
            self._move(uid, None)  # deleted meanwhile: the answer is of no claim
            return False
        flight = self._move(uid, Phase.WRITTEN)
        if flight is None:
            return False
        self._assume(flight, claim)
        if self.holds.pop(uid, None) is not None:
            self._ledger.hold_written(uid)
        if allocated_on is not None:
            flight.node = allocated_on
        if flight.mine is None:  # the watch showed this answer before it came
            self._move(uid, Phase.ECHOED)
        return flight.seen > claim_shape.resource_version(claim)

    def failed(self, uid: str, why: BaseException | str) -> None:
        """The write was refused or abandoned: its hold goes."""
        flight = self._flights.get(uid)
        if flight is not None and flight.phase is Phase.RELEASED:
            self._move(uid, None)
            return
        if self._move(uid, Phase.FAILED) is None:
            return
        log.debug("claim %s: in-flight write failed: %s", uid, why)
        self._drop_hold(uid)

    def abandon(self, uid: str, why: BaseException) -> None:
        """The claim's work ended: a decision still ``DECIDED`` (never sent) fails; a
        write the writer holds ends there, and nothing else is in flight."""
        if self.phase(uid) is Phase.DECIDED:
            self.failed(uid, why)

    def took_back(self, uid: str) -> None:
        """The allocation we wrote is ours no more (cleared, deallocated by us)."""
        flight = self._flights.get(uid)
        if flight is not None:
            flight.node = None

    def released(self, uid: str) -> None:
        """The claim is deleted: whatever it held goes, and its record with it (once the
        write in flight, if any, has its outcome)."""
        flight = self._flights.get(uid)
        if flight is None:
            return
        if flight.phase in HELD:
            self._move(uid, Phase.RELEASED)
            self._lay_over(uid, flight, None)
            flight.node = None
            self._drop_hold(uid)
        else:
            self._move(uid, None)

    def retain(self, uids: set[str]) -> None:
        """After a relist: the records of claims no longer listed go (deleted while the
        watch was down), but a write in flight keeps its own until its outcome."""
        for uid in [u for u in self._flights if u not in uids]:
            self.released(uid)

    def observed(self, claim: JsonObj) -> bool:
        """The informer shows ``claim`` (an event of its watch). True when this is no
        news, not to be queued: a version up to our last answer (each of our writes is
        guarded by the version it was based on, so every version up to it is one that
        we wrote, wrote upon or decided upon), or any version while the claim is
        ``WRITING`` (kept to compare with the answer). Our copy goes once the
        informer's is as new: ``WRITTEN`` becomes ``ECHOED``."""
        uid = claim_shape.key(claim)
        flight = self._flights.get(uid)
        if flight is None:
            return False
        version = claim_shape.resource_version(claim)
        writing = flight.phase is Phase.WRITING
        if writing:
            flight.seen = max(flight.seen, version)
        mine = flight.mine
        if mine is None:
            return writing
        ours = claim_shape.resource_version(mine)
        if version >= ours:
            self._lay_over(uid, flight, None)
            if flight.phase is Phase.WRITTEN:
                self._move(uid, Phase.ECHOED)
        return writing or version <= ours

    # --- inside ----------------------------------------------------------------------

    def _move(self, uid: str, to: Phase | None) -> Flight | None:
        """The claim's record moved to ``to`` (None: gone); None when the table refuses."""
        flight = self._flights.get(uid)
        now = flight.phase if flight is not None else None
        if to not in TRANSITIONS[now]:
            self.refused[(now, to)] += 1
            self._on_refused(_name(now), _name(to))
            log.warning(
                "claim %s: in-flight move %s -> %s refused (not in the table); left %s",
                uid,
                _name(now),
                _name(to),
                _name(now),
            )
            return None
        if to is None:
            self._flights.pop(uid, None)
            self._assumed.discard(uid)
            self._drop_hold(uid)
            return None
        if flight is None:
            flight = self._flights[uid] = Flight(to)
        flight.phase = to
        return flight

    def _assume(self, flight: Flight, claim: JsonObj) -> None:
        """``claim`` laid over the informer's copy, unless that is as new already."""
        uid = claim_shape.key(claim)
        seen = self._claims.get(uid)
        if seen is None or claim_shape.resource_version(claim) > claim_shape.resource_version(seen):
            self._lay_over(uid, flight, claim)

    def _lay_over(self, uid: str, flight: Flight, mine: JsonObj | None) -> None:
        flight.mine = mine
        if mine is None:
            self._assumed.discard(uid)
        else:
            self._assumed.add(uid)

    def _drop_hold(self, uid: str) -> None:
        if self.holds.pop(uid, None) is not None:
            self._ledger.invalidate()  # the state must not keep it: built anew without


def _name(phase: Phase | None) -> str:
    return phase.value if phase is not None else "none"


class _WrittenNodes(Mapping[str, str]):
    """The written nodes, read from the records (what :func:`~.reconcile.decide` reads)."""

    def __init__(self, flights: dict[str, Flight]) -> None:
        self._flights = flights

    def __getitem__(self, uid: str) -> str:
        flight = self._flights[uid]
        if flight.node is None:
            raise KeyError(uid)
        return flight.node

    def __contains__(self, uid: object) -> bool:
        flight = self._flights.get(uid) if isinstance(uid, str) else None
        return flight is not None and flight.node is not None

    def __iter__(self) -> Iterator[str]:
        return (uid for uid, f in self._flights.items() if f.node is not None)

    def __len__(self) -> int:
        return sum(1 for f in self._flights.values() if f.node is not None)
