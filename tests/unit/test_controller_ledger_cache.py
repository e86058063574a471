"""The allocator's state kept across claims: decisions count at once (held by their
in-flight records, :mod:`dra_driver.controller.inflight`), failed writes and freed
allocations drop it, a rebuild keeps the holds still in flight."""

from __future__ import annotations

import itertools
from typing import Any

from dra_driver.allocator import Allocation, SelectorCache
from dra_driver.controller.inflight import InFlight, Phase
from dra_driver.controller.ledger_cache import LedgerCache, Sources
from tests.support.allocator import CLASSES, DRIVER, claim, request, slices

JsonObj = dict[str, Any]
GPUS = {"gpu-0", "gpu-1"}


class Seen:
    """The informer's claims, as the in-flight records read them."""

    def __init__(self, claims: dict[str, JsonObj]) -> None:
        self._claims = claims

    def get(self, uid: str) -> JsonObj | None:
        return self._claims.get(uid)

    def uids(self) -> set[str]:
        return set(self._claims)


class Cluster:
    """The caches a LedgerCache reads: two H100s, and the allocated claims."""

    def __init__(self) -> None:
        self.slices = slices("h100-80gb:2")
        self.allocated: dict[str, JsonObj] = {}
        self.cache = LedgerCache(
            DRIVER,
            Sources(
                slices=lambda: self.slices,
                classes=lambda: CLASSES,
                allocated_claims=lambda: list(self.allocated.values()),
                holds=lambda: self.inflight.holds,
            ),
            SelectorCache(),
        )
        self.inflight = InFlight(Seen(self.allocated), self.cache)
        self._ids = (f"00000000-0000-0000-0000-{n:012d}" for n in itertools.count())

    def decide(self, uid: str, memory: str) -> Allocation:
        """Allocate a claim of ``memory`` from the kept state, and record it as decided."""
        obj = self.claim(uid, memory)
        outcome = self.cache.state().allocate(obj, record=False, share_id=lambda: next(self._ids))
        assert outcome.allocation is not None, outcome.reason
        self.inflight.decided(uid, "default", outcome.allocation)
        return outcome.allocation

    def claim(self, uid: str, memory: str) -> JsonObj:
        obj = claim(request(memory=memory))
        obj["metadata"] = {"namespace": "default", "name": uid, "uid": uid}
        return obj

    def write(self, uid: str, allocation: Allocation) -> JsonObj:
        """The allocation as written: the claim in the caches, allocated."""
        obj = self.claim(uid, "1Gi")
        obj["status"] = {"allocation": allocation.to_status("2026-01-01T00:00:00Z")}
        self.inflight.writing(uid)
        self.inflight.written(obj, allocated_on="node-a")
        self.allocated[uid] = obj
        return obj

    def free(self) -> dict[str, int]:
        return {d.device: d.free for d in self.cache.state().free_memory()}


def gi(n: float) -> int:
    return int(n * 1024**3)


def test_a_decision_counts_before_it_is_written_and_survives_a_rebuild() -> None:
    c = Cluster()
    first = c.decide("a", "70Gi")
    # Not yet written: the next decision sees it all the same.
    second = c.decide("b", "70Gi")
    assert {first.results[0].device, second.results[0].device} == GPUS
    builds = c.cache.builds
    c.cache.invalidate()  # e.g. a slice changed while both writes are in flight
    free = c.free()
    assert c.cache.builds == builds + 1
    assert all(v < gi(10) for v in free.values()), free
    c.write("a", first)
    c.write("b", second)
    c.cache.invalidate()
    assert all(v < gi(10) for v in c.free().values())


def test_a_failed_write_gives_its_devices_back() -> None:
    c = Cluster()
    c.decide("a", "70Gi")
    c.decide("b", "70Gi")
    c.inflight.failed("a", "conflict")
    free = sorted(c.free().values())
    assert free[0] < gi(10) and free[1] > gi(70), free
    # Failing twice (a move the table refuses) changes nothing more.
    builds = c.cache.builds
    c.inflight.failed("a", "again")
    c.free()
    assert c.cache.builds == builds
    assert c.inflight.refused == {(Phase.FAILED, Phase.FAILED): 1}


def test_the_state_is_kept_across_claims_and_rebuilt_only_when_something_is_freed() -> None:
    c = Cluster()
    for n in range(4):
        c.write(f"c{n}", c.decide(f"c{n}", "10Gi"))
    assert c.cache.builds == 1
    # The informer showing our own written claims changes nothing.
    for obj in c.allocated.values():
        c.cache.claim_seen(obj)
    c.free()
    assert c.cache.builds == 1
    # Deallocated: the state goes and the next one has the memory back.
    freed = dict(c.allocated.pop("c0"))
    freed["status"] = {}
    c.cache.claim_seen(freed)
    before = sum(c.free().values())
    assert c.cache.builds == 2
    c.allocated.pop("c1")
    c.cache.claim_gone("c1")
    assert sum(c.free().values()) == before + gi(10)
    assert c.cache.builds == 3


def test_an_allocation_made_elsewhere_is_added_without_a_rebuild() -> None:
    c = Cluster()
    other = Cluster()  # another replica, before a failover
    foreign = other.write("x", other.decide("x", "70Gi"))
    c.free()
    c.allocated["x"] = foreign
    c.cache.claim_seen(foreign)
    assert c.cache.builds == 1
    assert min(c.free().values()) < gi(10)
    # Seen again (another watch event): not counted twice.
    c.cache.claim_seen(foreign)
    assert sorted(c.free().values())[1] > gi(70)
