"""Where the controller's requests go: every one on the event loop
(:mod:`dra_driver.k8s.transport`: the informers' lists and watches, the Lease, the
claims' writes, the Events), under the chart's RBAC; no other thread opens a connection
to the API server. A configuration the loop transport does not speak is refused when
the controller is built, by name: there is no thread path to fall back to."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dra_driver.app.controller import build_controller
from dra_driver.base.errors import ConfigError
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.official import Configuration
from tests.support.api_threads import connects_to
from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    allocation_of,
    controller_config,
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


def test_the_writes_go_on_the_loop(fake_kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch) -> None:
    with connects_to(fake_kube.url, monkeypatch) as connects:
        on_loop, threads = _allocate_one(fake_kube)
    assert on_loop
    # The informers, the Lease, the writes and the Events: from the loop's thread only.
    assert connects and set(connects) == {threading.main_thread().name}, connects
    assert threads == 0  # the pool starts its threads on a first write: none was sent there
    patches = [p for m, p in fake_kube.requests if m == "PATCH" and "/resourceclaims/" in p]
    assert len(patches) == 2, patches  # the finalizer, then the allocation


def test_a_configuration_the_loop_does_not_speak_is_refused(fake_kube: FakeKubeApi) -> None:
    configuration = Configuration(host=fake_kube.url)
    configuration.proxy = "socks5://127.0.0.1:1080"
    with pytest.raises(ConfigError, match="SOCKS is not spoken"):
        build_controller(KubeClient(configuration), controller_config())
    assert fake_kube.requests == []  # refused before any request
