"""A claim's in-flight life (dra_driver/controller/inflight.py) driven through every move of
its table, over a real allocator state (:class:`~dra_driver.controller.ledger_cache.LedgerCache`
on two H100s): after each step the capacity held is checked twice, in the state kept
across claims and in one built anew from the caches, so a hold counted twice, kept after
its write failed or lost on a rebuild shows."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import generate_latest

from dra_driver.allocator import Allocation, SelectorCache
from dra_driver.base.errors import ApiConflictError, ApiNotFoundError
from dra_driver.controller.claim_writes import ClaimWriter
from dra_driver.controller.inflight import HELD, TRANSITIONS, InFlight, Phase
from dra_driver.controller.informer import CLAIMS, Informer
from dra_driver.controller.ledger_cache import LedgerCache, Sources
from dra_driver.controller.metrics import PREFIX, ControllerMetrics
from dra_driver.core.claim_shape import is_allocated
from tests.support.allocator import CLASSES, DRIVER, claim, request, slices
from tests.support.transport import UNUSED_HOST, transport_to

JsonObj = dict[str, Any]
GI = 2**30
SHARE = 70 * GI
"""Each claim's share: two never fit on one GPU of 80 GB."""


class World:
    """The informer's claims, the allocator's state kept across claims, the records."""

    def __init__(self) -> None:
        self.informer = Informer(transport_to(UNUSED_HOST), CLAIMS)
        self.slices = slices("h100-80gb:2")
        self.ledger = LedgerCache(
            DRIVER,
            Sources(
                slices=lambda: self.slices,
                classes=lambda: CLASSES,
                allocated_claims=lambda: self.inflight.all(),  # noqa: PLW0108 - built after
                holds=lambda: self.inflight.holds,
            ),
            SelectorCache(),
        )
        self.metrics = ControllerMetrics()
        self.inflight = InFlight(self.informer, self.ledger, self.metrics.move_refused)
        self._ids = (f"00000000-0000-0000-0000-{n:012d}" for n in itertools.count())
        self.allocations: dict[str, Allocation] = {}
        self.base = self._free()

    def claim(self, uid: str, version: int, *, allocated: bool = False) -> JsonObj:
        obj = claim(request(memory="70Gi"), name=uid)
        obj["metadata"].update(uid=uid, resourceVersion=str(version))
        if allocated:
            status = self.allocations[uid].to_status("2026-01-01T00:00:00Z")
            obj["status"] = {"allocation": status}
        return obj

    def decide(self, uid: str) -> Allocation | None:
        """The allocator's answer for the claim from the kept state, held if any."""
        outcome = self.ledger.state().allocate(
            self.claim(uid, 1), record=False, share_id=lambda: next(self._ids)
        )
        if outcome.allocation is not None:
            self.allocations[uid] = outcome.allocation
            self.inflight.decided(uid, "default", outcome.allocation)
        return outcome.allocation

    def show(self, obj: JsonObj) -> bool:
        """The watch brings ``obj``, handled as the controller handles it; True: no news
        (not queued)."""
        uid = obj["metadata"]["uid"]
        self.informer.objects.put(uid, obj)
        known = self.inflight.observed(obj)
        current = self.inflight.current(uid)
        if current is not None:
            self.ledger.claim_seen(current)
        return known

    def delete(self, uid: str) -> None:
        """The watch shows the claim deleted, handled as the controller handles it."""
        gone = self.informer.objects.get(uid) or self.claim(uid, 99)
        self.informer.objects.pop(uid)
        self.inflight.observed(gone)
        self.inflight.released(uid)
        self.ledger.claim_gone(uid)

    def _free(self) -> int:
        return sum(d.free for d in self.ledger.state().free_memory())

    def held(self) -> int:
        """Bytes held now, the same in the kept state and in one built anew."""
        kept = self.base - self._free()
        self.ledger.invalidate()
        rebuilt = self.base - self._free()
        assert kept == rebuilt, f"kept state holds {kept}, a rebuilt one {rebuilt}"
        return kept


@pytest.fixture
def world() -> World:
    return World()


def test_echo_after_the_answer(world: World) -> None:
    world.show(world.claim("a", 1))
    assert world.decide("a") is not None
    assert world.inflight.phase("a") is Phase.DECIDED and world.held() == SHARE
    world.inflight.writing("a")
    assert world.inflight.phase("a") is Phase.WRITING and world.held() == SHARE
    answer = world.claim("a", 3, allocated=True)
    assert not world.inflight.written(answer, allocated_on="node-a")
    assert world.inflight.phase("a") is Phase.WRITTEN and not world.inflight.holds
    assert world.inflight.current("a") == answer  # ours, the informer still shows v1
    assert world.held() == SHARE  # now as the allocated claim (ours)
    assert world.show(answer)  # its echo: no news
    assert world.inflight.phase("a") is Phase.ECHOED
    assert world.held() == SHARE  # as the informer's claim
    assert dict(world.inflight.written_nodes) == {"a": "node-a"}


def test_echo_before_the_answer(world: World) -> None:
    world.show(world.claim("a", 1))
    world.decide("a")
    world.inflight.writing("a")
    finalizer = world.claim("a", 2)
    world.inflight.answered(finalizer)  # the finalizer's answer, the allocation in flight
    assert world.show(finalizer)  # its echo, even before the allocation's answer
    assert world.inflight.phase("a") is Phase.WRITING and world.held() == SHARE
    answer = world.claim("a", 3, allocated=True)
    assert world.show(answer)  # the allocation's echo before its own answer
    assert world.held() == SHARE  # once: the hold, not the informer's copy as well
    assert not world.inflight.written(answer, allocated_on="node-a")  # nothing newer seen
    assert world.inflight.phase("a") is Phase.ECHOED  # the informer is as new already
    assert world.held() == SHARE


def test_a_change_newer_than_the_answer_seen_while_writing_is_news(world: World) -> None:
    world.show(world.claim("a", 1))
    world.decide("a")
    world.inflight.writing("a")
    assert world.show(world.claim("a", 5))  # someone else's write after ours: kept for later
    assert world.inflight.written(world.claim("a", 3, allocated=True))  # then queued


def test_a_stale_echo_changes_nothing(world: World) -> None:
    world.show(world.claim("a", 1))
    world.decide("a")
    world.inflight.writing("a")
    answer = world.claim("a", 3, allocated=True)
    world.inflight.written(answer, allocated_on="node-a")
    assert world.show(world.claim("a", 2))  # older than our answer: no news
    assert world.inflight.phase("a") is Phase.WRITTEN
    assert world.inflight.current("a") == answer
    assert world.held() == SHARE


def test_a_conflict_gives_the_hold_back_and_the_claim_is_decided_again(world: World) -> None:
    world.show(world.claim("a", 1))
    world.decide("a")
    world.inflight.writing("a")
    world.inflight.failed("a", ApiConflictError("conflict", status=409))
    assert world.inflight.phase("a") is Phase.FAILED and world.held() == 0
    fresh = world.claim("a", 4)  # read back after the conflict
    world.inflight.refreshed(fresh)
    assert world.inflight.current("a") == fresh
    assert world.decide("a") is not None
    assert world.inflight.phase("a") is Phase.DECIDED and world.held() == SHARE


def test_a_claim_deleted_under_its_write_gives_the_hold_back(world: World) -> None:
    world.show(world.claim("a", 1))
    world.decide("a")
    world.inflight.writing("a")
    world.inflight.failed("a", ApiNotFoundError("not found", status=404))
    assert world.held() == 0
    world.delete("a")
    assert world.inflight.phase("a") is None and world.held() == 0


@pytest.mark.parametrize("outcome", ["answered", "refused"])
def test_a_release_while_writing_drops_the_hold_and_then_the_outcome(
    world: World, outcome: str
) -> None:
    world.show(world.claim("a", 1))
    world.decide("a")
    world.inflight.writing("a")
    world.delete("a")
    assert world.inflight.phase("a") is Phase.RELEASED and world.held() == 0
    if outcome == "answered":  # the patch landed before the delete
        assert not world.inflight.written(world.claim("a", 3, allocated=True), allocated_on="n")
    else:
        world.inflight.failed("a", ApiNotFoundError("not found", status=404))
    assert world.inflight.phase("a") is None
    assert world.inflight.current("a") is None  # no copy of a deleted claim laid over
    assert world.held() == 0 and not world.inflight.refused


def test_no_device_is_given_twice(world: World) -> None:
    for uid in ("a", "b", "c"):
        world.show(world.claim(uid, 1))
    first, second = world.decide("a"), world.decide("b")
    assert first is not None and second is not None
    assert first.results[0].device != second.results[0].device
    assert world.decide("c") is None  # both GPUs held while their writes are in flight
    assert world.held() == 2 * SHARE
    assert first is not None
    world.inflight.decided("a", "default", first)  # decided twice: refused, held once
    assert world.inflight.refused == {(Phase.DECIDED, Phase.DECIDED): 1}
    assert world.held() == 2 * SHARE


def test_a_move_not_in_the_table_is_refused_logged_and_counted(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    world.show(world.claim("a", 1))
    with caplog.at_level(logging.WARNING, logger="dra_driver.controller.inflight"):
        assert not world.inflight.written(world.claim("a", 3), allocated_on="n")
    assert world.inflight.refused == {(None, Phase.WRITTEN): 1}
    assert "in-flight move none -> written refused" in caplog.text
    scraped = generate_latest(world.metrics.registry).decode()
    assert f'{PREFIX}_inflight_moves_refused_total{{from="none",to="written"}} 1.0' in scraped
    assert world.inflight.phase("a") is None
    assert version(world.inflight.current("a")) == "1"


class BlockedApi:
    """The transport's ``send_json``: a PATCH that hangs until released (the API server
    slow to answer)."""

    def __init__(self) -> None:
        self.sent = asyncio.Event()
        self.release = asyncio.Event()

    async def send_json(self, method: str, path: str, body: JsonObj, **_: Any) -> JsonObj:
        self.sent.set()
        await asyncio.wait_for(self.release.wait(), 10)
        raise ApiConflictError("too late", status=409)


def test_leadership_lost_mid_write_gives_the_hold_back(world: World) -> None:
    api = BlockedApi()

    class Events:
        def post(self, claim: JsonObj, reason: str, message: str, kind: str = "") -> None:
            pass

    writer = ClaimWriter(api, world.inflight, Events())  # type: ignore[arg-type]
    base = world.claim("a", 1)
    world.show(base)
    allocation = world.decide("a")
    assert allocation is not None

    async def scenario() -> None:
        write = asyncio.create_task(writer.allocate(base, allocation, node="node-a"))
        while not api.sent.is_set():
            await asyncio.sleep(0.001)
        assert world.inflight.phase("a") is Phase.WRITING and world.held() == SHARE
        write.cancel()  # the worker cancelled: the Lease is lost
        with pytest.raises(asyncio.CancelledError):
            await write

    asyncio.run(scenario())
    assert world.inflight.phase("a") is Phase.FAILED and world.held() == 0
    assert not world.inflight.refused


# --- the table, every move ---------------------------------------------------------------

Step = Callable[[World], None]


def _decide(w: World) -> None:
    w.decide("a")


def _write(w: World) -> None:
    w.inflight.writing("a")


def _answer(w: World) -> None:
    """The allocation's answer."""
    w.inflight.written(w.claim("a", _next_version(w), allocated=True), allocated_on="n")


def _plain(w: World) -> None:
    """Another write's answer (the rejected node's annotation, a deallocation)."""
    w.inflight.written(w.claim("a", _next_version(w)))


def _echo(w: World) -> None:
    mine = w.inflight.current("a")
    assert mine is not None
    w.show(mine)


def _clear(w: World) -> None:
    """The scheduler clears the allocation: a newer version, unallocated."""
    w.show(w.claim("a", _next_version(w)))


def _fail(w: World) -> None:
    w.inflight.failed("a", "refused")


def _abandon(w: World) -> None:
    w.inflight.abandon("a", asyncio.CancelledError())


def _delete(w: World) -> None:
    w.delete("a")


def _next_version(w: World) -> int:
    current = w.inflight.current("a")
    return int(current["metadata"]["resourceVersion"]) + 1 if current else 2


WALKS: list[list[Step]] = [
    [_decide, _write, _answer, _echo, _clear, _decide, _abandon, _write, _fail, _decide],
    [_write, _plain, _write, _plain, _echo, _write, _fail, _write, _fail, _delete],
    [_write, _plain, _decide, _delete, _answer],
    [_write, _plain, _delete],
    [_decide, _write, _answer, _echo, _delete],
    [_decide, _delete, _fail],
    [_decide, _write, _delete, _fail],
]
"""Walks through the table from a fresh claim, each step a call the controller makes."""


def test_every_move_in_the_table_is_driven() -> None:
    moved: set[tuple[Phase | None, Phase | None]] = set()
    for walk in WALKS:
        w = World()
        w.show(w.claim("a", 1))
        deciding = False  # a decision taken and not yet answered, refused or released
        for step in walk:
            before = w.inflight.phase("a")
            step(w)
            after = w.inflight.phase("a")
            if after is not before:
                moved.add((before, after))
            deciding = (deciding or step is _decide) and after in HELD
            current = w.inflight.current("a")
            allocated = current is not None and is_allocated(current)
            assert w.held() == (SHARE if deciding or allocated else 0), (walk, step)
            # Ours is listed as laid over exactly while it is what the claim reads as.
            ours = current is not None and current is not w.informer.get("a")
            assert ("a" in set(w.inflight.assumed_uids())) == ours, (walk, step)
        assert not w.inflight.refused, walk
    table = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert moved == table, sorted(map(str, table - moved))


# --- our answers laid over the informer's claims (client-go's assume cache) ---------------


def version(obj: JsonObj | None) -> str:
    assert obj is not None
    return str(obj["metadata"]["resourceVersion"])


def test_our_answer_is_read_until_the_informer_shows_it(world: World) -> None:
    world.show(world.claim("a", 3))
    world.inflight.writing("a")
    world.inflight.written(world.claim("a", 5))
    assert version(world.inflight.current("a")) == "5"
    world.informer.objects.put("a", world.claim("a", 4))
    assert version(world.inflight.current("a")) == "5"
    world.informer.objects.put("a", world.claim("a", 6))
    assert version(world.inflight.current("a")) == "6"


def test_versions_up_to_our_last_answer_are_no_news_and_a_newer_one_is(world: World) -> None:
    world.show(world.claim("a", 3))
    world.inflight.writing("a")
    world.inflight.written(world.claim("a", 5))
    assert world.show(world.claim("a", 4))  # what our write was based on
    assert list(world.inflight.assumed_uids()) == ["a"]  # still ours: the informer is behind
    assert world.show(world.claim("a", 5))  # the echo of our write
    assert not list(world.inflight.assumed_uids())
    world.inflight.writing("a")
    world.inflight.written(world.claim("a", 7))
    assert not world.show(world.claim("a", 8))  # someone else wrote after us
    assert not list(world.inflight.assumed_uids())


def test_a_claim_we_never_wrote_is_news(world: World) -> None:
    assert not world.show(world.claim("a", 3))
    assert not world.show(world.claim("other", 1))


def test_all_lays_ours_over_the_informers(world: World) -> None:
    world.show(world.claim("a", 3))
    world.show(world.claim("b", 2))
    world.inflight.writing("c")
    world.inflight.written(world.claim("c", 9))  # the informer does not show it yet
    world.inflight.writing("a")
    world.inflight.written(world.claim("a", 1))  # older than the informer's: not laid over
    assert sorted(version(c) for c in world.inflight.all()) == ["2", "3", "9"]


def test_a_relist_drops_the_records_of_claims_gone_but_not_a_write_in_flight(
    world: World,
) -> None:
    for uid in ("a", "b"):
        world.show(world.claim(uid, 1))
    world.inflight.writing("a")
    world.inflight.written(world.claim("a", 2), allocated_on="n")
    world.decide("b")
    world.inflight.writing("b")
    world.informer.objects.pop("a")
    world.informer.objects.pop("b")
    world.inflight.retain(world.informer.uids())
    assert world.inflight.phase("a") is None and not world.inflight.written_nodes
    assert world.inflight.phase("b") is Phase.RELEASED and world.held() == 0
