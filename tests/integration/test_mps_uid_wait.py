"""Legacy MPS: a client waiting on another UID's server, raised to Kubernetes.

The plugin with the real mps-agent (legacy MPS, the fake ``nvidia-cuda-mps-control``
as real processes), claims read from the fake API server, Events written there;
and the watch's share → claim mapping with a stand-in share list.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.prepare import PlannedDevice
from dra_driver.core.settings import NodeSettings
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet, RegisteredPlugin
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.objects import claim_ref, resource_claim, share
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.transport import ApiTransport
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentUnavailableError
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.daemon_files import PID_FILE
from dra_driver.mpsagent.metrics import AgentMetrics
from dra_driver.mpsagent.protocol import AgentStatus, DaemonStatus, ShareInfo
from dra_driver.plugin.claim_reporting import COMPONENT, ClaimReporter
from dra_driver.plugin.mps_watch import MpsUidWait, MpsUidWatch, waiting_claims
from tests.support.clock import Clock
from tests.support.eventually import eventually
from tests.support.fakekube import FakeKubeApi
from tests.support.mps import agent_running, gpu_dir
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked
from tests.support.planned import exclusive, mps_share

pytestmark = pytest.mark.chart(())
"""The plugin runs as its ServiceAccount under the chart's RBAC and admission policies."""

GAUGE = "fractional_gpu_dra_mps_waiting_uids"


def reporter(api: ApiTransport, clock: Clock) -> ClaimReporter:
    events = EventRecorder(
        api, component=COMPONENT, instance=NODE, interval_s=60, aggregate=True, clock=clock
    )
    return ClaimReporter(driver_name=DRIVER, node_name=NODE, status=None, events=events)


def events(fake: FakeKubeApi, reason: str, kind: str = "", name: str = "") -> list[dict[str, Any]]:
    return [
        e
        for e in fake.objects("Event")
        if e["reason"] == reason
        and (not kind or e["involvedObject"]["kind"] == kind)
        and (not name or e["involvedObject"]["name"] == name)
    ]


@pytest.fixture
def agent(node_dirs: NodeDirs) -> Iterator[AgentConfig]:
    config = AgentConfig(
        socket_path=os.path.join(node_dirs.plugin, "mps-agent.sock"),
        state_dir=os.path.join(node_dirs.root, "mps"),
        control_binary=fake_control_path(),
        protocol="legacy",
        compute_mode=FakeComputeMode(),
        daemon_env={**os.environ, "PYTHON": sys.executable},
        uid_check_interval_s=0.05,
    )
    yield config
    for pid_file in glob.glob(os.path.join(config.state_dir, "*", "pipe", PID_FILE)):
        with contextlib.suppress(OSError, ValueError), open(pid_file) as f:
            os.kill(int(f.read()), signal.SIGKILL)  # a failed test's daemon


def cuda_client(agent: AgentConfig, gpu: str, action: str, uid: int) -> str:
    """A CUDA process of ``uid`` connecting to (or leaving) the GPU's fake daemon."""
    done = subprocess.run(
        [fake_control_path(), "--fake-client", action, "--uid", str(uid)],
        env={**os.environ, "PYTHON": sys.executable,
             "CUDA_MPS_PIPE_DIRECTORY": os.path.join(gpu_dir(agent.state_dir, gpu), "pipe"),
             "CUDA_MPS_LOG_DIRECTORY": os.path.join(gpu_dir(agent.state_dir, gpu), "log")},
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@contextlib.asynccontextmanager
async def mps_plugin(
    dirs: NodeDirs, agent: AgentConfig, api: ApiTransport, observer: ClaimReporter
) -> AsyncIterator[tuple[RegisteredPlugin, str]]:
    """The plugin on two MPS-shared fake GPUs, polling ``agent`` every 50 ms; gpu-0's UUID."""
    config = dataclasses.replace(
        dirs.config(),
        settings=NodeSettings(),  # MPS
        mps_agent_socket=agent.socket_path,
        health_probe_interval=0.05,
    )
    claims = KubernetesClaimSource(api, request_timeout_s=5)
    runtime = await start_plugin(
        PluginParts(config, FakeGpuBackend("h100-80gb:2", NODE), claims, reporting=observer)
    )
    assert runtime.inventory is not None
    kubelet = FakeKubelet(dirs.registry)
    try:
        yield await kubelet.wait_for_plugin(DRIVER), runtime.inventory.gpus[0].uuid
    finally:
        await kubelet.close()
        await runtime.stop()


def check_first_wait(fake: FakeKubeApi, gpu: str) -> str:
    """UID 0 waits on UID 1000's server: a Warning on the Node, a and b; the Node's text."""
    (on_node,) = events(fake, "MpsUidWait", "Node", NODE)
    assert on_node["type"] == "Warning"
    text: str = on_node["message"]
    assert gpu in text and "UID 1000" in text and "UID 0 wait" in text
    assert "runAsUser" in text and "MPS v3" in text and "MIG" in text
    assert "every claim with an MPS share on it is told" in text  # no UIDs known
    for name in ("a", "b"):
        (on_claim,) = events(fake, "MpsUidWait", "ResourceClaim", name)
        assert on_claim["type"] == "Warning"
        message = on_claim["message"]
        assert message.startswith("This claim's MPS share of gpu-0")
        assert "may be the one waiting" in message
        assert gpu in message and "UID 1000" in message and "runAsUser" in message
    assert not events(fake, "MpsUidWait", "ResourceClaim", "c")  # on gpu-1
    return text


def test_a_uid_wait_is_a_warning_on_node_and_claims_until_it_clears(
    fake_kube: FakeKubeApi, api: ApiTransport, node_dirs: NodeDirs, agent: AgentConfig
) -> None:
    refs = [
        claim_ref(fake_kube.create(resource_claim("default", name, devices=[share(device)])))
        for name, device in (("a", "gpu-0"), ("b", "gpu-0"), ("c", "gpu-1"))
    ]
    clock = Clock()
    observer = reporter(api, clock)
    metrics = AgentMetrics()

    def counts() -> list[int]:
        return [e["count"] for e in events(fake_kube, "MpsUidWait")]

    async def scenario() -> None:
        async with (
            agent_running(agent, metrics),
            mps_plugin(node_dirs, agent, api, observer) as (plugin, gpu),
        ):
            assert not any(r.error for r in (await plugin.prepare(refs)).values())

            def gauge() -> float | None:
                return metrics.registry.get_sample_value(GAUGE, {"gpu_uuid": gpu})

            assert cuda_client(agent, gpu, "connect", 1000).isdigit()  # UID 1000 served
            await asyncio.sleep(0.3)
            assert gauge() == 0
            assert not fake_kube.objects("Event")

            assert cuda_client(agent, gpu, "connect", 0) == "pending"
            await eventually(lambda: len(counts()) == 3)
            assert gauge() == 1
            text = check_first_wait(fake_kube, gpu)

            # Polled every 50 ms, written once per the recorder's interval.
            await asyncio.sleep(0.3)
            assert await observer.flush()
            assert counts() == [1, 1, 1]
            clock.now += 61
            await eventually(lambda: counts() == [2, 2, 2])

            cuda_client(agent, gpu, "exit", 1000)  # UID 0 is served now
            await eventually(lambda: bool(events(fake_kube, "MpsUidWaitCleared")))
            (cleared,) = events(fake_kube, "MpsUidWaitCleared", "Node", NODE)
            assert cleared["type"] == "Normal"
            assert gpu in cleared["message"] and "UID 0" in cleared["message"]
            assert gauge() == 0
            assert not events(fake_kube, "MpsUidWaitCleared", "ResourceClaim")

            # Another wait (UID 1000 on UID 0's server) is another Warning at once.
            assert cuda_client(agent, gpu, "connect", 1000) == "pending"
            await eventually(lambda: len(events(fake_kube, "MpsUidWait", "Node")) == 2)
            assert gauge() == 1
            (new,) = [e for e in events(fake_kube, "MpsUidWait", "Node") if e["message"] != text]
            assert "runs as UID 0" in new["message"] and "UID 1000 wait" in new["message"]
            cuda_client(agent, gpu, "exit", 0)
            await eventually(lambda: len(events(fake_kube, "MpsUidWaitCleared")) == 2)
            assert not any(r for r in (await plugin.unprepare(refs)).values())

    run_checked(scenario())
    # Device health is left alone: the GPU works, the client waits.
    health = [
        (e["reason"], e["message"])
        for e in fake_kube.objects("Event")
        if e["reason"].startswith("Device")
    ]
    assert not health, health


# -- the watch, with a stand-in share list ---------------------------------------------

GPU = "GPU-0"


@dataclasses.dataclass(frozen=True)
class Prepared:
    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]


def share_info(claim_uid: str, uid: int | None, gpu: str = GPU) -> ShareInfo:
    return ShareInfo(
        gpu_uuid=gpu, share_id=f"share-{claim_uid}", claim_uid=claim_uid,
        memory_limit_bytes=1 << 30, active_thread_percentage=50, uid=uid,
        protocol="legacy", namespace=None, pipe_dir="/p", shm_dir="/s",
    )  # fmt: skip


class Shares:
    def __init__(self, shares: list[ShareInfo] | None) -> None:
        self.shares = shares

    async def list_shares(self) -> list[ShareInfo]:
        if self.shares is None:
            raise MpsAgentUnavailableError("the agent is away")
        return self.shares

    # The rest of the agent's port: the watch reads only the share list.
    async def ensure_share(
        self,
        gpu_uuid: str,
        share_id: str,
        *,
        claim_uid: str,
        memory_limit_bytes: int,
        active_thread_percentage: int,
        uid: int | None = None,
        tenant: str | None = None,
        cooperative: bool = False,
    ) -> ShareInfo:
        raise NotImplementedError

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        raise NotImplementedError

    async def status(self) -> AgentStatus:
        raise NotImplementedError


def status(*daemons: DaemonStatus) -> AgentStatus:
    return AgentStatus(version=1, protocol="legacy", daemons=daemons)


def waiting(server: int, *uids: int, gpu: str = GPU) -> DaemonStatus:
    return DaemonStatus(gpu, 1, True, 0, 2, server_uid=server, waiting_uids=uids)


def test_waiting_claims_are_those_of_a_waiting_uid_when_every_uid_is_known() -> None:
    shares = [share_info("a", 0), share_info("b", 1000), share_info("x", None, gpu="GPU-1")]
    assert waiting_claims(GPU, (0,), shares) == frozenset({"a"})
    assert waiting_claims(GPU, (2000,), shares) == frozenset()
    assert waiting_claims(GPU, (0,), [*shares, share_info("c", None)]) is None


def test_only_claims_whose_share_waits_are_told_when_the_uids_are_known(
    fake_kube: FakeKubeApi, api: ApiTransport
) -> None:
    refs = {n: ClaimRef("default", n, ClaimUID(f"uid-{n}")) for n in "abcd"}
    observer = reporter(api, Clock())
    observer.remember(
        [
            Prepared(refs["a"], (mps_share("gpu-0", gpu=GPU, pool=NODE),)),
            Prepared(refs["b"], (mps_share("gpu-0", gpu=GPU, pool=NODE),)),
            Prepared(refs["c"], (mps_share("gpu-1", gpu="GPU-1", pool=NODE),)),
            Prepared(refs["d"], (exclusive("gpu-0", gpu=GPU, pool=NODE),)),
        ]
    )
    source = Shares([share_info("uid-a", 0), share_info("uid-b", 1000)])
    watch = MpsUidWatch(source, [observer])

    async def scenario() -> None:
        await watch.update(status(waiting(1000, 0)))
        assert watch.waits == {GPU: MpsUidWait(GPU, 1000, (0,), claim_uids=frozenset({"uid-a"}))}
        assert await observer.flush()
        (on_a,) = events(fake_kube, "MpsUidWait", "ResourceClaim")
        assert on_a["involvedObject"]["name"] == "a"
        assert "is of a waiting UID: its containers wait" in on_a["message"]
        (on_node,) = events(fake_kube, "MpsUidWait", "Node")
        assert "not known" not in on_node["message"]

        # The share list cannot be read: every MPS claim on the GPU, and it says so.
        source.shares = None
        await watch.update(status(waiting(1000, 0)))
        assert watch.waits[GPU].claim_uids is None
        assert not events(fake_kube, "MpsUidWaitCleared")  # the same wait
        await watch.update(status(waiting(1000, 0, gpu="GPU-1")))  # GPU-0's is over
        assert await observer.flush()
        told = {e["involvedObject"]["name"] for e in events(fake_kube, "MpsUidWait")}
        assert told == {NODE, "a", "b", "c"}  # never d: not MPS
        (cleared,) = events(fake_kube, "MpsUidWaitCleared", "Node")
        assert GPU in cleared["message"] and "GPU-1" not in cleared["message"]
        await observer.close()

    run_checked(scenario())


def test_a_failing_listener_does_not_stop_the_others() -> None:
    told: list[MpsUidWait] = []

    class Broken:
        def mps_uid_waiting(self, wait: MpsUidWait) -> None:
            raise RuntimeError("bug")

        def mps_uid_wait_cleared(self, wait: MpsUidWait) -> None:
            raise RuntimeError("bug")

    class Recording:
        def mps_uid_waiting(self, wait: MpsUidWait) -> None:
            told.append(wait)

        def mps_uid_wait_cleared(self, wait: MpsUidWait) -> None:
            told.append(dataclasses.replace(wait, waiting_uids=()))

    watch = MpsUidWatch(None, [Broken(), Recording()])
    asyncio.run(watch.update(status(waiting(1000, 0, 7, 0))))
    asyncio.run(watch.update(status()))
    assert told == [MpsUidWait(GPU, 1000, (0, 7)), MpsUidWait(GPU, 1000, ())]
