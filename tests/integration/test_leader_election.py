"""Leader election with client-go's semantics (issue 34, item 3): never two leaders.

Two candidates share one in-memory Lease store that behaves as the API server does
for a Lease (resourceVersion guard: a stale write gets 409). Short timings (lease
2 s, whole seconds as the API keeps it; renew deadline 1.2 s, renew 0.3 s, retry
0.1 s) keep the runs to a few seconds. Each candidate's ``leading`` flag is sampled
every 10 ms; the tests assert that no sample has both leading, and that expiry never
depends on a holder's ``renewTime`` (a clock skewed an hour either way changes
nothing).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
from collections.abc import Callable

import pytest

from dra_driver.base.errors import ApiConflictError, LeadershipLostError
from dra_driver.controller.leader import LeaderElector, Observed, lease_action, observe
from dra_driver.k8s.rest import JsonObj

LEASE, DEADLINE, RENEW, RETRY = 2.0, 1.2, 0.3, 0.1


class LeaseStore:
    """One Lease as the API server keeps it: a create of an existing one and a patch
    naming an older resourceVersion are conflicts."""

    def __init__(self) -> None:
        self.lease: JsonObj | None = None
        self.version = 0

    def _bump(self, spec: JsonObj) -> None:
        self.version += 1
        self.lease = {
            "metadata": {"name": "l", "namespace": "ns", "resourceVersion": str(self.version)},
            "spec": copy.deepcopy(spec),
        }


class StoreApi:
    """One candidate's view of the store; ``hang_patches`` makes its PATCHes never answer."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.hang_patches = False

    async def get(self) -> JsonObj | None:
        await asyncio.sleep(0)
        return copy.deepcopy(self.store.lease)

    async def create(self, body: JsonObj) -> None:
        if self.store.lease is not None:
            raise ApiConflictError("POST lease: 409 AlreadyExists")
        self.store._bump(body["spec"])

    async def patch(self, lease: JsonObj, spec: JsonObj) -> None:
        if self.hang_patches:
            await asyncio.Event().wait()  # a PATCH the API server never answers
        current = self.store.lease
        if (
            current is None
            or current["metadata"]["resourceVersion"] != (lease["metadata"]["resourceVersion"])
        ):
            raise ApiConflictError("PATCH lease: 409 Conflict")
        self.store._bump(spec)


def candidate(
    store: LeaseStore, identity: str, skew: datetime.timedelta = datetime.timedelta(0)
) -> tuple[LeaderElector, StoreApi]:
    api = StoreApi(store)
    elector = LeaderElector(
        api,
        name="l",
        namespace="ns",
        identity=identity,
        lease_duration_s=LEASE,
        renew_deadline_s=DEADLINE,
        renew_interval_s=RENEW,
        retry_interval_s=RETRY,
        wall_clock=lambda: datetime.datetime.now(datetime.UTC) + skew,
    )
    return elector, api


async def sample(
    electors: list[LeaderElector], seconds: float, until: Callable[[], bool] = lambda: False
) -> list[tuple[float, tuple[bool, ...]]]:
    """Every 10 ms, who leads; stops early once ``until()``."""
    loop = asyncio.get_running_loop()
    out = []
    end = loop.time() + seconds
    while loop.time() < end and not until():
        out.append((loop.time(), tuple(e.leading.is_set() for e in electors)))
        await asyncio.sleep(0.01)
    return out


def never_two(samples: list[tuple[float, tuple[bool, ...]]]) -> None:
    both = [t for t, flags in samples if sum(flags) > 1]
    assert not both, f"two leaders at once at {len(both)} samples"


# --- the pure rules ---------------------------------------------------------------------


def held(holder: str, renew: str = "2026-01-01T00:00:00.000000Z", duration: int = 15) -> JsonObj:
    return {
        "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}
    }


def test_expiry_counts_from_when_the_record_was_seen_to_change() -> None:
    lease = held("a")
    seen = observe(None, lease, 100.0)
    assert seen == Observed(("a", "2026-01-01T00:00:00.000000Z", "", 15, 0), 100.0)
    assert lease_action(lease, "b", 100.0, seen) == "wait"
    assert lease_action(lease, "b", 114.9, observe(seen, lease, 114.9)) == "wait"
    assert lease_action(lease, "b", 115.0, observe(seen, lease, 115.0)) == "take"
    # A renewal (a new renewTime, whatever it says) is a change: the wait starts again.
    renewed = held("a", renew="1999-01-01T00:00:00.000000Z")
    again = observe(seen, renewed, 114.0)
    assert again is not None and again.at == 114.0
    assert lease_action(renewed, "b", 128.9, again) == "wait"


def test_the_holder_renews_and_a_free_lease_is_taken() -> None:
    assert lease_action(None, "b", 0.0, None) == "take"
    assert lease_action(held("a"), "a", 0.0, None) == "renew"
    assert lease_action(held(""), "b", 0.0, observe(None, held(""), 0.0)) == "take"


# --- two candidates -----------------------------------------------------------------------


@pytest.mark.parametrize("hours", [-1, 1], ids=["leader-an-hour-behind", "leader-an-hour-ahead"])
def test_a_skewed_renew_time_never_makes_two_leaders(hours: int) -> None:
    """The leader's clock is an hour off. A candidate comparing its renewTime with its
    own wall clock would take a live Lease (behind) or wait an hour for a dead one
    (ahead); judged by its own observation it does neither."""

    async def scenario() -> None:
        store = LeaseStore()
        one, _ = candidate(store, "one", datetime.timedelta(hours=hours))
        two, _ = candidate(store, "two")
        first = asyncio.create_task(one.run())
        await asyncio.wait_for(one.leading.wait(), 2)
        second = asyncio.create_task(two.run())
        samples = await sample([one, two], 1.5 * LEASE)  # past a lease duration
        never_two(samples)
        assert one.leading.is_set() and not two.leading.is_set()
        # The leader dies without releasing: "two" takes over a lease duration after it
        # last saw the record change, not an hour off.
        first.cancel()
        one.is_leader = False  # died: no release
        await asyncio.gather(first, return_exceptions=True)
        loop = asyncio.get_running_loop()
        died = loop.time()
        await asyncio.wait_for(two.leading.wait(), LEASE + 1)
        # Not at once either (a candidate that trusted a stale renewTime would).
        assert loop.time() - died >= LEASE / 2
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)

    asyncio.run(scenario())


def test_a_hung_renewal_ends_leadership_before_another_can_take_the_lease() -> None:
    """The leader's PATCH never answers. It stops leading at the renew deadline
    (counted from the start of its last good renewal) and exits; the other candidate
    takes the Lease only once a lease duration has passed since it saw the last
    renewal, so the two never lead at once."""

    async def scenario() -> None:
        store = LeaseStore()
        one, one_api = candidate(store, "one")
        two, _ = candidate(store, "two")
        first = asyncio.create_task(one.run())
        await asyncio.wait_for(one.leading.wait(), 2)
        second = asyncio.create_task(two.run())
        await asyncio.sleep(2 * RENEW)
        loop = asyncio.get_running_loop()
        hung = loop.time()
        one_api.hang_patches = True
        samples = await sample([one, two], 2 * LEASE + 1, until=two.leading.is_set)
        took = loop.time()  # the sampling ends when "two" leads (or times out)
        never_two(samples)
        assert two.leading.is_set(), "the other candidate never took the abandoned Lease"
        stopped = next(t for t, (a, _) in samples if not a)
        # Stopped by the deadline, well before the Lease could expire for anyone else.
        assert stopped - hung <= DEADLINE + 0.2, "the leader kept leading past its deadline"
        assert took - stopped >= (LEASE - DEADLINE) / 2, (took, stopped)
        with pytest.raises(LeadershipLostError, match="renew deadline"):
            await first
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)

    asyncio.run(scenario())


def test_a_leader_that_sees_another_holder_stops_at_once() -> None:
    async def scenario() -> None:
        store = LeaseStore()
        one, _ = candidate(store, "one")
        task = asyncio.create_task(one.run())
        await asyncio.wait_for(one.leading.wait(), 2)
        assert store.lease is not None
        spec = dict(store.lease["spec"], holderIdentity="intruder")
        store._bump(spec)
        with pytest.raises(LeadershipLostError, match="held by 'intruder'"):
            await asyncio.wait_for(task, 2)
        assert not one.leading.is_set() and one.lost.is_set()

    asyncio.run(scenario())
