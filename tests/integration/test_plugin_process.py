"""The real ``dra-driver kubelet-plugin`` process: real claim source over HTTP, signals.

The plugin runs as a subprocess reading ResourceClaims with the official
Kubernetes client from the fake API server (real HTTP). The test kills it
with SIGKILL in the middle of a prepare storm, restarts it, and checks that
every claim is either fully prepared or absent, with no orphan CDI spec.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, node_object, resource_claim, share
from dra_driver.state.checkpoint import CheckpointStore, ClaimState
from tests.support.chart import chart_api, plugin_token
from tests.support.fakekube import FakeKubeApi
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked

GPUS = 8


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with chart_api() as fake:  # the plugin runs as its ServiceAccount
        fake.create(node_object(NODE))  # the slices' owner
        yield fake


def start_plugin(
    dirs: NodeDirs, kubeconfig: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "dra_driver", "kubelet-plugin",
        "--node-name", NODE,
        "--registry-dir", dirs.registry,
        "--plugin-dir", dirs.plugin,
        "--cdi-root", dirs.cdi,
        "--fake-gpus", f"h100-80gb:{GPUS}",
        "--kubeconfig", kubeconfig,
        "--boot-id-file", dirs.boot_id_file,
        "--log-level", "WARNING",
        "--sharing", "timeslicing",  # the MPS path is tested with the agent elsewhere
    ]  # fmt: skip
    with open(os.path.join(dirs.root, "plugin.log"), "ab") as log:
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )


def socket_identity(path: str) -> tuple[int, int]:
    # Inode numbers are reused at once on ext4: add the change time.
    st = os.stat(path)
    return st.st_ino, st.st_ctime_ns


def wait_for_fresh_socket(
    path: str, old: tuple[int, int] | None, proc: subprocess.Popen[bytes]
) -> None:
    """Wait until ``path`` is a socket other than ``old`` (the stale one)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"plugin exited with {proc.returncode}"
        try:
            if socket_identity(path) != old:
                return
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"{path} did not appear")


def check_consistent(dirs: NodeDirs) -> set[ClaimUID]:
    """Every checkpoint entry complete with its spec; every spec of ours has an entry."""
    checkpoint = CheckpointStore(os.path.join(dirs.plugin, "checkpoint.json"), "boot-1").load()
    assert {c.state for c in checkpoint.claims.values()} <= {ClaimState.PREPARE_COMPLETED}
    specs = {
        name.removeprefix("k8s.gpu.fractional.dev-claim_").removesuffix(".json")
        for name in dirs.cdi_files()
    }
    assert not [n for n in dirs.cdi_files() if n.endswith(".tmp")], "temp files left"
    assert specs == set(checkpoint.claims), "CDI specs and checkpoint disagree"
    return set(checkpoint.claims)


def test_sigkill_during_prepare_storm_then_restart(  # noqa: PLR0915 - one story, told in order
    node_dirs: NodeDirs, api: FakeKubeApi
) -> None:
    claims = [
        resource_claim("storm", f"c{i}", devices=[share(f"gpu-{i % GPUS}")]) for i in range(80)
    ]
    # The API server assigns the UIDs the kubelet will send.
    claims = [api.create(claim) for claim in claims]
    kubeconfig = node_dirs.kubeconfig(api.url, plugin_token(api))
    reg_socket = os.path.join(node_dirs.registry, f"{DRIVER}-reg.sock")

    proc = start_plugin(node_dirs, kubeconfig)
    acknowledged: set[str] = set()
    try:
        wait_for_fresh_socket(reg_socket, None, proc)

        async def storm() -> None:
            kubelet = FakeKubelet(node_dirs.registry)
            plugin = await kubelet.wait_for_plugin(DRIVER, timeout=30)
            queue = list(claims)

            async def caller() -> None:
                while queue:
                    claim = queue.pop()
                    try:
                        result = await plugin.prepare([claim_ref(claim)], timeout=10)
                    except grpc.aio.AioRpcError:
                        return  # the plugin died under us
                    if not result[claim_ref(claim).uid].error:
                        acknowledged.add(claim_ref(claim).uid)
                    if len(acknowledged) == 25:
                        proc.send_signal(signal.SIGKILL)

            await asyncio.gather(*(caller() for _ in range(8)))
            await kubelet.close()

        run_checked(storm())
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert 25 <= len(acknowledged) < len(claims), "the kill must land mid-storm"
        stale = socket_identity(reg_socket)  # the dead process left its socket

        proc = start_plugin(node_dirs, kubeconfig)
        wait_for_fresh_socket(reg_socket, stale, proc)
        prepared = check_consistent(node_dirs)
        # Everything the kubelet was told is prepared survived the crash.
        assert acknowledged <= prepared

        async def finish() -> None:
            kubelet = FakeKubelet(node_dirs.registry)
            plugin = await kubelet.wait_for_plugin(DRIVER, timeout=30)
            refs = [claim_ref(c) for c in claims]
            results = await plugin.prepare(refs)
            assert {uid: r.error for uid, r in results.items()} == {r.uid: "" for r in refs}
            assert check_consistent(node_dirs) == {r.uid for r in refs}
            assert not any((await plugin.unprepare(refs)).values())
            await kubelet.close()

        run_checked(finish())
        assert node_dirs.cdi_files() == []

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert os.listdir(node_dirs.registry) == []
        assert not os.path.exists(os.path.join(node_dirs.plugin, "dra.sock"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_claims_read_through_the_api(node_dirs: NodeDirs, api: FakeKubeApi) -> None:
    """The official client path: replaced and deleted claims fail alone."""
    good = api.create(resource_claim("ns", "good", devices=[Allocated("gpu-0")]))
    replaced = api.create(resource_claim("ns", "replaced", devices=[Allocated("gpu-1")]))
    stale_ref = ClaimRef("ns", "replaced", ClaimUID(str(uuid.uuid4())))
    deleted_ref = ClaimRef("ns", "gone", ClaimUID(str(uuid.uuid4())))
    proc = start_plugin(node_dirs, node_dirs.kubeconfig(api.url, plugin_token(api)))
    try:
        wait_for_fresh_socket(os.path.join(node_dirs.registry, f"{DRIVER}-reg.sock"), None, proc)

        async def scenario() -> None:
            kubelet = FakeKubelet(node_dirs.registry)
            plugin = await kubelet.wait_for_plugin(DRIVER, timeout=30)
            results = await plugin.prepare([claim_ref(good), stale_ref, deleted_ref])
            assert results[claim_ref(good).uid].error == ""
            assert "re-created" in results[stale_ref.uid].error
            assert str(stale_ref) in results[stale_ref.uid].error
            assert "does not exist" in results[deleted_ref.uid].error
            assert claim_ref(replaced).uid != stale_ref.uid
            await kubelet.close()

        run_checked(scenario())
        requests = [path for method, path in api.requests if method == "GET"]
        assert "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/good" in requests
        # The process also probed the cluster and published its slices.
        deadline = time.monotonic() + 10
        while not api.objects("resourceslices") and time.monotonic() < deadline:
            time.sleep(0.05)
        devices = [d["name"] for s in api.objects("resourceslices") for d in s["spec"]["devices"]]
        assert devices == [f"gpu-{i}" for i in range(GPUS)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def test_two_plugin_processes_during_a_rolling_update(
    node_dirs: NodeDirs, api: FakeKubeApi
) -> None:
    """Old and new pod both serve (maxSurge); the flock keeps their shared state whole."""
    claims = [
        api.create(resource_claim("roll", f"c{i}", devices=[share(f"gpu-{i % GPUS}")]))
        for i in range(60)
    ]
    kubeconfig = node_dirs.kubeconfig(api.url, plugin_token(api))
    # The pod UID comes through the flag's environment twin, as the chart sets it.
    procs = {
        uid: start_plugin(node_dirs, kubeconfig, env={"ROLLING_UPDATE_UID": uid})
        for uid in ("old-pod", "new-pod")
    }
    sockets = {uid: os.path.join(node_dirs.registry, f"{DRIVER}-{uid}-reg.sock") for uid in procs}
    try:
        for uid, proc in procs.items():
            wait_for_fresh_socket(sockets[uid], None, proc)

        async def scenario() -> None:
            kubelet = FakeKubelet(node_dirs.registry)
            plugins = [await kubelet.register_socket(sockets[uid]) for uid in procs]
            assert plugins[0].endpoint != plugins[1].endpoint
            refs = [claim_ref(c) for c in claims]
            first = await asyncio.gather(
                *(plugins[i % 2].prepare([ref]) for i, ref in enumerate(refs))
            )
            assert all(not r[ref.uid].error for r, ref in zip(first, refs, strict=True))
            again = await asyncio.gather(
                *(plugins[(i + 1) % 2].prepare([ref]) for i, ref in enumerate(refs))
            )
            assert again == first, "each instance returns what the other recorded"
            assert check_consistent(node_dirs) == {ref.uid for ref in refs}

            # The old pod goes away: only its own sockets disappear.
            procs["old-pod"].send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(procs["old-pod"].wait, 15) == 0
            assert not os.path.exists(sockets["old-pod"])
            assert os.path.exists(sockets["new-pod"])
            assert not any((await plugins[1].unprepare(refs)).values())
            assert check_consistent(node_dirs) == set()
            await kubelet.close()

        run_checked(scenario())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=15)
