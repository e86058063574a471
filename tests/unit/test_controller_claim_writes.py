"""A claim's finalizer and allocation in one hand-off (dra_driver/controller/claim_writes.py):
both answers assumed, the finalizer's echo not queued, a newer change queued, a refused
finalizer or a failed allocation handled as the two-step writes handle them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dra_driver.base.errors import ApiConflictError, ApiError
from dra_driver.controller.assume import AssumeCache
from dra_driver.controller.claim_writes import ClaimWriter
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


def writer(api: Api, missed: list[str]) -> tuple[ClaimWriter, AssumeCache, list[str]]:
    posted: list[str] = []

    class Events:
        def post(self, claim: JsonObj, reason: str, message: str, kind: str = "") -> None:
            posted.append(reason)

    assume = AssumeCache(Informer(transport_to(UNUSED_HOST), CLAIMS))
    return (
        ClaimWriter(api, assume, Events(), missed=missed.append),  # type: ignore[arg-type]
        assume,
        posted,
    )


def status(base: JsonObj) -> JsonObj:
    return {"metadata": {"resourceVersion": base["metadata"]["resourceVersion"]}, "status": {}}


def test_both_writes_in_one_hand_off_the_second_guarded_by_the_first() -> None:
    api = Api(claim(6), claim(7, status={"allocation": {}}))
    missed: list[str] = []
    writes, assume, _ = writer(api, missed)

    async def scenario() -> JsonObj:
        task = asyncio.create_task(writes.protect_and_allocate(claim(5), {"m": 1}, "f", status))
        await asyncio.sleep(0)
        assert writes.echo(claim(6))  # the finalizer's echo while in flight: not queued
        return await task

    answer = asyncio.run(scenario())
    assert answer == claim(7, status={"allocation": {}})
    assert [p for p, _ in api.sent] == [
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1",
        "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c1/status",
    ]
    assert api.sent[1][1]["metadata"]["resourceVersion"] == "6"  # the first answer's
    assert assume.current("u1") == answer and writes.writes == 2
    assert not missed
    assert not writes.echo(claim(8))  # none in flight now: news, queued as any


def test_a_change_newer_than_the_answer_seen_meanwhile_is_queued() -> None:
    api = Api(claim(6), claim(7))
    missed: list[str] = []
    writes, _, _ = writer(api, missed)

    async def scenario() -> None:
        task = asyncio.create_task(writes.protect_and_allocate(claim(5), {"m": 1}, "f", status))
        await asyncio.sleep(0)
        writes.echo(claim(9))  # someone else's write after ours (it cannot come before)
        await task

    asyncio.run(scenario())
    assert missed == ["u1"]


def test_a_refused_finalizer_still_allocates_with_an_event() -> None:
    api = Api(ApiError("field is immutable", status=422), claim(6))
    writes, _, posted = writer(api, [])
    assert asyncio.run(writes.protect_and_allocate(claim(5), {"m": 1}, "f", status)) == claim(6)
    assert api.sent[1][1]["metadata"]["resourceVersion"] == "5"  # on the claim as it was
    assert posted == ["MetadataWriteRefused"] and writes.writes == 1


def test_a_failed_allocation_raises_after_the_finalizer_is_assumed() -> None:
    api = Api(claim(6), ApiConflictError("conflict", status=409))
    writes, assume, _ = writer(api, [])
    with pytest.raises(ApiConflictError):
        asyncio.run(writes.protect_and_allocate(claim(5), {"m": 1}, "f", status))
    assert assume.current("u1") == claim(6) and writes.writes == 1


def test_another_failure_of_the_finalizer_writes_nothing_more() -> None:
    api = Api(ApiError("unavailable", status=503))
    writes, _, _ = writer(api, [])
    with pytest.raises(ApiError):
        asyncio.run(writes.protect_and_allocate(claim(5), {"m": 1}, "f", status))
    assert len(api.sent) == 1 and writes.writes == 0
