"""Lists in chunks (``limit`` and ``continue``): the fake serves them as the API server
does, and the informers' list reads them one chunk at a time."""

from __future__ import annotations

import asyncio

import pytest

from dra_driver.base.errors import ApiError
from dra_driver.fakes.objects import node_object
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.watch_loop import list_in_chunks
from tests.support.fakekube import FakeKubeApi
from tests.support.http import send_json
from tests.support.transport import transport_to

NODES = "/api/v1/nodes"


def seed(fake: FakeKubeApi, count: int) -> None:
    for i in range(count):
        fake.create(node_object(f"n{i}"))


def test_chunks_come_from_the_first_chunks_snapshot(fake_kube: FakeKubeApi) -> None:
    seed(fake_kube, 5)
    code, first = send_json(fake_kube, "GET", f"{NODES}?limit=2")
    assert code == 200
    assert [i["metadata"]["name"] for i in first["items"]] == ["n0", "n1"]
    version, token = first["metadata"]["resourceVersion"], first["metadata"]["continue"]
    assert first["metadata"]["remainingItemCount"] == 3
    fake_kube.create(node_object("late"))  # after the snapshot: not in this list
    code, second = send_json(fake_kube, "GET", f"{NODES}?limit=2&continue={token}")
    assert [i["metadata"]["name"] for i in second["items"]] == ["n2", "n3"]
    assert second["metadata"]["resourceVersion"] == version
    token = second["metadata"]["continue"]
    code, last = send_json(fake_kube, "GET", f"{NODES}?limit=2&continue={token}")
    assert [i["metadata"]["name"] for i in last["items"]] == ["n4"]
    assert last["metadata"] == {"resourceVersion": version}


def test_a_spent_or_unknown_token_is_expired_and_a_bad_limit_refused(
    fake_kube: FakeKubeApi,
) -> None:
    seed(fake_kube, 3)
    _, first = send_json(fake_kube, "GET", f"{NODES}?limit=1")
    token = first["metadata"]["continue"]
    assert send_json(fake_kube, "GET", f"{NODES}?limit=1&continue={token}")[0] == 200
    code, status = send_json(fake_kube, "GET", f"{NODES}?limit=1&continue={token}")
    assert (code, status["reason"]) == (410, "Expired")
    assert send_json(fake_kube, "GET", f"{NODES}?limit=x")[0] == 400
    code, _ = send_json(fake_kube, "GET", f"{NODES}?continue=abc&resourceVersion=1")
    assert code == 400


def test_list_in_chunks_reads_every_object_once(fake_kube: FakeKubeApi) -> None:
    seed(fake_kube, 7)
    client = transport_to(fake_kube.url)
    got: list[str] = []
    version = asyncio.run(
        list_in_chunks(client, NODES, 3, lambda o: got.append(o["metadata"]["name"]))
    )
    assert got == [f"n{i}" for i in range(7)]
    assert version == str(fake_kube.resource_version)
    lists = [r for r in fake_kube.request_log if r.path == NODES]
    assert [r.query.get("limit") for r in lists] == [["3"]] * 3
    items: list[JsonObj] = []
    whole = asyncio.run(list_in_chunks(client, NODES, 0, items.append))
    assert [i["metadata"]["name"] for i in items] == got and whole == version
    assert all(i["kind"] == "Node" and i["apiVersion"] == "v1" for i in items)


def test_a_token_that_expires_mid_list_fails_the_list(fake_kube: FakeKubeApi) -> None:
    seed(fake_kube, 4)
    client = transport_to(fake_kube.url)
    fake_kube.fail_next("GET", "continue=", 410)
    with pytest.raises(ApiError) as caught:
        asyncio.run(list_in_chunks(client, NODES, 2, lambda o: None))
    assert caught.value.status == 410
