"""The controller's batching window: a burst is allocated largest first.

Against the fake API over HTTP (real list+watch, real writes), plus the work queue's
window and the pure batch order on their own.

The burst: one node with two fake H100s (81559Mi each), four 19Gi claims then two
40Gi claims, ready together. Best fit in arrival order stacks the four 19Gi on the
first GPU (3.6Gi left) and one 40Gi on the second (39.6Gi left): the other 40Gi fits
nowhere. Largest first puts one 40Gi on each GPU, and two 19Gi beside each.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from dra_driver.cli import build_parser, main
from dra_driver.controller.queue import WorkQueue
from dra_driver.controller.reconcile import CONTROLLER_CLASS, FINALIZER, placement_order
from tests.support.chart import CONTROLLER_VALUES
from tests.support.controller_env import (
    DRIVER,
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
"""The controller runs as its ServiceAccount under the chart's RBAC."""

JsonObj = dict[str, Any]
SMALL = ["s0", "s1", "s2", "s3"]
LARGE = ["l0", "l1"]


def _status_writes(api: FakeKubeApi) -> list[str]:
    """Claims in the order their allocation was written."""
    return [
        path.split("/")[-2]
        for method, path in api.requests
        if method == "PATCH" and path.endswith("/status") and "/resourceclaims/" in path
    ]


def _burst(api: FakeKubeApi, window_s: float) -> list[str]:
    """Seed the node and the claims, start a controller, then create every pod at once."""
    seed_cluster(api, {"node-a": "h100-80gb:2"})
    for name in SMALL:
        make_claim(api, name, "19Gi")
    for name in LARGE:
        make_claim(api, name, "40Gi")

    async def scenario() -> None:
        async with running(api, batch_window_s=window_s) as controller:
            await settled(controller)  # the claims were seen, without pods: nothing to do
            api.clear_requests()
            for name in SMALL + LARGE:
                make_pod(api, f"pod-{name}", name)
            await eventually(lambda: len(_status_writes(api)) >= 5)
            await settled(controller)

    asyncio.run(scenario())
    return _status_writes(api)


def test_a_burst_is_allocated_largest_first_and_fits(fake_kube: FakeKubeApi) -> None:
    writes = _burst(fake_kube, window_s=1.0)
    assert sorted(writes[:2]) == LARGE, writes
    assert sorted(writes[2:]) == SMALL, writes
    placed = {name: allocation_of(fake_kube, name) for name in SMALL + LARGE}
    assert all(placed.values()), placed
    devices = {
        name: alloc["devices"]["results"][0]["device"]
        for name, alloc in placed.items()
        if alloc is not None
    }
    assert devices["l0"] != devices["l1"]
    assert not any(events_for(fake_kube, name, "CannotAllocate") for name in SMALL + LARGE)


def test_without_a_window_claims_go_in_arrival_order(fake_kube: FakeKubeApi) -> None:
    writes = _burst(fake_kube, window_s=0)
    assert writes == [*SMALL, "l0"], writes
    assert allocation_of(fake_kube, "l1") is None
    assert events_for(fake_kube, "l1", "CannotAllocate")


@pytest.mark.parametrize("window_s", [0.0, 0.5])
def test_a_single_claim_waits_the_window_at_most(fake_kube: FakeKubeApi, window_s: float) -> None:
    seed_cluster(fake_kube, {"node-a": "h100-80gb:1"})
    make_claim(fake_kube, "c1", "10Gi")
    waited: list[float] = []

    async def scenario() -> None:
        async with running(fake_kube, batch_window_s=window_s) as controller:
            await settled(controller)
            started = time.monotonic()
            make_pod(fake_kube, "p1", "c1")
            await eventually(lambda: allocation_of(fake_kube, "c1") is not None)
            waited.append(time.monotonic() - started)

    asyncio.run(scenario())
    # From the pod to the allocation: the watch, the window, two writes, the poll.
    # The window counts from the claim's queueing, after the pod was created.
    assert window_s <= waited[0] < window_s + 0.75, waited


# --- the work queue's window -------------------------------------------------------------


def test_get_batch_collects_the_window_from_the_oldest_key() -> None:
    # Times are measured from the moments that matter (not from a fixed schedule),
    # and the margins are a quarter second or more, so a loaded CI machine whose
    # event loop runs late fails none of them.
    window = 0.5

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        queue = WorkQueue()
        queue.add("a")
        start = loop.time()
        loop.call_later(0.2, queue.add, "b")
        loop.call_later(0.2, queue.add, "a")  # queued already: once in the batch
        assert await queue.get_batch(window) == ["a", "b"]
        # The window counts from a: had b restarted it, the batch would go at 0.7 s.
        assert window - 0.01 <= loop.time() - start < window + 0.18
        assert not queue.idle()
        queue.add("a")  # held: queued again once done
        for key in ("a", "b"):
            queue.done(key)
        requeued = loop.time()
        loop.call_later(0.2, queue.add, "c")  # inside a's new window
        assert await queue.get_batch(window) == ["a", "c"]
        # The batch goes as soon as the oldest key (a) has waited its window; c's
        # would close 0.2 s later.
        assert window - 0.01 <= loop.time() - requeued < window + 0.18

    asyncio.run(scenario())


def test_a_key_that_waited_already_is_not_held_again() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        queue = WorkQueue()
        queue.add("a")
        await asyncio.sleep(0.3)  # the worker was busy
        queue.add("b")
        start = loop.time()
        assert await queue.get_batch(0.2) == ["a", "b"]
        assert loop.time() - start < 0.05

    asyncio.run(scenario())


def test_a_zero_window_takes_one_key_in_arrival_order() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        for key in ("a", "b", "c"):
            queue.add(key)
        assert await queue.get_batch(0) == ["a"]
        assert await queue.get_batch(0) == ["b"]
        assert len(queue) == 1

    asyncio.run(scenario())


# --- the order of a batch (pure) ---------------------------------------------------------


def _claim(
    uid: str,
    *requests: JsonObj,
    created: str = "2026-01-01T00:00:00Z",
    status: JsonObj | None = None,
    deleting: bool = False,
) -> JsonObj:
    meta: JsonObj = {"name": uid, "namespace": "default", "uid": uid, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = created
        meta["finalizers"] = [FINALIZER]
    return {
        "metadata": meta,
        "spec": {"devices": {"requests": list(requests)}},
        "status": status or {},
    }


def _share(memory: str | None, count: int = 1, name: str = "gpu") -> JsonObj:
    exactly: JsonObj = {"deviceClassName": CONTROLLER_CLASS, "count": count}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": name, "exactly": exactly}


def _gpushare(memory: str) -> JsonObj:
    claim = _claim("cfg", _share(None))
    claim["spec"]["devices"]["config"] = [
        {
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "gpu.fractional.dev/v1alpha1",
                    "kind": "GpuShare",
                    "memory": memory,
                },
            }
        }
    ]
    return claim


def test_placement_order() -> None:
    first_available = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "big",
                "deviceClassName": CONTROLLER_CLASS,
                "capacity": {"requests": {"memory": "30Gi"}},
            },
            {
                "name": "small",
                "deviceClassName": CONTROLLER_CLASS,
                "capacity": {"requests": {"memory": "1Gi"}},
            },
        ],
    }
    other_class = _claim("other", _share("70Gi"))
    other_class["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.x"
    batch: list[tuple[str, JsonObj | None]] = [
        ("s10", _claim("s10", _share("10Gi"))),
        ("gone", None),
        ("s10-old", _claim("s10-old", _share("10Gi"), created="2025-12-31T00:00:00Z")),
        ("twice", _claim("twice", _share("12Gi", count=2))),  # 24Gi
        ("fa", _claim("fa", first_available)),  # its first choice: 30Gi
        ("done", _claim("done", _share("70Gi"), status={"allocation": {"devices": {}}})),
        ("whole", _claim("whole", _share(None))),  # a whole GPU
        ("cfg", _gpushare("20Gi")),
        ("two", _claim("two", _share("5Gi"), _share("6Gi", name="b"))),  # 11Gi
        ("deleting", _claim("deleting", _share("70Gi"), deleting=True)),
        ("other", other_class),
        ("s10-a", _claim("s10-a", _share("10Gi"))),
    ]
    assert placement_order(batch, DRIVER) == [
        # Nothing to place: first, in queue order.
        "gone",
        "done",
        "deleting",
        "other",
        # Largest first: whole devices, then memory; ties by creation, then UID.
        "whole",
        "fa",
        "twice",
        "cfg",
        "two",
        "s10-old",
        "s10",
        "s10-a",
    ]


# --- the flag ----------------------------------------------------------------------------


def test_batch_window_flag(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert build_parser().parse_args(["controller"]).batch_window == "0.2"
    monkeypatch.setenv("BATCH_WINDOW", "0")
    assert build_parser().parse_args(["controller"]).batch_window == "0"
    # Checked before the controller starts (no API server here).
    assert main(["controller", "--batch-window", "-1"]) == 2
    assert "--batch-window (BATCH_WINDOW): '-1' is not a number of seconds >= 0" in caplog.text
