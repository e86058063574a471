"""Where the controller's requests go: on the event loop when the client's configuration
allows it (:mod:`dra_driver.k8s.transport`: the informers' lists and watches, the
Lease, the claims' writes, the Events), else through the official client's transport
in threads. Both paths allocate and write the Event, under the chart's RBAC; on the
loop, no other thread opens a connection to the API server."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

from dra_driver.k8s.transport import ApiTransport
from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    allocation_of,
    events_for,
    make_claim,
    make_pod,
    running,
    seed_cluster,
    settled,
)
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi

pytestmark = pytest.mark.chart(CONTROLLER_VALUES)


def _write_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("controller-write"))


def _allocate_one(api: FakeKubeApi) -> tuple[bool, int]:
    """Allocate one claim; (the controller had a loop transport, its write threads)."""
    seed_cluster(api, {"node-a": "h100-80gb:1"})
    make_claim(api, "c1", "10Gi")
    seen: list[tuple[bool, int]] = []

    async def scenario() -> None:
        async with running(api, allocation_events=True) as controller:
            await settled(controller)
            make_pod(api, "p1", "c1")
            await eventually(lambda: allocation_of(api, "c1") is not None)
            await eventually(lambda: bool(events_for(api, "c1", "Allocated")))
            seen.append((controller._http is not None, _write_threads()))

    asyncio.run(scenario())
    return seen[0]


@contextmanager
def _connects_to(api: FakeKubeApi, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the threads that open a connection to ``api``, in order."""
    port = urlsplit(api.url).port
    threads: list[str] = []
    connect = socket.socket.connect

    def recorded(sock: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and address[1] == port:
            threads.append(threading.current_thread().name)
        connect(sock, address)

    with monkeypatch.context() as patch:
        patch.setattr(socket.socket, "connect", recorded)
        yield threads


def test_the_writes_go_on_the_loop(fake_kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    with _connects_to(fake_kube, monkeypatch) as connects:
        on_loop, threads = _allocate_one(fake_kube)
    assert on_loop
    # The informers, the Lease, the writes and the Events: from the loop's thread only.
    assert connects and set(connects) == {threading.main_thread().name}, connects
    assert threads == 0  # the pool starts its threads on a first write: none was sent there
    patches = [p for m, p in fake_kube.requests if m == "PATCH" and "/resourceclaims/" in p]
    assert len(patches) == 2, patches  # the finalizer, then the allocation


def test_the_clients_transport_where_the_loop_does_not_speak_its_configuration(
    fake_kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(cls: type[ApiTransport], api_client: object, *, max_connections: int = 100) -> None:
        return None  # as for a proxy, socket options, assert_hostname or retries

    monkeypatch.setattr(ApiTransport, "for_client", classmethod(refuse))
    with _connects_to(fake_kube, monkeypatch) as connects:
        on_loop, threads = _allocate_one(fake_kube)
    assert not on_loop
    assert threads >= 1
    # What the test above would see if a request went through a thread.
    assert threading.main_thread().name not in connects
    assert any(name.startswith("informer-") for name in connects), connects
    patches = [p for m, p in fake_kube.requests if m == "PATCH" and "/resourceclaims/" in p]
    assert len(patches) == 2, patches
