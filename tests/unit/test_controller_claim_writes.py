"""A claim's finalizer and allocation in one hand-off (dra_driver/controller/claim_writes.py):
both answers laid over the informer's claims (:mod:`dra_driver.controller.inflight`), the
finalizer's echo not queued, a newer change queued, a refused finalizer or a failed
allocation handled as the two-step writes handle them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from dra_driver.allocator import Allocation
from dra_driver.base.errors import ApiConflictError, ApiError
from dra_driver.controller import claim_writes
from dra_driver.controller.claim_writes import ClaimWriter
from dra_driver.controller.inflight import InFlight, Phase
from dra_driver.controller.informer import CLAIMS, Informer
from tests.support.transport import UNUSED_HOST, transport_to

JsonObj = dict[str, Any]


def claim(version: int, **extra: Any) -> JsonObj:
    return {
        "metadata": {"uid": "u1", "name": "c1", "namespace": "ns", "resourceVersion": str(version)},
        **extra,
    }


class Api:
    """The transport's ``send_json``: answers the PATCHes in order, each a moment later
    (in flight meanwhile); an exception in ``answers`` is raised instead."""

    def __init__(self, *answers: JsonObj | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[str, JsonObj]] = []

    async def send_json(self, method: str, path: str, body: JsonObj, **_: Any) -> JsonObj:
        self.sent.append((path, body))
        await asyncio.sleep(0.01)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Ledger:
    """Counts what the in-flight records do to the allocator's state."""

    def __init__(self) -> None:
        self.recorded = self.kept = self.dropped = 0

    def record(self, namespace: str, allocation: Allocation) -> None:
        self.recorded += 1

    def hold_written(self, uid: str) -> None:
        self.kept += 1

    def invalidate(self) -> None:
        self.dropped += 1


def writer(api: Api, missed: list[str]) -> tuple[ClaimWriter, InFlight, list[str]]:
    posted: list[str] = []

    class Events:
        def post(self, claim: JsonObj, reason: str, message: str, kind: str = "") -> None:
            posted.append(reason)

    inflight = InFlight(Informer(transport_to(UNUSED_HOST), CLAIMS), Ledger())
    return (
        ClaimWriter(api, inflight, Events(), missed=missed.append),  # type: ignore[arg-type]
        inflight,
        posted,
    )


ALLOCATION = Allocation(node_name="node-a", results=(), configs=(), grants=())


def allocate(
    writes: ClaimWriter, inflight: InFlight, base: JsonObj
) -> Coroutine[Any, Any, JsonObj]:
    """A decided allocation written: the finalizer and the allocation in one hand-off."""
    inflight.decided("u1", "ns", ALLOCATION)
    return writes.allocate(base, ALLOCATION, node="node-a")


def test_both_writes_in_one_hand_off_the_second_guarded_by_the_first() -> None:
    api = Api(claim(6), claim(7, status={"allocation": {}}))
    missed: list[str] = []
    writes, inflight, _ = writer(api, missed)

    async def scenario() -> JsonObj:
        task = asyncio.create_task(allocate(writes, inflight, claim(5)))
        await asyncio.sleep(0)
        assert inflight.observed(claim(6))  # the finalizer's echo while in flight: not queued
        return await task

    answer = asyncio.run(scenario())
    assert answer == claim(7, status={"allocation": {}})
    assert [p for p, _ in api.sent] == [
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1",
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1/status",
    ]
    assert api.sent[1][1]["metadata"]["resourceVersion"] == "6"  # the first answer's
    assert inflight.current("u1") == answer and writes.writes == 2
    assert inflight.phase("u1") is Phase.WRITTEN and inflight.written_nodes == {"u1": "node-a"}
    assert not missed
    assert not inflight.observed(claim(8))  # none in flight now: news, queued as any
    assert inflight.phase("u1") is Phase.ECHOED


def test_a_change_newer_than_the_answer_seen_meanwhile_is_queued() -> None:
    api = Api(claim(6), claim(7))
    missed: list[str] = []
    writes, inflight, _ = writer(api, missed)

    async def scenario() -> None:
        task = asyncio.create_task(allocate(writes, inflight, claim(5)))
        await asyncio.sleep(0)
        inflight.observed(claim(9))  # someone else's write after ours (it cannot come before)
        await task

    asyncio.run(scenario())
    assert missed == ["u1"]


def test_a_refused_finalizer_still_allocates_with_an_event() -> None:
    api = Api(ApiError("field is immutable", status=422), claim(6))
    writes, inflight, posted = writer(api, [])
    assert asyncio.run(allocate(writes, inflight, claim(5))) == claim(6)
    assert api.sent[1][1]["metadata"]["resourceVersion"] == "5"  # on the claim as it was
    assert posted == ["MetadataWriteRefused"] and writes.writes == 1


def test_a_failed_allocation_raises_after_the_finalizer_is_assumed() -> None:
    api = Api(claim(6), ApiConflictError("conflict", status=409))
    writes, inflight, _ = writer(api, [])
    with pytest.raises(ApiConflictError):
        asyncio.run(allocate(writes, inflight, claim(5)))
    assert inflight.current("u1") == claim(6) and writes.writes == 1
    assert inflight.phase("u1") is Phase.FAILED and not inflight.holds


def test_another_failure_of_the_finalizer_writes_nothing_more() -> None:
    api = Api(ApiError("unavailable", status=503))
    writes, inflight, _ = writer(api, [])
    with pytest.raises(ApiError):
        asyncio.run(allocate(writes, inflight, claim(5)))
    assert len(api.sent) == 1 and writes.writes == 0


def test_the_claim_path_quotes_its_names_as_the_plugin_side_does() -> None:
    """One builder of a claim's URL (:func:`dra_driver.k8s.claims.claim_path`): a name is
    quoted, never spliced into the path as it is."""
    odd = {"metadata": {"uid": "u", "name": "a/b c", "namespace": "ns"}}
    base = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a%2Fb%20c"
    assert claim_writes.claim_path(odd) == base
    assert claim_writes.claim_path(odd, status=True) == base + "/status"
    assert claim_writes.claim_path({"metadata": {"name": "c"}}).startswith(
        "/apis/resource.k8s.io/v1/namespaces/default/"
    )
