"""Capability probe and ResourceSlice publisher against the fake API server over HTTP.

Also covers what the fake grew for them: ``dryRun``, ``/version`` and the
1.34/1.35 release emulation (gated fields dropped, devices xor counters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from dra_driver.base.errors import ApiConflictError, ApiNotFoundError, ApiUnavailableError
from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slices import DesiredSlice, build_slices
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.objects import node_object, resource_claim
from dra_driver.k8s.capabilities import parse_minor, probe_capabilities, read_server_minor
from dra_driver.k8s.publisher import (
    FIELD_MANAGER,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SLICE_KEY_ANNOTATION,
    Backoff,
    PublishResult,
    SlicePublisher,
    dns_subdomain,
    missing_fields,
    slice_name,
)
from dra_driver.k8s.transport import ApiTransport
from tests.support.chart import plugin_transport
from tests.support.fakekube import FakeKubeApi, JsonObj
from tests.support.http import send_json
from tests.support.transport import transport_to

DRIVER = "gpu.fractional.dev"
NODE = "node-a"

pytestmark = pytest.mark.chart(())
"""The publisher as the plugin runs it: its ServiceAccount under the chart's RBAC and policies."""
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
FAST = Backoff(initial_s=0.001, max_s=0.005)
WRITES = ("POST", "PUT", "PATCH", "DELETE")


# --- Helpers ----------------------------------------------------------------------------


def gpu(name: str, memory: str = "80Gi", *, shared: bool = False) -> JsonObj:
    device: JsonObj = {
        "name": name,
        "attributes": {"type": {"string": "gpu"}},
        "capacity": {"memory": {"value": memory}},
    }
    if shared:
        device["allowMultipleAllocations"] = True
        device["capacity"]["memory"]["requestPolicy"] = {
            "default": memory,
            "validRange": {"min": "1Gi", "step": "1Gi"},
        }
    return device


def desired(
    *devices_per_key: tuple[str, list[JsonObj]], node: str = NODE, driver: str = DRIVER
) -> list[DesiredSlice]:
    """One DesiredSlice per (key, devices), all in the node's pool, as the builder makes them."""
    return [
        DesiredSlice(
            key,
            {
                "driver": driver,
                "pool": {"name": node, "generation": 0, "resourceSliceCount": len(devices_per_key)},
                "nodeName": node,
                "devices": devices,
            },
        )
        for key, devices in devices_per_key
    ]


def two_gpus(memory: str = "80Gi") -> list[DesiredSlice]:
    return desired(("gpu-0", [gpu("gpu-0", memory)]), ("gpu-1", [gpu("gpu-1")]))


def foreign_slice(name: str, *, node: str, driver: str) -> JsonObj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "pool": {"name": node, "generation": 7, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": [gpu("gpu-0")],
        },
    }


def slices(fake: FakeKubeApi) -> dict[str, JsonObj]:
    return {o["metadata"]["name"]: o for o in fake.objects("ResourceSlice")}


def ours(fake: FakeKubeApi) -> dict[str, JsonObj]:
    return {
        n: o
        for n, o in slices(fake).items()
        if o["spec"]["driver"] == DRIVER and o["spec"]["nodeName"] == NODE
    }


def writes(fake: FakeKubeApi) -> list[tuple[str, str]]:
    return [r for r in fake.requests if r[0] in WRITES]


def generations(fake: FakeKubeApi) -> dict[str, int]:
    return {n: o["spec"]["pool"]["generation"] for n, o in ours(fake).items()}


def http(fake: FakeKubeApi, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return send_json(fake, method, path, body)


@pytest.fixture
def api_client(fake_kube: FakeKubeApi) -> ApiTransport:
    """The plugin's transport: as its ServiceAccount on NODE, under the chart's RBAC and
    slice policy (``pytestmark``)."""
    return plugin_transport(fake_kube, NODE)


@pytest.fixture
def node_uid(fake_kube: FakeKubeApi) -> str:
    return str(fake_kube.create(node_object(NODE))["metadata"]["uid"])


@contextlib.asynccontextmanager
async def publisher(api_client: ApiTransport, **kwargs: Any) -> AsyncIterator[SlicePublisher]:
    pub = SlicePublisher(api_client, driver_name=DRIVER, node_name=NODE, backoff=FAST, **kwargs)
    yield pub


def publish_once(
    api_client: ApiTransport, want: Sequence[DesiredSlice], **kwargs: Any
) -> PublishResult:
    async def go() -> PublishResult:
        async with publisher(api_client, **kwargs) as pub:
            return await pub.publish(want)

    return asyncio.run(go())


# --- Capability probe -------------------------------------------------------------------

ALL_ON = Capabilities(True, True, True, counters_in_own_slice=True)


@pytest.mark.parametrize(
    ("minor", "drop", "expected"),
    [
        (36, None, ALL_ON),
        (37, None, ALL_ON),
        (35, None, Capabilities(counters_in_own_slice=True)),
        (34, None, Capabilities(counters_in_own_slice=False)),
        # 1.34 with the alpha gates switched on: the combined slice shape is accepted.
        (34, False, Capabilities(True, True, True, counters_in_own_slice=False)),
        (35, False, ALL_ON),
    ],
    ids=["1.36", "1.37", "1.35", "1.34", "1.34-gates-on", "1.35-gates-on"],
)
def test_probe_reads_what_the_server_keeps(
    minor: int, drop: bool | None, expected: Capabilities
) -> None:
    with FakeKubeApi(kube_minor=minor, drop_gated_fields=drop) as fake:
        api = transport_to(fake.url)
        rv = fake.resource_version
        got = asyncio.run(probe_capabilities(api, DRIVER, NODE, None))
        assert got == expected
        # Dry runs only: nothing stored, no watch event (the resourceVersion did not move).
        assert fake.objects("ResourceSlice") == []
        assert fake.resource_version == rv
        posts = [r for r in fake.request_log if r.method == "POST"]
        assert posts and all(r.query["dryRun"] == ["All"] for r in posts)
        assert len(posts) == (1 if minor < 35 else 2)
        assert fake.requests[0] == ("GET", "/version")


def test_probe_with_a_known_version_skips_version(
    fake_kube: FakeKubeApi, api_client: ApiTransport
) -> None:
    assert asyncio.run(probe_capabilities(api_client, DRIVER, NODE, 36)) == ALL_ON
    assert [p for _, p in fake_kube.requests if "version" in p] == []


@pytest.mark.parametrize("status", [403, 422, 409])
def test_refused_probe_falls_back_to_all_off(
    fake_kube: FakeKubeApi, api_client: ApiTransport, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    fake_kube.fail_next("POST", "dryRun=All", status)
    with caplog.at_level(logging.WARNING):
        got = asyncio.run(probe_capabilities(api_client, DRIVER, NODE, None))
    assert got == Capabilities()
    assert any("probe" in r.getMessage() and "refused" in r.getMessage() for r in caplog.records)


def test_refused_version_still_probes(fake_kube: FakeKubeApi, api_client: ApiTransport) -> None:
    fake_kube.fail_next("GET", "/version", 403)
    assert asyncio.run(probe_capabilities(api_client, DRIVER, NODE, None)) == ALL_ON


def test_unavailable_server_is_raised_not_guessed(
    fake_kube: FakeKubeApi, api_client: ApiTransport
) -> None:
    fake_kube.fail_next("POST", "dryRun=All", 500)
    with pytest.raises(ApiUnavailableError):
        asyncio.run(probe_capabilities(api_client, DRIVER, NODE, 36))


def test_server_minor(api_client: ApiTransport) -> None:
    assert asyncio.run(read_server_minor(api_client)) == 36


def test_an_emulated_version_is_the_one_in_effect(caplog: pytest.LogCaptureFixture) -> None:
    """kube-apiserver 1.36 with --emulated-version=1.34 behaves as 1.34 (fact sheet 5.3)."""
    with FakeKubeApi(kube_minor=34, binary_minor=36) as api:
        info = json.loads(urllib.request.urlopen(api.url + "/version", timeout=5).read())
        assert (info["minor"], info["emulationMinor"]) == ("36", "34")
        with caplog.at_level(logging.INFO):
            client = transport_to(api.url)
            caps = asyncio.run(probe_capabilities(client, DRIVER, NODE))
    assert not caps.consumable_capacity
    assert "API server 1.34 keeps" in caplog.text
    assert "the API server (1.36 binary) emulates Kubernetes 1.34" in caplog.text


@pytest.mark.parametrize(("raw", "minor"), [("36", 36), ("36+", 36), ("7", 7), (" 35.x", 35)])
def test_parse_minor(raw: str, minor: int) -> None:
    assert parse_minor(raw) == minor


def test_parse_minor_without_digits() -> None:
    with pytest.raises(ValueError, match="no digits"):
        parse_minor("+")


# --- Publishing -------------------------------------------------------------------------


def test_first_publish_creates_named_owned_slices(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    result = publish_once(api_client, two_gpus())

    names = ["node-a-gpu-fractional-dev-gpu-0", "node-a-gpu-fractional-dev-gpu-1"]
    assert result == PublishResult(1, created=tuple(names))
    stored = ours(fake_kube)
    assert sorted(stored) == names
    for key, name in zip(("gpu-0", "gpu-1"), names, strict=True):
        obj = stored[name]
        assert obj["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
        assert obj["metadata"]["annotations"] == {SLICE_KEY_ANNOTATION: key}
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
        assert obj["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert obj["spec"]["nodeName"] == NODE
    assert [r for r in fake_kube.requests if "/nodes/" in r[1]] == [
        ("GET", f"/api/v1/nodes/{NODE}")
    ]
    assert all(
        r.query.get("fieldManager") == [FIELD_MANAGER]
        for r in fake_kube.request_log
        if r.method == "POST"
    )


def test_unchanged_republish_writes_nothing(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    async def go() -> list[PublishResult]:
        async with publisher(api_client) as pub:
            return [await pub.publish(two_gpus()) for _ in range(3)]

    first, *again = asyncio.run(go())
    assert first.generation == 1 and len(first.created) == 2
    fake_kube.clear_requests()
    assert publish_once(api_client, two_gpus(), node_uid=node_uid) == PublishResult(1)
    assert again == [PublishResult(1), PublishResult(1)]
    assert writes(fake_kube) == []
    # One LIST, with the kubelet's own field selector; the Node uid was given.
    assert [(r.method, r.path, r.query["fieldSelector"]) for r in fake_kube.request_log] == [
        ("GET", SLICES, [f"spec.nodeName={NODE},spec.driver={DRIVER}"])
    ]


def test_a_changed_device_bumps_every_slice_of_the_pool(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    publish_once(api_client, two_gpus())
    result = publish_once(api_client, two_gpus(memory="40Gi"))
    assert result.generation == 2
    assert sorted(result.updated) == sorted(ours(fake_kube)) and not result.created
    assert set(generations(fake_kube).values()) == {2}
    gpu0 = ours(fake_kube)[slice_name(NODE, DRIVER, "gpu-0")]
    assert gpu0["spec"]["devices"][0]["capacity"]["memory"]["value"] == "40Gi"


def test_a_removed_key_deletes_its_slice(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    publish_once(api_client, two_gpus())
    result = publish_once(api_client, desired(("gpu-0", [gpu("gpu-0")])))
    gone = slice_name(NODE, DRIVER, "gpu-1")
    assert result.deleted == (gone,) and result.generation == 2
    stored = ours(fake_kube)
    assert list(stored) == [slice_name(NODE, DRIVER, "gpu-0")]
    assert stored[slice_name(NODE, DRIVER, "gpu-0")]["spec"]["pool"]["resourceSliceCount"] == 1
    # Deletes come last: consumers never see the new generation incomplete.
    methods = [m for m, _ in writes(fake_kube)]
    assert methods[-1] == "DELETE"


def test_other_nodes_and_drivers_are_untouched(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    other_node = fake_kube.create(foreign_slice("b-slice", node="node-b", driver=DRIVER))
    other_driver = fake_kube.create(foreign_slice("a-other", node=NODE, driver="other.example.com"))
    # A slice of ours under an old naming scheme is ours all the same: it goes.
    fake_kube.create(foreign_slice("legacy-name", node=NODE, driver=DRIVER))

    result = publish_once(api_client, two_gpus())
    assert result.deleted == ("legacy-name",)
    assert result.generation == 8  # above the stored generation 7
    assert asyncio.run(_unpublish(api_client)) == tuple(sorted(ours_names(two_gpus())))

    left = slices(fake_kube)
    assert sorted(left) == ["a-other", "b-slice"]
    assert left["b-slice"] == other_node and left["a-other"] == other_driver


def ours_names(want: Sequence[DesiredSlice]) -> list[str]:
    return [slice_name(NODE, DRIVER, d.key) for d in want]


async def _unpublish(api_client: ApiTransport) -> tuple[str, ...]:
    async with publisher(api_client) as pub:
        return await pub.unpublish()


def test_conflict_relists_and_succeeds(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    publish_once(api_client, two_gpus())
    fake_kube.clear_requests()
    fake_kube.fail_next("PUT", "/resourceslices/", 409)
    result = publish_once(api_client, two_gpus(memory="40Gi"), node_uid=node_uid)
    assert result.generation == 2 and len(result.updated) == 2
    assert set(generations(fake_kube).values()) == {2}
    lists = [r for r in fake_kube.requests if r == ("GET", SLICES)]
    assert len(lists) == 2


def test_conflicts_give_up_after_max_conflict_retries(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    publish_once(api_client, two_gpus())
    fake_kube.fail_next("PUT", "/resourceslices/", 409, times=10)
    with pytest.raises(ApiConflictError, match="still conflicting after 3 tries"):
        publish_once(api_client, two_gpus(memory="40Gi"), max_conflict_retries=2)


def test_our_metadata_is_restored_without_a_new_generation(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    publish_once(api_client, two_gpus())
    name = slice_name(NODE, DRIVER, "gpu-1")
    obj = fake_kube.get("ResourceSlice", name)
    obj["metadata"]["labels"] = {"team": "gpu"}
    obj["metadata"]["ownerReferences"] = []
    fake_kube.update(obj)
    result = publish_once(api_client, two_gpus())
    assert result == PublishResult(1, updated=(name,))
    meta = fake_kube.get("ResourceSlice", name)["metadata"]
    assert meta["labels"] == {"team": "gpu", MANAGED_BY_LABEL: MANAGED_BY}
    assert [ref["uid"] for ref in meta["ownerReferences"]] == [node_uid]


def test_inconsistent_stored_generations_are_repaired(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    """E.g. a publish cut short: every slice moves past the highest stored generation."""
    publish_once(api_client, two_gpus())
    name = slice_name(NODE, DRIVER, "gpu-0")
    obj = fake_kube.get("ResourceSlice", name)
    obj["spec"]["pool"]["generation"] = 5
    fake_kube.update(obj)
    result = publish_once(api_client, two_gpus(), node_uid=node_uid)
    assert result.generation == 6
    assert set(generations(fake_kube).values()) == {6}


def test_transient_errors_are_retried_with_backoff(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    fake_kube.fail_next("POST", "/resourceslices", 500, times=2)
    result = publish_once(api_client, two_gpus())
    assert len(result.created) == 2
    assert len(ours(fake_kube)) == 2
    assert [m for m, p in fake_kube.requests if p == SLICES].count("POST") == 4


def test_transient_errors_give_up_after_max_attempts(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    fake_kube.fail_next("GET", "/resourceslices", 503, times=3)
    with pytest.raises(ApiUnavailableError, match="503"):
        publish_once(api_client, two_gpus(), max_attempts=3)
    assert ours(fake_kube) == {}


def test_dropped_fields_are_reported_and_do_not_cause_churn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shared = desired(("gpu-0", [gpu("gpu-0", shared=True)]))
    with FakeKubeApi(kube_minor=35) as fake:
        api = transport_to(fake.url)
        uid = str(fake.create(node_object(NODE))["metadata"]["uid"])

        async def go() -> list[PublishResult]:
            async with publisher(api, node_uid=uid) as pub:
                return [await pub.publish(shared), await pub.publish(shared)]

        with caplog.at_level(logging.WARNING):
            first, second = asyncio.run(go())
        assert first.dropped_fields == {
            "gpu-0": (
                "spec.devices[0].allowMultipleAllocations",
                "spec.devices[0].capacity.memory.requestPolicy",
            )
        }
        assert any("allowMultipleAllocations" in r.getMessage() for r in caplog.records)
        # The same process knows what it sent: no rewrite, no generation churn.
        assert second == PublishResult(1)
        # A restarted process does not know: it rewrites once, then is stable again.
        fake.clear_requests()
        restarted, again = asyncio.run(go())
        assert restarted.generation == 2 and restarted.updated
        assert again == PublishResult(2)
        assert len(writes(fake)) == 1


def test_republish_after_the_kubelet_wiped_the_slices(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    built = 0

    def desired_fn() -> list[DesiredSlice]:
        nonlocal built
        built += 1
        return two_gpus()

    async def go() -> list[PublishResult]:
        results: asyncio.Queue[PublishResult] = asyncio.Queue()
        async with publisher(api_client) as pub:
            task = asyncio.create_task(pub.run(desired_fn, on_publish=results.put_nowait))
            try:
                first = await asyncio.wait_for(results.get(), 5)
                # The kubelet, starting, deletes every slice of the node.
                for name in ours(fake_kube):
                    fake_kube.delete("ResourceSlice", name)
                assert ours(fake_kube) == {}
                for _ in range(5):  # a burst of registrations/health events coalesces
                    pub.request_publish()
                second = await asyncio.wait_for(results.get(), 5)
                await asyncio.sleep(0.05)
                assert results.empty()
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return [first, second]

    first, second = asyncio.run(go())
    assert first.generation == 1 and len(first.created) == 2
    # Recreated, and the generation does not go back to a number used before.
    assert second.generation == 2 and len(second.created) == 2
    assert set(generations(fake_kube).values()) == {2}
    assert built == 2


def test_run_keeps_retrying_after_failures(
    fake_kube: FakeKubeApi,
    api_client: ApiTransport,
    node_uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 2 tries per publish: the first publish fails, the loop backs off and tries again.
    fake_kube.fail_next("GET", "/resourceslices", 500, times=3)

    async def go() -> PublishResult:
        results: asyncio.Queue[PublishResult] = asyncio.Queue()
        async with publisher(api_client, max_attempts=2) as pub:
            task = asyncio.create_task(pub.run(two_gpus, on_publish=results.put_nowait))
            try:
                return await asyncio.wait_for(results.get(), 5)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    with caplog.at_level(logging.WARNING):
        result = asyncio.run(go())
    assert len(result.created) == 2
    assert any("publishing ResourceSlices failed" in r.getMessage() for r in caplog.records)


def test_async_desired_fn(fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str) -> None:
    async def desired_fn() -> list[DesiredSlice]:
        await asyncio.sleep(0)
        return two_gpus()

    async def go() -> PublishResult:
        results: asyncio.Queue[PublishResult] = asyncio.Queue()
        async with publisher(api_client) as pub:
            task = asyncio.create_task(pub.run(desired_fn, on_publish=results.put_nowait))
            try:
                return await asyncio.wait_for(results.get(), 5)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    assert asyncio.run(go()).generation == 1


def test_missing_node_is_named(fake_kube: FakeKubeApi, api_client: ApiTransport) -> None:
    with pytest.raises(ApiNotFoundError, match="owned by their Node"):
        publish_once(api_client, two_gpus())
    assert writes(fake_kube) == []


@pytest.mark.parametrize(
    ("want", "message"),
    [
        (desired(("gpu-0", []), driver="other.example.com"), "this publisher serves"),
        (desired(("gpu-0", []), node="node-b"), "this publisher serves"),
        (desired(("gpu-0", []), ("gpu-0", [])), "duplicate keys"),
        # Two slices that each claim to be the only one in the pool.
        (desired(("gpu-0", [])) + desired(("gpu-1", [])), "resourceSliceCount"),
    ],
    ids=["driver", "node", "duplicate", "count"],
)
def test_desired_slices_breaking_the_contract_are_refused(
    fake_kube: FakeKubeApi, api_client: ApiTransport, want: list[DesiredSlice], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        publish_once(api_client, want)
    assert fake_kube.requests == []


def test_publishing_nothing_removes_our_slices(
    fake_kube: FakeKubeApi, api_client: ApiTransport, node_uid: str
) -> None:
    publish_once(api_client, two_gpus())
    result = publish_once(api_client, [])
    assert result.generation == 0 and len(result.deleted) == 2
    assert ours(fake_kube) == {}


@pytest.mark.parametrize("minor", [34, 35, 36])
def test_probe_build_publish_round_trip_drops_nothing(minor: int) -> None:
    """What the builder makes for the probed capabilities is stored as sent."""

    async def go(api: ApiTransport) -> tuple[Capabilities, PublishResult, PublishResult]:
        caps = await probe_capabilities(api, DRIVER, NODE)
        inventory = await FakeGpuBackend("h100-80gb:2,h100-80gb:1:mig,l4", NODE).inventory()
        want = build_slices(
            inventory,
            driver_name=DRIVER,
            node_name=NODE,
            settings=NodeSettings(),
            capabilities=caps,
        )
        async with publisher(api) as pub:
            return caps, await pub.publish(want), await pub.publish(want)

    with FakeKubeApi(kube_minor=minor) as fake:
        api = transport_to(fake.url)
        fake.create(node_object(NODE))
        caps, first, second = asyncio.run(go(api))
        assert caps == Capabilities.for_version(minor)
        assert first.created and first.dropped_fields == {}
        assert second == PublishResult(1)


# --- Pure helpers -------------------------------------------------------------------------


def test_slice_names() -> None:
    assert slice_name("node-a", "gpu.fractional.dev", "gpu-0") == "node-a-gpu-fractional-dev-gpu-0"
    assert slice_name("ip-10-0-0-1.ec2.internal", "d.io", "x") == "ip-10-0-0-1.ec2.internal-d-io-x"


@pytest.mark.parametrize(
    "raw",
    ["Node-A-key", "a_b", "a..b", "-a-", "a.-b", "x" * 300, "node." + "y" * 260, "!!!"],
)
def test_dns_subdomain_is_valid_and_distinct(raw: str) -> None:
    name = dns_subdomain(raw)
    assert len(name) <= 253
    labels = name.split(".")
    assert all(label and label[0].isalnum() and label[-1].isalnum() for label in labels)
    assert all(c.islower() or c.isdigit() or c in "-." for c in name)
    assert name != dns_subdomain(raw + "z")


def test_missing_fields_ignores_empties_and_changed_values() -> None:
    sent = {"a": {"b": 1, "c": [], "d": {"e": "1024Mi"}}, "l": [{"x": 1}, {"y": 2}], "z": 1}
    stored = {"a": {"d": {"e": "1Gi"}}, "l": [{"x": 1}]}
    assert missing_fields(sent, stored, "spec") == ["spec.a.b", "spec.l[1]", "spec.z"]


@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [(1, 0.5, 0.5), (2, 0.5, 1.0), (3, 0.0, 1.6), (3, 1.0, 2.4), (20, 0.5, 30.0)],
)
def test_backoff(attempt: int, rand: float, expected: float) -> None:
    assert Backoff().delay(attempt, lambda: rand) == pytest.approx(expected)


# --- The fake's release emulation ---------------------------------------------------------


def test_dry_run_update_and_delete_store_nothing(fake_kube: FakeKubeApi) -> None:
    stored = fake_kube.create(foreign_slice("s", node=NODE, driver=DRIVER))
    rv = fake_kube.resource_version
    changed = {**stored, "spec": {**stored["spec"], "devices": []}}
    code, answer = http(fake_kube, "PUT", f"{SLICES}/s?dryRun=All", changed)
    assert code == 200 and answer["spec"]["devices"] == []
    assert answer["metadata"]["generation"] == 2
    assert http(fake_kube, "DELETE", f"{SLICES}/s?dryRun=All")[0] == 200
    assert fake_kube.get("ResourceSlice", "s") == stored
    assert fake_kube.resource_version == rv
    code, answer = http(
        fake_kube, "POST", f"{SLICES}?dryRun=All", foreign_slice("t", node=NODE, driver=DRIVER)
    )
    assert code == 201 and answer["metadata"]["uid"] and "resourceVersion" not in answer["metadata"]
    assert http(fake_kube, "POST", f"{SLICES}?dryRun=All", stored)[0] == 400  # resourceVersion set
    assert (
        http(
            fake_kube, "POST", f"{SLICES}?dryRun=Some", foreign_slice("u", node=NODE, driver=DRIVER)
        )[0]
        == 400
    )
    assert [o["metadata"]["name"] for o in fake_kube.objects("ResourceSlice")] == ["s"]


def test_version_endpoint() -> None:
    with FakeKubeApi(kube_minor=34) as fake:
        code, info = http(fake, "GET", "/version")
    assert code == 200
    assert (info["major"], info["minor"], info["gitVersion"]) == ("1", "34", "v1.34.0")


def test_1_35_rejects_devices_with_shared_counters() -> None:
    body = foreign_slice("s", node=NODE, driver=DRIVER)
    body["spec"]["sharedCounters"] = [{"name": "set", "counters": {"c": {"value": "1"}}}]
    with FakeKubeApi(kube_minor=35, drop_gated_fields=False) as fake:
        code, status = http(fake, "POST", SLICES, body)
        assert (code, status["reason"]) == (422, "Invalid")
    with FakeKubeApi(kube_minor=35) as fake:  # gate off: dropped before validation
        code, stored = http(fake, "POST", SLICES, body)
        assert code == 201 and "sharedCounters" not in stored["spec"]
    with FakeKubeApi(kube_minor=34, drop_gated_fields=False) as fake:  # 1.34 allowed both
        assert http(fake, "POST", SLICES, body)[0] == 201


def test_1_35_drops_gated_claim_fields() -> None:
    claim = resource_claim("default", "c1", uid="u1", node=NODE)
    claim["spec"] = {
        "devices": {
            "requests": [
                {
                    "name": "r",
                    "exactly": {
                        "deviceClassName": "gpu",
                        "capacity": {"requests": {"memory": "1Gi"}},
                    },
                }
            ]
        }
    }
    results = claim["status"]["allocation"]["devices"]["results"]
    results[0].update(shareID="share-1", consumedCapacity={"memory": "1Gi"})
    for minor, kept in ((35, False), (36, True)):
        with FakeKubeApi(kube_minor=minor) as fake:
            stored = fake.create(claim)
            result = stored["status"]["allocation"]["devices"]["results"][0]
            request = stored["spec"]["devices"]["requests"][0]["exactly"]
            assert ("shareID" in result, "consumedCapacity" in result, "capacity" in request) == (
                kept,
                kept,
                kept,
            )
            assert result["device"] and request["deviceClassName"] == "gpu"


def test_deviceclasses_are_served(fake_kube: FakeKubeApi) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu"},
        "spec": {},
    }
    assert http(fake_kube, "POST", "/apis/resource.k8s.io/v1/deviceclasses", body)[0] == 201
    assert fake_kube.get("DeviceClass", "gpu")["metadata"]["name"] == "gpu"
