"""The controller path end to end with real processes, against a fake API server that
refuses what a real one refuses (opaque parameters compared byte for byte, the
allocation immutable, apply re-encoding, schema validation).

``dra-driver mps-agent`` (fake ``nvidia-cuda-mps-control``), ``dra-driver
kubelet-plugin`` (``--allocator controller``, MPS) and ``dra-driver controller``
run as subprocesses reading a kubeconfig that points at the fake API server. A
user's claim is created the way the Python client sends it (spaced JSON, the
GpuShare's keys in the user's order), its pod appears, the controller allocates
it, the kubelet (``FakeKubelet``, over the real socket) prepares it, the plugin
writes its ``status.devices`` entry and the mps-agent holds its MPS namespace;
then unprepare, and SIGTERM makes every process exit within 5 s.

On a 1.34 API server (fields of the DRA gates that are off there dropped) the
allocation has no shareID: the share is known by its ``GpuShareGrant``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.controller.reconcile import CONTROLLER_CLASS, FINALIZER
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import node_object
from dra_driver.mpsagent.client import MpsAgentClient
from tests.support.chart import CONTROLLER_VALUES, chart_api, controller_token, plugin_token
from tests.support.controller_env import LEASE_NAMESPACE, share_class
from tests.support.fakekube import FakeApiError, FakeKubeApi
from tests.support.http import send
from tests.support.node import DRIVER, NODE, NodeDirs

EXIT_BUDGET_S = 5.0
GPU_SHARE = {"memory": "10Gi", "kind": "GpuShare", "apiVersion": "gpu.fractional.dev/v1alpha1"}
"""What a user wrote, keys in no canonical order."""
WRITERS: dict[str, Callable[[Any], str]] = {
    "kubectl": lambda obj: json.dumps(obj, sort_keys=True, separators=(",", ":")),
    "python-client": json.dumps,  # the official client's json.dumps: ", " and ": "
}


class Processes:
    def __init__(self, dirs: NodeDirs) -> None:
        self.dirs = dirs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *args: str) -> None:
        with open(os.path.join(self.dirs.root, f"{name}.log"), "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "dra_driver", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n"
            + Path(self.dirs.root, f"{name}.log").read_text(errors="replace")[-4000:]
            for name in self.procs
        )

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.logs()}")

    def wait(self, what: str, cond: Callable[[], object], timeout_s: float = 30) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            value = cond()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not seen after {timeout_s:.0f}s:\n{self.logs()}")
            time.sleep(0.05)

    def terminate(self, name: str) -> float:
        """SIGTERM; the seconds until the process exited (killed after 20 s)."""
        proc = self.procs[name]
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"{name} still running 20 s after SIGTERM:\n{self.logs()}")
        assert code == 0, f"{name} exited with {code} after SIGTERM:\n{self.logs()}"
        return time.monotonic() - started

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def processes(node_dirs: NodeDirs) -> Iterator[Processes]:
    procs = Processes(node_dirs)
    try:
        yield procs
    finally:
        procs.kill_all()


def post(api: FakeKubeApi, path: str, body_text: str) -> dict[str, Any]:
    """POST ``body_text`` byte for byte, as the user (the cluster admin) does."""
    code, created = send(api, "POST", path, body_text.encode())
    assert code == 201, created
    return dict(created)


def user_claim(api: FakeKubeApi, writer: str) -> dict[str, Any]:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "share", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": CONTROLLER_CLASS}}],
                "config": [
                    {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": GPU_SHARE}}
                ],
            }
        },
    }
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    return post(api, path, WRITERS[writer](claim))


def pod_for(claim: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "ctr0", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod0", "namespace": "default", "uid": str(uuid.uuid4())},
        "spec": {
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}],
        },
    }


def our_entries(api: FakeKubeApi) -> list[dict[str, Any]]:
    status = api.get("ResourceClaim", "share", "default").get("status") or {}
    return [d for d in status.get("devices") or [] if d["driver"] == DRIVER]


def start_driver(api: FakeKubeApi, dirs: NodeDirs, processes: Processes) -> str:
    """The mps-agent, the plugin (GPUs for the controller) and the controller; the
    agent's socket."""
    # Each process with its own ServiceAccount's token, as the chart runs them; the
    # mps-agent has none (the chart mounts it no token: it talks to no API server).
    plugin_kubeconfig = dirs.kubeconfig(api.url, plugin_token(api), "plugin.kubeconfig")
    controller_kubeconfig = dirs.kubeconfig(api.url, controller_token(api), "controller.kubeconfig")
    agent_socket = os.path.join(dirs.plugin, "mps-agent.sock")
    common = ["--driver-name", DRIVER, "--plugin-dir", dirs.plugin]
    processes.start(
        "mps-agent", "mps-agent", *common, "--mps-control", "fake", "--mps-protocol", "v3",
        "--state-dir", os.path.join(dirs.root, "mps"),
    )  # fmt: skip
    # A prepare before the agent listens fails (the kubelet would retry): wait for it.
    processes.wait("the mps-agent's socket", lambda: os.path.exists(agent_socket))
    processes.start(
        "kubelet-plugin", "kubelet-plugin", *common, "--node-name", NODE,
        "--registry-dir", dirs.registry, "--cdi-root", dirs.cdi,
        "--fake-gpus", "h100-80gb:2", "--kubeconfig", plugin_kubeconfig,
        "--boot-id-file", dirs.boot_id_file, "--allocator", "controller",
        "--mps-agent-socket", agent_socket, "--cdi-hook-path", "",
    )  # fmt: skip
    processes.start(
        "controller", "controller", "--kubeconfig", controller_kubeconfig,
        "--lease-namespace", LEASE_NAMESPACE,
    )  # fmt: skip
    return agent_socket


async def prepare_check_unprepare(
    api: FakeKubeApi,
    dirs: NodeDirs,
    processes: Processes,
    *,
    agent_socket: str,
    ref: ClaimRef,
    result: dict[str, Any],
    share_key: str,
) -> None:
    """The kubelet's part: prepare, the MPS namespace and status.devices, unprepare."""
    node = FakeKubelet(dirs.registry)
    agent = MpsAgentClient(agent_socket)
    try:
        plugin = await node.wait_for_plugin(DRIVER)
        prepared = await plugin.prepare([ref])
        assert prepared[ref.uid].error == "", prepared
        shares = await agent.list_shares()
        assert [(s.claim_uid, s.share_id) for s in shares] == [(ref.uid, share_key)]
        assert shares[0].memory_limit_bytes == 10 * 2**30
        (entry,) = await asyncio.to_thread(
            processes.wait, "status.devices", lambda: our_entries(api)
        )
        assert (entry["device"], entry["data"]["mode"]) == (result["device"], "mps")
        assert {c["type"]: c["status"] for c in entry["conditions"]}["Ready"] == "True"
        assert await plugin.unprepare([ref]) == {ref.uid: ""}
        assert await agent.list_shares() == []
        await asyncio.to_thread(
            processes.wait, "status.devices removed", lambda: not our_entries(api)
        )
    finally:
        await node.close()


def check_later_writes(api: FakeKubeApi, writer: str) -> None:
    stored = api.get("ResourceClaim", "share", "default")
    refused = [e for e in api.objects("Event") if e["reason"] == "MetadataWriteRefused"]
    label = {"metadata": {"labels": {"a": "b"}}}
    if writer == "kubectl":
        # Compact, sorted: every later write works, ours (the finalizer) and anyone's.
        assert FINALIZER in stored["metadata"]["finalizers"] and not refused
        assert api.patch("ResourceClaim", "share", label)["metadata"]["labels"] == {"a": "b"}
        return
    # Spaces in the stored parameters: no JSON write of the main resource can succeed
    # (the real API server compacts them and sees the spec change), so the claim is
    # allocated without the finalizer and a Warning says why and what to do.
    assert FINALIZER not in (stored["metadata"].get("finalizers") or [])
    assert refused and "Recreate the claim with kubectl" in refused[0]["message"]
    with pytest.raises(FakeApiError, match="spec: Invalid value"):
        api.patch("ResourceClaim", "share", label)


@pytest.mark.parametrize(
    ("minor", "writer"), [(34, "python-client"), (36, "kubectl"), (36, "python-client")]
)
def test_a_users_share_is_allocated_prepared_and_reported(
    node_dirs: NodeDirs, processes: Processes, minor: int, writer: str
) -> None:
    # 1.34 as observed: a 1.36 binary with --emulated-version=1.34 and default gates.
    # The chart's RBAC and admission policies, enforced for each process's identity.
    with chart_api(
        CONTROLLER_VALUES, kube_minor=minor, binary_minor=36 if minor < 36 else None
    ) as api:
        api.create(node_object(NODE))
        api.create(share_class())
        agent_socket = start_driver(api, node_dirs, processes)
        claim = user_claim(api, writer)
        processes.wait("the plugin's slices", lambda: api.objects("ResourceSlice"))
        api.create(pod_for(claim))
        allocation = processes.wait(
            "the controller's allocation",
            lambda: (api.get("ResourceClaim", "share", "default").get("status") or {}).get(
                "allocation"
            ),
        )
        (result,) = allocation["devices"]["results"]
        (grant,) = [
            c["opaque"]["parameters"]
            for c in allocation["devices"]["config"]
            if c["opaque"]["parameters"].get("kind") == "GpuShareGrant"
        ]
        assert grant["memory"] == "10Gi"
        assert ("shareID" in result) == (minor >= 36)  # 1.34 drops it: known by its grant
        ref = ClaimRef("default", "share", ClaimUID(claim["metadata"]["uid"]))
        key = result.get("shareID") or grant["shareID"]
        asyncio.run(
            prepare_check_unprepare(
                api,
                node_dirs,
                processes,
                agent_socket=agent_socket,
                ref=ref,
                result=result,
                share_key=key,
            )
        )
        check_later_writes(api, writer)

        names = ("controller", "kubelet-plugin", "mps-agent")
        exits = {name: processes.terminate(name) for name in names}
        print("SIGTERM to exit, seconds:", {name: round(s, 2) for name, s in exits.items()})
        slow = {name: round(s, 2) for name, s in exits.items() if s >= EXIT_BUDGET_S}
        assert not slow, f"SIGTERM to exit took {exits}\n{processes.logs()}"
