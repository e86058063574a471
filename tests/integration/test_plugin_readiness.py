"""The kubelet plugin's readiness (``/readyz``): registered with the kubelet AND its
ResourceSlices published; real HTTP, real sockets, the real process for the outage."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import http.client
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dra_driver.app.plugin import PluginParts, SliceOptions, start_plugin
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import node_object
from dra_driver.k8s.backoff import Backoff
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.plugin import readiness
from dra_driver.plugin.readiness import Readiness, ReadinessServer, check_readiness
from tests.support.chart import chart_api, plugin_transport
from tests.support.eventually import eventually
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.processes import free_port, stop_process


def readyz(port: int, path: str = "/readyz", method: str = "GET") -> tuple[int, str]:
    """What the kubelet's httpGet probe sees: (status, body); (0, why) if nothing answers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError as err:
        return 0, str(err)
    finally:
        conn.close()


async def aready(port: int) -> tuple[int, str]:
    return await asyncio.to_thread(readyz, port)


def closed_api_url() -> str:
    """An API server address where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.parametrize(
    ("state", "ready", "says"),
    [
        ({"started": False}, False, "starting"),
        ({"registered": False}, False, "not registered with the kubelet yet"),
        ({"registered": False, "registration_error": "no"}, False, "rejected the registration"),
        ({"published_generation": None}, False, "ResourceSlices not published yet"),
        ({"publish_failing": "boom"}, False, "cannot be published: boom"),
        ({"published_generation": 3, "publish_failing": "boom"}, False, "boom"),
        ({}, True, "published (pool generation 3)"),
        ({"publishes": False, "published_generation": None}, True, "registered"),
    ],
    ids=["starting", "unregistered", "rejected", "unpublished", "failing",
         "failing-after-success", "ready", "ready-without-slices"],
)  # fmt: skip
def test_readiness_rules(state: dict[str, object], ready: bool, says: str) -> None:
    args: dict[str, object] = {
        "started": True,
        "registered": True,
        "registration_error": None,
        "publishes": True,
        "published_generation": 3,
        "publish_failing": None,
        **state,
    }
    verdict = check_readiness(**args)  # type: ignore[arg-type]
    assert verdict.ready is ready
    assert says in verdict.reason


def test_unready_until_registered_and_published_and_while_publishes_fail(
    node_dirs: NodeDirs,
) -> None:
    # The plugin as its ServiceAccount, under the chart's RBAC and slice policy.
    with chart_api() as api:
        client = plugin_transport(api)
        api.create(node_object(NODE))
        publisher = SlicePublisher(
            client,
            driver_name=DRIVER,
            node_name=NODE,
            backoff=Backoff(initial_s=0.05, max_s=0.2),
            max_attempts=1,
        )
        config = dataclasses.replace(node_dirs.config(), readiness_port=0)
        parts = PluginParts(
            config,
            FakeGpuBackend("h100-80gb:1", NODE),
            InMemoryClaimSource(),
            SliceOptions(publisher, functools.partial(probe_capabilities, client, DRIVER, NODE)),
        )

        async def scenario() -> None:
            runtime = await start_plugin(parts)
            kubelet = FakeKubelet(node_dirs.registry)
            try:
                assert runtime.readiness_server is not None
                port = runtime.readiness_server.port
                assert runtime.publishing is not None
                publishing = runtime.publishing
                await eventually(
                    lambda: publishing.last_result is not None, "the first publish", timeout=20
                )
                # Slices published, but the kubelet has not registered us.
                status, body = await aready(port)
                assert (status, body) == (503, "not ready: not registered with the kubelet yet\n")
                await kubelet.wait_for_plugin(DRIVER)
                status, body = await aready(port)
                assert status == 200, body
                assert "ResourceSlices published (pool generation 1)" in body

                # The kubelet restarts (registers us again) while every slice write
                # is refused: the republish fails and the plugin is unready.
                api.fail_next("*", "resourceslices", 403, times=1_000_000, message="denied")
                reg = os.path.join(node_dirs.registry, f"{DRIVER}-reg.sock")
                await kubelet.register_socket(reg, DRIVER)
                await eventually(
                    lambda: publishing.failing is not None, "a failed publish", timeout=20
                )
                status, body = await aready(port)
                assert status == 503 and "ResourceSlices cannot be published" in body, body
                assert "denied" in body
            finally:
                await kubelet.close()
                await runtime.stop()
            assert (await aready(port))[0] == 0  # closed with the plugin

        run_checked(scenario())


def test_only_readyz_is_served(node_dirs: NodeDirs) -> None:
    config = dataclasses.replace(node_dirs.config(), readiness_port=0)
    parts = PluginParts(config, FakeGpuBackend("h100-80gb:1", NODE), InMemoryClaimSource())

    async def scenario() -> None:
        runtime = await start_plugin(parts)
        try:
            assert runtime.readiness_server is not None
            port = runtime.readiness_server.port
            assert (await asyncio.to_thread(readyz, port, "/metrics"))[0] == 404
            assert (await asyncio.to_thread(readyz, port, "/readyz", "POST"))[0] == 405
            head = await asyncio.to_thread(readyz, port, "/readyz?verbose", "HEAD")
            assert head == (503, "")
            # No slices to publish (no API): registered is enough.
            kubelet = FakeKubelet(node_dirs.registry)
            await kubelet.wait_for_plugin(DRIVER)
            assert await aready(port) == (200, "ok: registered with the kubelet\n")
            await kubelet.close()
        finally:
            await runtime.stop()

    run_checked(scenario())


def _hold_the_loop(seconds: float) -> None:
    """Block the calling thread (the event loop's, when called from a coroutine)."""
    time.sleep(seconds)


def test_a_stuck_event_loop_is_answered_not_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    """The responder's threads answer while the loop is stuck: 503, saying so; once the
    loop runs again the verdict is the check's again. A check that raises is a 503."""
    monkeypatch.setattr(readiness, "LOOP_ANSWER_S", 0.3)
    verdicts = [Readiness(True, "fine")]

    def check() -> Readiness:
        if not verdicts:
            raise RuntimeError("no verdict")
        return verdicts[0]

    async def scenario() -> None:
        server = ReadinessServer(check)
        await server.start(0, "127.0.0.1")
        port = server.port
        try:
            assert await aready(port) == (200, "ok: fine\n")
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                probe = pool.submit(readyz, port)
                _hold_the_loop(1.0)
                status, body = probe.result()
            assert status == 503, body
            assert (
                body == "not ready: the event loop did not answer in 0.3s (stuck or overloaded)\n"
            )
            assert await aready(port) == (200, "ok: fine\n")
            verdicts.clear()
            assert await aready(port) == (
                503,
                "not ready: the readiness check failed: no verdict\n",
            )
        finally:
            await server.close()
        assert (await aready(port))[0] == 0  # closed

    run_checked(scenario())


# --- the real process, the API server unreachable ----------------------------------------


@pytest.fixture
def plugin_without_api(node_dirs: NodeDirs) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``dra-driver kubelet-plugin`` as the chart runs it, its API server unreachable."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "dra_driver", "kubelet-plugin",
        "--node-name", NODE,
        "--registry-dir", node_dirs.registry,
        "--plugin-dir", node_dirs.plugin,
        "--cdi-root", node_dirs.cdi,
        "--fake-gpus", "h100-80gb:1",
        "--kubeconfig", node_dirs.kubeconfig(closed_api_url()),
        "--boot-id-file", node_dirs.boot_id_file,
        "--sharing", "timeslicing",
        "--log-level", "WARNING",
    ]  # fmt: skip
    env = {**os.environ, "READINESS_PORT": str(port), "METRICS_ADDRESS": "127.0.0.1"}
    with open(os.path.join(node_dirs.root, "plugin.log"), "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc, port
    finally:
        stop_process(proc, 20)


def test_plugin_stays_unready_while_the_api_server_is_unreachable(
    node_dirs: NodeDirs, plugin_without_api: tuple[subprocess.Popen[bytes], int]
) -> None:
    """Registered with the kubelet, sockets answering, no slices: never ready."""
    proc, port = plugin_without_api

    async def scenario() -> None:
        kubelet = FakeKubelet(node_dirs.registry)
        try:
            await kubelet.wait_for_plugin(DRIVER, timeout=30)  # the sockets answer
            deadline = time.monotonic() + 30
            status, body = await aready(port)
            while "cannot be published" not in body:
                assert proc.poll() is None, f"plugin exited with {proc.returncode}"
                assert time.monotonic() < deadline, f"no publish failure seen: {status} {body}"
                await asyncio.sleep(0.1)
                status, body = await aready(port)
            assert status == 503, body
            # And it stays so while the API server stays away (the publisher retries).
            for _ in range(10):
                await asyncio.sleep(0.2)
                status, body = await aready(port)
                assert status == 503, body
        finally:
            await kubelet.close()

    run_checked(scenario())
    with open(os.path.join(node_dirs.root, "plugin.log"), encoding="utf-8") as log:
        assert "publishing ResourceSlices failed" in log.read()
