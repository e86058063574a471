"""Shared pieces of the two local-process e2e modes (control-plane and host-process).

``E2E_MODE`` picks the mode of a run: ``chart`` (the default: the driver is
installed with the chart, ``test_examples_e2e.py``), ``control-plane`` (a cluster
without kubelets: ``test_control_plane_mode.py``) or ``host-process`` (the
cluster's node runs a real kubelet on this host: ``test_host_process_mode.py``).
The tests of the other modes are deselected (``tests/e2e/conftest.py``).

In both local modes the driver runs on this machine as two processes, the
kubelet plugin (``--backend fake``) and the mps-agent (``--mps-control fake``),
against the cluster at ``KUBECONFIG``. The DeviceClasses come from the chart
(rendered with helm from ``hack/bin/``; only the missing ones are created, and
only those are deleted afterwards). The examples are applied as written, with
the driver name substituted (``tests.support.examples.render_example``) and their pods kept
on the node under test; ``E2E_IMAGE`` replaces the pods' images and sets
``imagePullPolicy: Never`` (clusters without a registry).

Environment (besides ``tests/e2e/conftest.py``'s): ``E2E_MODE``; ``E2E_NODE_NAME``;
``E2E_FAKE_GPUS`` (the plugin's fake GPUs, default the kind install's,
``h100-80gb:3,h100-80gb:2:mig``; the MIG-enabled GPU ``MPS_MIG_GPU``, 4, gets its
own node-config entry ``sharing: mps`` (and stays the scheduler's), as the kind
install gives it, where the set has it; a set without it skips ``mig-mps-shares``,
saying so);
``E2E_IMAGE``; ``E2E_KUBELET_ROOT`` and ``E2E_CDI_ROOT`` (host-process mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.base.quantity import parse_whole
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.fakes.kubelet import FakeKubelet, PrepareResult
from dra_driver.fakes.objects import node_object
from tests.support.chart import helm_binary
from tests.support.cluster import (
    POLL_S,
    Cluster,
    Example,
    apply_object,
    delete_namespace,
    diagnostics,
)
from tests.support.examples import Obj, render_example
from tests.support.processes import stop_process

MODES = ("chart", "control-plane", "host-process")
DEFAULT_MODE = "chart"
ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "fractional-gpu-dra"
NATIVE = (1, 36)
MPS_ENV = "CUDA_MPS_PIPE_DIRECTORY="
GPU_NODE = re.compile(r"^c\S+\s.*\s/dev/nvidia\d+$", re.MULTILINE)
"""An ``ls -l`` line of a character device ``/dev/nvidia<N>`` (real or stand-in)."""
OPT_IN_LABEL = "gpu.fractional.dev/enabled"


def selected_mode() -> str:
    return os.environ.get("E2E_MODE") or DEFAULT_MODE


KIND_FAKE_GPUS = "h100-80gb:3,h100-80gb:2:mig"
"""What ``hack/kind/install-driver.sh`` gives every node (hack/kind/common.sh FAKE_GPUS):
the local modes default to the same GPUs, two MIG-enabled ones included."""
MPS_MIG_GPU = 4
"""The MIG-enabled GPU whose MIG instances are MPS-shared (hack/kind/common.sh
MPS_MIG_GPU): its own node-config entry says ``sharing: mps``."""


def fake_gpus() -> str:
    return os.environ.get("E2E_FAKE_GPUS") or KIND_FAKE_GPUS


def mig_gpus() -> list[int]:
    """Indices of the MIG-enabled GPUs among the fake GPUs."""
    inventory = build_inventory(load_spec(fake_gpus()), "e2e")
    return [gpu.index for gpu in inventory.gpus if gpu.mig_enabled]


def mps_mig_gpu() -> int | None:
    """``MPS_MIG_GPU`` when the fake GPUs have it with MIG on, else None."""
    return MPS_MIG_GPU if MPS_MIG_GPU in mig_gpus() else None


def node_config_args(directory: str) -> list[str]:
    """The plugin's ``--node-config``, written in ``directory``, as the kind install's
    per-node entry: GPU ``MPS_MIG_GPU`` with ``sharing: mps`` and ``tenancy: cooperative``
    (the opt-in without which its instances are exclusive); none without that GPU.

    The entry also keeps that GPU the scheduler's, as on kind: where the local modes
    run the controller they publish every other GPU for it (``--allocator
    controller``), and its best fit would put the controller-path share on one of
    this GPU's MPS-shared MIG partitions."""
    index = mps_mig_gpu()
    if index is None:
        return []
    path = Path(directory) / "node-config.yaml"
    entry = {"sharing": "mps", "allocator": "scheduler", "tenancy": "cooperative"}
    path.write_text(yaml.safe_dump({"gpus": {str(index): entry}}))
    return ["--node-config", str(path)]


# --- the examples as the local modes apply them -----------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """One example and what its claims must get."""

    name: str
    claims: tuple[tuple[str, str], ...]
    """(pod, the pod's claim entry) for every claim to check; a shared claim once."""
    devices: int = 1
    """Devices of ours per claim."""
    share: bool = False
    """A capacity share: a shareID, and MPS edits when the GPU is MPS-shared."""
    needs: str = ""
    """What of 1.36+ the example needs that 1.34/1.35 lack (named in its skip there);
    empty: it runs on 1.34."""
    mig: bool = False
    """MIG devices: the pods see the instance's capability nodes."""
    mps_mig: bool = False
    """Shares of a MIG instance: needs the MPS-shared MIG GPU (``MPS_MIG_GPU``); else
    (``mig``) an exclusive MIG instance, of any other MIG-enabled GPU."""


CONSUMABLE = "consumable capacity (capacity.requests; DRAConsumableCapacity)"

CASES = (
    Case("whole-gpu", (("pod0", "gpu"),)),
    Case("vram-share", (("pod0", "gpu"),), share=True, needs=CONSUMABLE),
    Case(
        "two-pods-different-limits",
        (("pod-small", "gpu"), ("pod-large", "gpu")),
        share=True,
        needs=CONSUMABLE,
    ),
    Case("shared-claim-two-pods", (("pod0", "gpu"),)),
    Case(
        "count-two-distinct",
        (("pod0", "gpus"),),
        devices=2,
        needs="distinctAttribute constraints (DRAConsumableCapacity)",
    ),
    Case(
        "mig-1g-by-cel",
        (("pod0", "mig"),),
        mig=True,
        needs="MIG instances made on demand (partitionable devices; DRAPartitionableDevices)",
    ),
    Case(
        "mig-mps-shares",
        (("pod-small", "mig"), ("pod-large", "mig")),
        share=True,
        needs="MPS-shared MIG instances (DRAPartitionableDevices and DRAConsumableCapacity)",
        mig=True,
        mps_mig=True,
    ),
    Case("controller-path-share", (("pod0", "gpu"),), share=True),
)


def case_params() -> list[Any]:
    return [pytest.param(case, id=case.name) for case in CASES]


def require_case(case: Case, cluster: Cluster) -> None:
    """Skip, with the reason, a case this cluster or these fake GPUs cannot run."""
    if case.needs and cluster.version < NATIVE:
        pytest.skip(
            f"{case.name}: needs Kubernetes 1.36+ for {case.needs}; this server is"
            f" {cluster.version[0]}.{cluster.version[1]}"
        )
    if case.mps_mig and mps_mig_gpu() is None:
        pytest.skip(
            f"{case.name}: E2E_FAKE_GPUS={fake_gpus()!r} has no MIG-enabled GPU"
            f" {MPS_MIG_GPU} (MPS_MIG_GPU), the one whose node-config entry says sharing:"
            " mps here, so no MIG instance is MPS-shared (the default set has it:"
            f" {KIND_FAKE_GPUS})"
        )
    if case.mig and not case.mps_mig and not set(mig_gpus()) - {mps_mig_gpu()}:
        pytest.skip(
            f"{case.name}: no MIG-enabled fake GPU with exclusive instances in"
            f" E2E_FAKE_GPUS={fake_gpus()!r} (GPU {MPS_MIG_GPU}'s are MPS-shared; add one,"
            f" e.g. {KIND_FAKE_GPUS})"
        )
    if (
        case.name == "controller-path-share"
        and selected_mode() == "chart"
        and os.environ.get("E2E_CONTROLLER_PATH") != "1"
    ):
        pytest.skip(
            "controller path in chart mode: install the chart with controller.enabled=true"
            " (hack/kind/install-driver.sh does) and set E2E_CONTROLLER_PATH=1; the local"
            " modes run the controller themselves"
        )


def pin_pods(objects: list[Obj], node: str, *, tolerate_unready: bool) -> list[Obj]:
    """The example's objects with its pods kept on ``node`` and the image override.

    The pods are pinned with a node affinity on ``metadata.name``, not with
    ``nodeName``: the scheduler must still see them, since it allocates their claims.
    """
    out = copy.deepcopy(objects)
    image = os.environ.get("E2E_IMAGE")
    for obj in out:
        if obj.get("kind") != "Pod":
            continue
        spec = obj["spec"]
        node_affinity = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
        if tolerate_unready:  # no kubelet keeps the node Ready
            spec.setdefault("tolerations", []).extend(
                {"key": key, "operator": "Exists"}
                for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            )
        if image:
            for ctr in [*spec.get("initContainers", []), *spec["containers"]]:
                ctr["image"] = image
                ctr["imagePullPolicy"] = "Never"
    return out


@contextlib.contextmanager
def applied(
    cluster: Cluster,
    name: str,
    node: str,
    *,
    tolerate_unready: bool,
    driver_logs: Callable[[], str],
) -> Iterator[Example]:
    """Apply example ``name`` in its namespace; afterwards diagnostics with the local
    driver's logs (if the body failed) and the namespace deleted (pods force-deleted
    first when no kubelet will)."""
    objects = pin_pods(
        render_example(name, cluster.driver), node, tolerate_unready=tolerate_unready
    )
    namespace = next(o["metadata"]["name"] for o in objects if o["kind"] == "Namespace")
    assert delete_namespace(cluster, namespace), f"{namespace}: left over and stuck"
    example = Example(
        name=name, namespace=namespace, objects=objects, cluster=cluster, driver_logs=driver_logs
    )
    try:
        for obj in objects:
            apply_object(cluster, obj)
        yield example
    except pytest.skip.Exception:
        raise
    except BaseException:
        print(diagnostics(cluster, namespace))
        print(f"===== the local driver\n{driver_logs()}")
        raise
    finally:
        if tolerate_unready:
            for pod in example.pods():
                with contextlib.suppress(Exception):
                    cluster.core.delete_namespaced_pod(
                        pod["metadata"]["name"], namespace, grace_period_seconds=0
                    )
        assert delete_namespace(cluster, namespace), (
            f"{namespace}: not gone after {cluster.delete_timeout_s:.0f}s"
        )


# --- claims, allocation, CDI specs ----------------------------------------------------


def claim_name_of(example: Example, pod_name: str, entry: str, timeout_s: float) -> str:
    """The ResourceClaim's name behind the pod's claim entry (generated ones included)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pod = example.pod(pod_name)
        ref = next(c for c in pod["spec"]["resourceClaims"] if c["name"] == entry)
        name = ref.get("resourceClaimName")
        if name is None:
            statuses = (pod.get("status") or {}).get("resourceClaimStatuses") or []
            name = next((s.get("resourceClaimName") for s in statuses if s["name"] == entry), None)
        if name:
            return str(name)
        if time.monotonic() > deadline:
            pytest.fail(
                f"pod {pod_name}: no ResourceClaim generated for {entry!r} after"
                f" {timeout_s:.0f}s\n{example.waited_for()}"
            )
        time.sleep(POLL_S)


def wait_allocated(example: Example, pod_name: str, entry: str) -> Obj:
    """The pod's claim once the scheduler (or our controller) allocated it."""
    timeout = example.cluster.timeout_s
    name = claim_name_of(example, pod_name, entry, timeout)
    resource = example.cluster.resource("resource.k8s.io/v1", "ResourceClaim")
    deadline = time.monotonic() + timeout
    while True:
        claim: Obj = resource.get(name=name, namespace=example.namespace).to_dict()
        if (claim.get("status") or {}).get("allocation"):
            return claim
        if time.monotonic() > deadline:
            pytest.fail(
                f"{example.namespace}/{name}: not allocated after {timeout:.0f}s"
                f" (E2E_TIMEOUT)\n{example.waited_for()}"
            )
        time.sleep(POLL_S)


def ours(claim: Obj, driver: str) -> list[Obj]:
    results: list[Obj] = claim["status"]["allocation"]["devices"]["results"]
    return [r for r in results if r["driver"] == driver]


def ref_of(claim: Obj) -> ClaimRef:
    meta = claim["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], ClaimUID(meta["uid"]))


def spec_path(cdi_root: str, driver: str, uid: str) -> Path:
    """Where the plugin writes a claim's transient CDI spec."""
    return Path(cdi_root) / f"k8s.{driver}-claim_{uid}.json"


def spec_env(spec: Obj) -> list[str]:
    """Every env entry of a CDI spec (common and per-device edits)."""
    edits = [spec.get("containerEdits") or {}]
    edits += [d.get("containerEdits") or {} for d in spec.get("devices") or []]
    return [str(e) for edit in edits for e in edit.get("env") or []]


def slice_devices(cluster: Cluster, node: str) -> dict[tuple[str, str], Obj]:
    """Our published devices on ``node`` by (pool, name)."""
    found = {}
    for item in cluster.slices():
        spec = item["spec"]
        if spec.get("nodeName") != node:
            continue
        for device in spec.get("devices") or []:
            found[spec["pool"]["name"], device["name"]] = device
    return found


def attribute(device: Obj, name: str) -> object:
    value = (device.get("attributes") or {}).get(name)
    return next(iter(value.values())) if value else None


def check_spec(
    cluster: Cluster, cdi_root: str, claim: Obj, case: Case, node: str
) -> tuple[Obj, list[Obj]]:
    """The claim's CDI spec: present, of our kind, with a device per allocated result;
    MPS edits for a share of an MPS-shared GPU, and a MIG instance's share's limits.
    Returns the spec and our results."""
    results = ours(claim, cluster.driver)
    assert len(results) == case.devices, f"{case.name}: results {results}"
    path = spec_path(cdi_root, cluster.driver, claim["metadata"]["uid"])
    assert path.is_file(), f"{case.name}: no CDI spec {path}"
    spec: Obj = json.loads(path.read_text())
    assert spec["kind"] == f"k8s.{cluster.driver}/claim", spec["kind"]
    assert len(spec.get("devices") or []) >= case.devices, spec.get("devices")
    devices = slice_devices(cluster, node)
    for result in results:
        key = (result["pool"], result["device"])
        assert key in devices, f"allocated {key} is not one of node {node}'s devices"
        if case.share and not granted(claim, cluster.driver, result):
            assert result.get("shareID"), f"{case.name}: a share without shareID: {result}"
            if attribute(devices[key], "sharing") == "mps":
                env = spec_env(spec)
                assert any(e.startswith(MPS_ENV) for e in env), (
                    f"{case.name}: no {MPS_ENV} in {path}: {env}"
                )
        if case.mig:
            device = devices[key]
            wanted = ("mig", "mps" if case.mps_mig else "exclusive")
            got = (attribute(device, "type"), attribute(device, "sharing"))
            assert got == wanted, f"{case.name}: {key} is a {got} device, not {wanted}: {device}"
        if case.mps_mig:
            missing = set(mig_share_env(result)) - set(spec_env(spec))
            assert not missing, f"{case.name}: no {sorted(missing)} in {path}: {spec_env(spec)}"
    return spec, results


def consumed(result: Obj) -> tuple[int, int]:
    """(memory bytes, computePercent) a share consumes, as the allocation says."""
    capacity = result.get("consumedCapacity") or {}
    assert {"memory", "computePercent"} <= set(capacity), f"consumedCapacity of {result}"
    return parse_whole(capacity["memory"]), parse_whole(capacity["computePercent"])


def mig_share_env(result: Obj) -> list[str]:
    """The caps of a share of an MPS-shared MIG instance in its containers' env: the
    instance's MPS daemon is always legacy, so a share's limits are client env, the
    device named ``0`` (the one device its clients see); the amounts are the
    allocation's."""
    memory, percent = consumed(result)
    return [
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={memory // 2**20}M",
        f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percent}",
    ]


def check_prepared(
    case: Case, claim: Obj, spec: Obj, results: list[Obj], got: PrepareResult
) -> None:
    """NodePrepareResources' answer agrees with the allocation and the CDI spec."""
    assert not got.error, f"{case.name}: prepare failed: {got.error}"
    assert sorted((d.pool_name, d.device_name) for d in got.devices) == sorted(
        (r["pool"], r["device"]) for r in results
    )
    names = {f"{spec['kind']}={d['name']}" for d in spec["devices"]}
    for device in got.devices:
        assert device.cdi_device_ids, f"{case.name}: no CDI device for {device}"
        assert set(device.cdi_device_ids) <= names, (device.cdi_device_ids, names)
    if case.share:
        wanted = sorted(str(r.get("shareID") or "") for r in results)
        assert sorted(str(d.share_id or "") for d in got.devices) == wanted, (
            f"{case.name}: shareIDs {[d.share_id for d in got.devices]} != allocation {wanted}"
        )


def granted(claim: Obj, driver: str, result: Obj) -> bool:
    """A share of the controller known by its GpuShareGrant (1.34/1.35 drop shareID)."""
    for config in claim["status"]["allocation"]["devices"].get("config") or []:
        opaque = config.get("opaque") or {}
        params = opaque.get("parameters") or {}
        if (
            opaque.get("driver") == driver
            and params.get("kind") == "GpuShareGrant"
            and params.get("device") == result["device"]
            and result["request"] in (config.get("requests") or [result["request"]])
        ):
            return True
    return False


def wait_status_devices(example: Example, claim: Obj, driver: str, timeout_s: float = 30) -> None:
    """The plugin wrote a Ready ``status.devices`` entry for each of our results (both
    paths): on the scheduler's claims and on the controller's alike."""
    name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
    wanted = {(r["pool"], r["device"], r.get("shareID") or "") for r in ours(claim, driver)}
    deadline = time.monotonic() + timeout_s
    while True:
        current = example.cluster.resource("resource.k8s.io/v1", "ResourceClaim").get(
            name=name, namespace=namespace
        )
        entries = ((current.to_dict().get("status") or {}).get("devices")) or []
        ready = {
            (e["pool"], e["device"], e.get("shareID") or "")
            for e in entries
            if e.get("driver") == driver
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in e.get("conditions") or []
            )
        }
        if wanted <= ready:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"claim {namespace}/{name}: no Ready status.devices entry of {driver} for"
                f" {sorted(wanted - ready)} after {timeout_s:.0f}s: {entries}"
            )
        time.sleep(POLL_S)


def check_case_specifics(case: Case, claims: list[Obj], driver: str) -> None:
    """What an example promises beyond one device per result."""
    if case.name == "mig-mps-shares":
        small, large = (ours(c, driver)[0] for c in claims)
        assert (small["pool"], small["device"]) == (large["pool"], large["device"]), (
            "one MIG instance"
        )
        assert small["shareID"] != large["shareID"]
        assert [consumed(r) for r in (small, large)] == [(2 * 2**30, 30), (4 * 2**30, 60)], (
            "the limits as written (2Gi/30 %, 4Gi/60 %)"
        )
    if case.name == "two-pods-different-limits":
        small, large = (ours(c, driver)[0] for c in claims)
        assert (small["pool"], small["device"]) == (large["pool"], large["device"]), "one GPU"
        assert small["shareID"] != large["shareID"]
    if case.name == "count-two-distinct":
        (claim,) = claims
        assert len({r["device"] for r in ours(claim, driver)}) == 2, "two distinct GPUs"


# --- the driver as local processes ------------------------------------------------------


@dataclasses.dataclass
class LocalDriver:
    """The kubelet plugin and the mps-agent running here against the cluster."""

    node: str
    driver: str
    registry_dir: str
    plugin_dir: str
    cdi_root: str
    log_dir: str
    procs: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)

    @property
    def registration_socket(self) -> str:
        return os.path.join(self.registry_dir, f"{self.driver}-reg.sock")

    def logs(self, tail: int = 80) -> str:
        out = []
        for name in self.procs:
            path = Path(self.log_dir) / f"{name}.log"
            lines = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"--- {name} (last {tail} lines)\n" + "\n".join(lines[-tail:]))
        return "\n".join(out)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{self.logs()}")

    def _start(self, name: str, args: Sequence[str]) -> None:
        with open(Path(self.log_dir) / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "dra_driver", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,  # a Ctrl-C of pytest does not kill it mid-cleanup
            )

    def start(
        self,
        kubeconfig: str,
        mps_state_dir: str,
        extra: Sequence[str] = (),
        *,
        controller_kubeconfig: str | None = None,
        lease_namespace: str = "default",
    ) -> None:
        """The mps-agent and the plugin (``kubeconfig``: its identity); with
        ``controller_kubeconfig`` also our controller, as that identity, and the plugin
        publishes its GPUs for it (``--allocator controller``: the scheduler may still
        allocate them, so the native examples run beside the controller's)."""
        controller = controller_kubeconfig is not None
        common = ["--driver-name", self.driver, "--plugin-dir", self.plugin_dir]
        if controller:
            extra = ["--allocator", "controller", *extra]
        self._start(
            "mps-agent",
            ["mps-agent", *common, "--mps-control", "fake", "--mps-protocol", "v3",
             "--state-dir", mps_state_dir],
        )  # fmt: skip
        self._start(
            "kubelet-plugin",
            ["kubelet-plugin", *common, "--node-name", self.node,
             "--registry-dir", self.registry_dir, "--cdi-root", self.cdi_root,
             "--backend", "fake", "--fake-gpus", fake_gpus(), "--kubeconfig", kubeconfig,
             "--cdi-hook-path", "", "--mps-protocol", "v3", *extra],
        )  # fmt: skip
        if controller:
            self._start(
                "controller",
                ["controller", "--driver-name", self.driver,
                 "--kubeconfig", controller_kubeconfig or kubeconfig,
                 "--lease-namespace", lease_namespace, "--lease-name", "fgd-e2e-controller"],
            )  # fmt: skip

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; the plugin first (it uses the agent)."""
        for name in ("controller", "kubelet-plugin", "mps-agent"):
            stop_process(self.procs.get(name), 15)

    def wait_registration_socket(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.registration_socket):
            self.check_alive()
            if time.monotonic() > deadline:
                pytest.fail(f"no {self.registration_socket} after {timeout_s:.0f}s:\n{self.logs()}")
            time.sleep(0.1)

    def wait_slices(self, cluster: Cluster, timeout_s: float = 60) -> dict[tuple[str, str], Obj]:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            devices = slice_devices(cluster, self.node)
            if devices:
                return devices
            if time.monotonic() > deadline:
                pytest.fail(
                    f"no ResourceSlice of {cluster.driver} for node {self.node} after"
                    f" {timeout_s:.0f}s:\n{self.logs()}"
                )
            time.sleep(POLL_S)

    def prepare_and_unprepare(
        self, refs: Sequence[ClaimRef], check: Callable[[dict[str, PrepareResult]], None]
    ) -> dict[str, str]:
        """Register as the kubelet does, prepare ``refs``, run ``check`` on the answer,
        then unprepare them; returns the unprepare errors by claim UID."""

        async def scenario() -> dict[str, str]:
            kubelet = FakeKubelet(self.registry_dir)
            try:
                plugin = await kubelet.register_socket(self.registration_socket, self.driver)
                prepared = await plugin.prepare(refs)
                try:
                    check(prepared)
                finally:
                    errors = await plugin.unprepare(refs)
                return errors
            finally:
                await kubelet.close()

        return asyncio.run(scenario())


# --- cluster-scoped objects the local modes need ----------------------------------------


def chart_device_classes(driver: str) -> list[Obj]:
    """The chart's DeviceClasses for ``driver`` (skips when no helm is found)."""
    binary = helm_binary()
    if binary is None:
        pytest.skip(
            "the local modes take the DeviceClasses from the chart: helm not found on PATH"
            " or in hack/bin/ (run hack/install-helm.sh)"
        )
    done = subprocess.run(
        [binary, "template", "fgd", str(CHART), "--namespace", "fractional-gpu-dra",
         "--set", f"driverName={driver}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    assert classes, "the chart renders no DeviceClass"
    return classes


def ensure_device_classes(cluster: Cluster) -> list[str]:
    """Create the chart's DeviceClasses that the cluster lacks; returns their names."""
    from kubernetes.client.exceptions import ApiException

    resource = cluster.resource("resource.k8s.io/v1", "DeviceClass")
    created = []
    for obj in chart_device_classes(cluster.driver):
        try:
            resource.create(body=obj)
        except ApiException as err:
            if err.status != 409:  # already there (the chart, or a previous run)
                raise
        else:
            created.append(obj["metadata"]["name"])
    return created


def delete_quietly(cluster: Cluster, api_version: str, kind: str, name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        cluster.resource(api_version, kind).delete(name=name)
    except ApiException as err:
        if err.status != 404:
            print(f"cleanup: could not delete {kind}/{name}: {err.status} {err.reason}")


MARK = "fractional.dev/e2e"
"""Label of the Node objects the e2e tests create (an existing node without it is not ours)."""


def create_node(cluster: Cluster, name: str, owner: str, labels: dict[str, str]) -> None:
    """A kubelet-less Node ``name`` with ``labels``, capacity and a Ready condition,
    marked as made by ``owner``; a skip when a Node of that name is someone else's."""
    from kubernetes.client.exceptions import ApiException

    labels = {
        **labels,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        MARK: owner,
    }
    try:
        cluster.core.create_node(node_object(name, labels))
    except ApiException as err:
        if err.status != 409:
            raise
        existing = cluster.core.read_node(name)
        if (existing.metadata.labels or {}).get(MARK) != owner:
            pytest.skip(
                f"node {name} exists and was not created by these tests (no {MARK}={owner} "
                "label): set E2E_NODE_NAME to a free name"
            )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110"}
    cluster.core.patch_node_status(
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": f"a fake node of the e2e tests ({owner}; no kubelet)",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        },
    )


def delete_node_slices(cluster: Cluster, node: str) -> None:
    """The plugin never deletes its slices on shutdown: the tests do, for their node."""
    resource = cluster.resource("resource.k8s.io/v1", "ResourceSlice")
    for item in cluster.slices():
        if item["spec"].get("nodeName") == node:
            with contextlib.suppress(Exception):
                resource.delete(name=item["metadata"]["name"])


def require_cluster_kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG", "")
    if not path or os.pathsep in path:
        pytest.skip(
            f"the local plugin needs one kubeconfig file; KUBECONFIG={path!r} names"
            f" {'none' if not path else 'several'}"
        )
    return path
