"""The lazy node order of multi-device claims gives exactly the allocations of a full scan.

:class:`~dra_driver.allocator.ranking.LazyNodes` (best fit, first fit) against two
references, on seeded random clusters and claim sequences:

* the same policy wrapped in a plain function, which the allocator cannot recognise:
  it ranks every node up front (:class:`~dra_driver.allocator.ranking.SortedNodes`,
  the search as it was before the lazy order), and its single-device claims walk
  every device that could fit;
* :meth:`AllocatorState._search_all`, which searches every node.

Every state gets the same claims in the same order, so one difference in a placement
shows up in every later claim too.
"""

from __future__ import annotations

import heapq
import importlib
import itertools
import random
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.allocator import (
    AllocationOutcome,
    AllocatorState,
    Placement,
    Policy,
    VramQuota,
    best_fit,
    first_fit,
    sentinel_expression,
)
from dra_driver.allocator.ranking import AloneKey, LazyNodes, Ranked, SortedNodes
from dra_driver.allocator.simulate import build_cluster

DRIVER = "gpu.fractional.dev"
CLASS = "share.gpu.fractional.dev"
D = f'device.attributes["{DRIVER}"]'
GI = 2**30
NAMESPACE = "team"
SPECS = ["h100-80gb:8", "h100-80gb:4", "a100-40gb:4", "l4:4", "a100-80gb:2,l4:2", "a100-40gb:2:mig"]
SIZES = ["2Gi", "6Gi", "14Gi", "20Gi", "28Gi", "40Gi", "72Gi"]


def device_class(name: str, *selectors: str) -> dict[str, Any]:
    exprs = [sentinel_expression(DRIVER), *selectors]
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs]},
    }


CLASSES = [
    device_class(CLASS),
    device_class("gpu", f'{D}.type == "gpu"'),
    device_class("mig", f'{D}.type == "mig"'),
]


class Exhaustive(AllocatorState):
    """Searches every node for every multi-device claim."""

    def _search(
        self, claim: Any, matches: Any, policy: Any, usable: Any, budget: Any = None
    ) -> Any:
        return self._search_all(claim, matches, policy, usable, budget)


def opaque(policy: Policy) -> Policy:
    """``policy`` under another identity: the allocator ranks every node up front."""

    def wrapped(placement: Placement) -> tuple[Any, ...]:
        return policy(placement)

    return wrapped


# --- random clusters and claims ----------------------------------------------------------


def cluster(rng: random.Random) -> list[Any]:
    slices: list[Any] = []
    for n in range(rng.randint(3, 9)):
        for s in build_cluster(1, rng.choice(SPECS), kube_minor=rng.choice([34, 36])):
            spec = dict(s["spec"])
            node = f"n{n}-{rng.randint(0, 9)}"  # node names out of pool order
            spec["nodeName"] = node
            spec["pool"] = {**spec["pool"], "name": node}
            slices.append({"spec": spec})
    return slices


def exactly(rng: random.Random, name: str, **extra: Any) -> dict[str, Any]:
    cls = rng.choice([CLASS, CLASS, CLASS, "gpu", "mig"])
    body: dict[str, Any] = {"deviceClassName": cls, **extra}
    if cls != "mig" and rng.random() < 0.9:
        body["capacity"] = {"requests": {"memory": rng.choice(SIZES)}}
    if rng.random() < 0.15:
        body["selectors"] = [{"cel": {"expression": f"{D}.index < {rng.randint(1, 6)}"}}]
    if rng.random() < 0.03:
        body["adminAccess"] = True
    return body


def request(rng: random.Random, name: str, multi: bool) -> dict[str, Any]:
    roll = rng.random()
    if multi and roll < 0.15:
        alternatives = [
            {"name": f"a{i}", **exactly(rng, name, count=rng.choice([1, 1, 2, 3]))}
            for i in range(rng.randint(2, 3))
        ]
        return {"name": name, "firstAvailable": alternatives}
    if multi and roll < 0.22:
        return {"name": name, "exactly": exactly(rng, name, allocationMode="All")}
    count = rng.choice([2, 2, 2, 3, 4]) if multi else 1
    return {"name": name, "exactly": exactly(rng, name, count=count)}


def claim(rng: random.Random, number: int) -> dict[str, Any]:
    multi = rng.random() < 0.6
    requests = [request(rng, "r0", multi)]
    if multi and rng.random() < 0.3:
        requests.append(request(rng, "r1", rng.random() < 0.5))
    devices: dict[str, Any] = {"requests": requests}
    roll = rng.random()
    if roll < 0.15:
        devices["constraints"] = [{"distinctAttribute": f"{DRIVER}/uuid"}]
    elif roll < 0.2:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/productName"}]
    return {
        "metadata": {"namespace": NAMESPACE, "name": f"c{number}", "uid": f"u{number}"},
        "spec": {"devices": devices},
    }


def node_filter(rng: random.Random, slices: list[Any]) -> Callable[[str], bool] | None:
    if rng.random() < 0.6:
        return None
    nodes = sorted({s["spec"]["nodeName"] for s in slices})
    allowed = set(rng.sample(nodes, rng.randint(1, len(nodes))))
    return allowed.__contains__


def summary(outcome: AllocationOutcome, failure: bool) -> tuple[Any, ...]:
    status = None
    if outcome.allocation is not None:
        status = outcome.allocation.to_status("2026-01-01T00:00:00Z")
    return status, outcome.failure if failure else None


# --- the equivalence ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", [best_fit, first_fit], ids=["best-fit", "first-fit"])
@pytest.mark.parametrize("seed", range(10))
def test_lazy_order_allocates_as_a_full_scan(
    policy: Policy, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node's search gives up after this many steps, the same in every state; the full
    # scan backtracks on nodes the others skip, and the default budget makes it slow.
    module = importlib.import_module("dra_driver.allocator.search")
    monkeypatch.setattr(module, "SEARCH_BUDGET", 300)
    rng = random.Random(seed)
    slices = cluster(rng)

    def state(kind: type[AllocatorState] = AllocatorState) -> AllocatorState:
        return kind(slices=slices, classes=CLASSES, allocated_claims=[], driver_name=DRIVER)

    lazy, ranked, exhaustive = state(), state(), state(Exhaustive)
    runs = [(lazy, policy), (ranked, opaque(policy)), (exhaustive, policy)]
    ids = {id(s): (f"s{n}" for n in itertools.count()) for s, _ in runs}
    quota = VramQuota(NAMESPACE, rng.randint(600, 1600) * GI, f"{DRIVER}/vram-quota")
    placed = multi = 0
    for number in range(140):
        obj = claim(rng, number)
        allowed = node_filter(rng, slices)
        limit = quota if rng.random() < 0.2 else None
        outcomes = [
            s.allocate(
                obj,
                node_filter=allowed,
                policy=p,
                quota=limit,
                share_id=lambda s=s: next(ids[id(s)]),  # type: ignore[misc]
            )
            for s, p in runs
        ]
        # The lazy and the up-front order try the same nodes: identical outcomes,
        # reasons included. A full scan also tries nodes without enough devices that
        # fit alone, where a quota may refuse a first pick: under a quota its failure
        # may read "quota" where the others say "unfit"; its allocations are the same.
        assert outcomes[0] == outcomes[1], (number, obj)
        assert summary(outcomes[0], limit is None) == summary(outcomes[2], limit is None), (
            number,
            obj,
        )
        placed += outcomes[0].allocation is not None
        multi += outcomes[0].allocation is not None and len(outcomes[0].allocation.results) > 1
    # The sequences exercise the search: most claims placed, many on several devices.
    assert placed >= 25 and multi >= 8, (placed, multi)
    assert lazy.free_memory() == ranked.free_memory() == exhaustive.free_memory()


def test_lazy_order_walks_a_few_devices_not_the_cluster() -> None:
    """Two-GPU claims on a 200-node cluster: each ranks a few nodes, where ranking every
    node up front walks every device that fits."""
    slices = build_cluster(200, "h100-80gb:8")
    lazy = AllocatorState(slices=slices, classes=CLASSES, allocated_claims=[], driver_name=DRIVER)
    ranked = AllocatorState(slices=slices, classes=CLASSES, allocated_claims=[], driver_name=DRIVER)
    rng = random.Random(3)
    claims = 50
    for number in range(claims):
        size = rng.choice(SIZES[:5])
        obj = {
            "metadata": {"namespace": NAMESPACE, "name": f"c{number}", "uid": f"u{number}"},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": CLASS,
                                "count": 2,
                                "capacity": {"requests": {"memory": size}},
                            },
                        }
                    ]
                }
            },
        }
        one = lazy.allocate(obj, share_id=lambda: "s")
        other = ranked.allocate(obj, policy=opaque(best_fit), share_id=lambda: "s")
        assert one == other
    assert ranked.walked > claims * 1500  # most of the 1,600 devices, every claim
    assert lazy.walked < claims * 40, lazy.walked


# --- the node order on its own -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(30))
def test_lazy_nodes_yield_the_sorted_order(seed: int) -> None:
    """Random alone keys (ties across nodes included): the same nodes in the same order,
    with and without a best score that cuts the stream."""
    rng = random.Random(seed)
    nodes: dict[str | None, list[tuple[int, int]]] = {}
    for pos in range(rng.randint(1, 60)):
        node = rng.choice([None, *(f"node-{i}" for i in range(12))])
        nodes.setdefault(node, []).append((rng.randint(0, 15), pos))
    k = rng.randint(1, 3)

    def rank(node: str | None) -> Ranked | None:
        keys = heapq.nsmallest(k, ((key,) for key, _ in nodes[node]))
        return Ranked(tuple(keys), node or "", node) if len(keys) == k else None

    stream: list[AloneKey] = sorted(
        ((key,), pos, node) for node, keys in nodes.items() for key, pos in keys
    )
    limit = None if rng.random() < 0.5 else (rng.randint(0, 15),)

    def drain(order: LazyNodes | SortedNodes) -> list[Ranked]:
        out = []
        while (r := order.next(limit)) is not None:
            out.append(r)
        return out

    every = drain(SortedNodes(r for node in nodes if (r := rank(node)) is not None))
    lazy = drain(LazyNodes(iter(stream), rank))
    if limit is None:
        assert lazy == every
    else:  # nodes whose bound starts past the limit may be left out, no other
        assert lazy == every[: len(lazy)]
        assert all(r.bound[0] > limit for r in every[len(lazy) :])


def test_lazy_nodes_stop_reading_past_the_limit() -> None:
    read: list[int] = []

    def keys() -> Any:
        for n in range(1000):
            read.append(n)
            yield ((n,), n, f"node-{n:04d}")

    def rank(node: str | None) -> Ranked:
        n = int(str(node).removeprefix("node-"))
        return Ranked(((n,),), str(node), node)

    order = LazyNodes(keys(), rank)
    first = order.next(None)
    assert first is not None and first.node == "node-0000"
    assert order.next(first.bound[0]) is None
    assert len(read) <= 3
