"""The isolation model (issue 33), stated and tested: two claims of two Kubernetes
namespaces on one GPU (one MIG GPU) through the real prepare path (the engine, the
mps-agent with the fake ``nvidia-cuda-mps-control``, the fake GPU backend), each
container's view read from its rendered CDI spec, and compared with the rows of
:mod:`tests.support.isolation`, which also render ``docs/isolation.md``'s table.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from dra_driver.app.plugin import PluginParts, start_plugin
from dra_driver.core.cdi.driver_edits import edits_from_driver_files, edits_from_toolkit_spec
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing, Tenancy
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import FakeKubelet
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim, share
from dra_driver.gpu.driver_files import BINARIES, discover_driver_files
from tests.support.isolation import (
    CONTROL_NODES,
    MODES,
    MPS_CONTROL,
    OWN_NS,
    PIPE,
    TOOLKIT,
    Mode,
    View,
    container_view,
    doc_rows,
    symbols,
    table_rows,
)
from tests.support.mps import agent_running, fake_agent_config
from tests.support.node import DRIVER, NODE, NodeDirs, run_checked

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "isolation.md"
PARTITION = "gpu-0-mig-1g10gb-19-3"
OTHER_PARTITION = "gpu-0-mig-1g10gb-19-4"
COOP = GpuSettings(tenancy=Tenancy.COOPERATIVE)
MIG_MPS = GpuSettings(mig_sharing=Sharing.MPS)


@dataclass(frozen=True)
class Setup:
    """How a mode is made on a node: its settings, GPUs, agent protocol, and the
    devices claim A (namespace team-a) and claim B (team-b) are allocated."""

    settings: NodeSettings
    gpus: str
    devices: tuple[Allocated, Allocated]
    protocol: str = "v3"


def _shares(device: str, memory: str = "1Gi") -> tuple[Allocated, Allocated]:
    return share(device, memory=memory), share(device, memory=memory)


SETUPS: dict[str, Setup] = {
    "exclusive": Setup(
        NodeSettings(default=GpuSettings(Sharing.EXCLUSIVE)),
        "h100-80gb:2",
        (Allocated("gpu-0"), Allocated("gpu-1")),
    ),
    "time-sliced": Setup(
        NodeSettings(default=GpuSettings(Sharing.TIMESLICING)), "h100-80gb:1", _shares("gpu-0")
    ),
    "admin access": Setup(
        NodeSettings(default=GpuSettings(Sharing.EXCLUSIVE)),
        "h100-80gb:1",
        (Allocated("gpu-0"), Allocated("gpu-0", admin_access=True)),
    ),
    "MPS v3 share": Setup(NodeSettings(), "h100-80gb:1", _shares("gpu-0")),
    "legacy MPS share": Setup(
        NodeSettings(legacy_mps=True), "h100-80gb:1", _shares("gpu-0"), "legacy"
    ),
    "legacy MPS share, cooperative": Setup(
        NodeSettings(legacy_mps=True, default=COOP), "h100-80gb:1", _shares("gpu-0"), "legacy"
    ),
    "MIG instance": Setup(
        NodeSettings(), "h100-80gb:1:mig", (Allocated(PARTITION), Allocated(OTHER_PARTITION))
    ),
    "MPS inside MIG": Setup(
        NodeSettings(per_gpu={"0": MIG_MPS}), "h100-80gb:1:mig", _shares(PARTITION, "2Gi")
    ),
    "MPS inside MIG, cooperative": Setup(
        NodeSettings(per_gpu={"0": dataclasses.replace(MIG_MPS, tenancy=Tenancy.COOPERATIVE)}),
        "h100-80gb:1:mig",
        _shares(PARTITION, "2Gi"),
    ),
}


@dataclass(frozen=True)
class Outcome:
    errors: tuple[str, str]
    views: tuple[View | None, View | None]
    pipes: tuple[str, ...]
    shms: tuple[str, ...]


def _prepare_two(dirs: NodeDirs, setup: Setup) -> Outcome:
    agent = dataclasses.replace(fake_agent_config(dirs.plugin, dirs.root), protocol=setup.protocol)
    claims = [
        resource_claim(ns, f"{ns}-claim", devices=[device])
        for ns, device in zip(("team-a", "team-b"), setup.devices, strict=True)
    ]
    refs = [claim_ref(c) for c in claims]
    config = dataclasses.replace(
        dirs.config(), settings=setup.settings, mps_agent_socket=agent.socket_path
    )
    backend = FakeGpuBackend(setup.gpus, NODE)

    async def scenario() -> tuple[str, str]:
        async with agent_running(agent):
            runtime = await start_plugin(PluginParts(config, backend, InMemoryClaimSource(claims)))
            kubelet = FakeKubelet(dirs.registry)
            try:
                plugin = await kubelet.wait_for_plugin(DRIVER)
                # One after the other: B meets the daemon A's prepare made.
                a = (await plugin.prepare(refs[:1]))[refs[0].uid].error
                b = (await plugin.prepare(refs[1:]))[refs[1].uid].error
                return a, b
            finally:
                await kubelet.close()
                await runtime.stop()

    errors = run_checked(scenario())
    views: list[View | None] = []
    for ref in refs:
        path = os.path.join(dirs.cdi, f"k8s.gpu.fractional.dev-claim_{ref.uid}.json")
        if os.path.exists(path):
            with open(path) as handle:
                views.append(container_view(json.load(handle)))
        else:
            views.append(None)
    state = agent.state_dir
    return Outcome(
        errors,
        (views[0], views[1]),
        tuple(glob.glob(os.path.join(state, "*", "pipe"))),
        tuple(glob.glob(os.path.join(state, "*", "shm"))),
    )


def _named(paths: frozenset[str], out: Outcome) -> frozenset[str]:
    return symbols(paths - CONTROL_NODES, out.pipes, out.shms)


@pytest.mark.parametrize("mode", MODES, ids=[m.name for m in MODES])
def test_two_namespaces_on_one_gpu(node_dirs: NodeDirs, mode: Mode) -> None:
    out = _prepare_two(node_dirs, SETUPS[mode.name])
    a, b = out.views
    assert out.errors[0] == "" and a is not None, out.errors
    # Every container gets the driver's control nodes (TOOLKIT) and what its row says.
    assert a.host_paths >= CONTROL_NODES, TOOLKIT
    assert _named(a.host_paths, out) == mode.gets
    # No container gets the MPS control binary (the fake backend mounts no driver files;
    # see test_real_driver_files_mount_no_mps_control for real nodes).
    assert not any(p.endswith(MPS_CONTROL) for p in a.host_paths | a.container_mounts)
    if mode.refused:
        assert mode.refused in out.errors[1], out.errors
        assert str(mode.opt_in) in out.errors[1], out.errors
        assert b is None  # nothing written for the refused claim
        return
    assert out.errors[1] == "" and b is not None, out.errors
    assert _named(b.host_paths, out) == (
        frozenset({"/dev/nvidia1"}) if mode.name == "exclusive" else mode.gets
    )
    # Nothing of A's is B's beyond the row's named exceptions (each with a source).
    assert _named(a.shared_with(b), out) == frozenset(mode.shared), a.shared_with(b)
    assert all(mode.shared.values())
    for view in (a, b):
        # A daemon's pipe root (its control socket) and its /dev/shm reach containers of
        # two namespaces only under the row's named exception (legacy, cooperative).
        if set(out.pipes) & view.host_paths:
            assert PIPE in mode.shared and "/dev/shm" in view.container_mounts
        if OWN_NS in mode.gets:  # MPS v3: its own namespace directory, no /dev/shm
            assert "/dev/shm" not in view.container_mounts


def test_v3_namespace_dirs_are_each_claims_own(node_dirs: NodeDirs) -> None:
    out = _prepare_two(node_dirs, SETUPS["MPS v3 share"])
    a, b = out.views
    assert a is not None and b is not None
    (pipe,) = out.pipes
    own = [{p for p in v.host_paths if p.startswith(pipe + os.sep)} for v in (a, b)]
    assert all(len(dirs) == 1 for dirs in own) and not own[0] & own[1]
    assert pipe not in a.host_paths | b.host_paths


def test_the_doc_table_is_the_model() -> None:
    expected = table_rows()
    assert doc_rows(DOC.read_text()) == expected, "docs/isolation.md's table:\n" + "\n".join(
        expected
    )


def _driver_root(tmp: pathlib.Path, names: Sequence[str]) -> tuple[str, str]:
    root, dev = tmp / "driver", tmp / "dev"
    version = "580.65.06"
    for lib in ("libcuda", "libnvidia-ml"):
        (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True, exist_ok=True)
        (root / "usr/lib/x86_64-linux-gnu" / f"{lib}.so.{version}").write_bytes(b"")
    (root / "usr/bin").mkdir(parents=True)
    for name in names:
        (root / "usr/bin" / name).write_bytes(b"")
    dev.mkdir()
    (dev / "nvidiactl").write_bytes(b"")
    return str(root), str(dev)


def test_real_driver_files_mount_no_mps_control(tmp_path: pathlib.Path) -> None:
    """On a real node's driver root holding the tool, no claim's container gets it."""
    assert MPS_CONTROL not in BINARIES
    root, dev = _driver_root(tmp_path, (*BINARIES, MPS_CONTROL))
    edits = edits_from_driver_files(discover_driver_files(root, dev_root=dev))
    mounted: list[Any] = [m.container_path for m in edits.mounts]
    assert not [p for p in mounted if p.endswith(MPS_CONTROL)], mounted


def test_the_toolkit_specs_mps_control_tool_is_withheld() -> None:
    """The NVIDIA Container Toolkit's spec mounts the tool too; a claim never gets it."""
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}],
        "containerEdits": {
            "mounts": [
                {"hostPath": f"/usr/bin/{name}", "containerPath": f"/usr/bin/{name}"}
                for name in ("nvidia-smi", MPS_CONTROL)
            ]
        },
    }
    parsed = edits_from_toolkit_spec(spec)
    assert [m.container_path for m in parsed.common.mounts] == ["/usr/bin/nvidia-smi"]
    assert any(MPS_CONTROL in note for note in parsed.skipped), parsed.skipped
