"""cgroup v2 dmem limits for MPS shares: detection, the hook's installation, the plan.

The hook script itself is tested in ``test_dmem_hook_script.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import stat
from collections.abc import Sequence
from typing import Any

import pytest

from dra_driver.base.errors import AllocationError
from dra_driver.base.ids import GpuUUID, PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.cdi import Hook, cdi_spec_problems, render_spec
from dra_driver.core.model import Inventory, ResourceClaim
from dra_driver.core.prepare import (
    DmemHookSettings,
    Mode,
    MpsShare,
    NodeContext,
    PreparePlan,
    dmem_hook,
    plan_prepare,
)
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.dmemhook import HOOK_FILE, hook_script, install_hook
from dra_driver.fakes.gpu import FakeGpuBackend, build_inventory, load_spec
from dra_driver.fakes.objects import Allocated, resource_claim, share
from dra_driver.gpu.dmem import (
    canonical_bus_id,
    detect_dmem,
    device_memory_regions,
    parse_capacity,
)
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo
from dra_driver.plugin.enforcement import DmemLimits, Enforcer, dmem_hook_settings

DRIVER = "gpu.fractional.dev"
NODE = "node-a"
GIB = 1 << 30
UID = "5e0a7c1d-0000-4000-8000-000000000001"
GPUS: Inventory = build_inventory(load_spec("h100-80gb:2"), NODE)
GPU0, GPU1 = GPUS.gpus
HOOK = "/var/lib/fractional-gpu-dra/hooks/dmem-hook.sh"
REGION0 = f"nvidia/{GPU0.uuid}/vidmem"


def region_of(bus_id: str) -> str:
    return f"nvidia/{bus_id}/vidmem"


# -- detection ------------------------------------------------------------------------


def test_bus_ids_compare_in_one_form() -> None:
    assert canonical_bus_id("00000000:3B:00.0") == "0000:3b:00.0"  # NVML's form
    assert canonical_bus_id("0000:3b:00.0") == "0000:3b:00.0"  # sysfs / dmem's form
    assert canonical_bus_id("10000:01:00.1") == "10000:01:00.1"  # a VMD domain
    assert canonical_bus_id("gpu0") is None


def test_device_memory_regions_of_one_gpu() -> None:
    capacity = parse_capacity(
        "nvidia/0000:3b:00.0/vidmem 85899345920\n"
        "drm/0000:3b:00.0/vram0 1024\n"
        "drm/0000:3b:00.0/stolen 8650752\n"  # system memory: not the GPU's own
        "nvidia/0000:86:00.0/vidmem 85899345920\n"  # another GPU
        "garbage line\n"
    )
    assert capacity["drm/0000:3b:00.0/stolen"] == 8650752
    assert "garbage" not in capacity
    assert device_memory_regions(capacity, "00000000:3B:00.0") == (
        "drm/0000:3b:00.0/vram0",
        "nvidia/0000:3b:00.0/vidmem",
    )
    assert device_memory_regions(capacity, "0000:af:00.0") == ()
    assert device_memory_regions(capacity, "") == ()


def cgroup_tree(tmp_path: pathlib.Path, controllers: str | None, capacity: str | None) -> str:
    root = tmp_path / "cgroup"
    root.mkdir()
    if controllers is not None:
        (root / "cgroup.controllers").write_text(controllers)
    if capacity is not None:
        (root / "dmem.capacity").write_text(capacity)
    return str(root)


def test_detection_maps_each_gpu_to_its_regions(tmp_path: pathlib.Path) -> None:
    root = cgroup_tree(
        tmp_path, "cpu memory dmem pids\n", f"{region_of(GPU0.pci_bus_id)} 85899345920\n"
    )
    found = detect_dmem(GPUS.gpus, root)
    assert found.regions == {GPU0.uuid: (region_of(GPU0.pci_bus_id),)}
    on, off = found.notes
    assert "limits on for GPU gpu-0" in on and region_of(GPU0.pci_bus_id) in on
    # The GPU without a region says why, and what the node registers.
    assert "limits off for GPU gpu-1" in off and GPU1.uuid in off
    assert "release 615" in off and region_of(GPU0.pci_bus_id) in off


@pytest.mark.parametrize(
    ("controllers", "capacity", "words"),
    [
        (None, None, "not a cgroup v2 hierarchy"),
        ("cpu memory pids\n", None, "no dmem cgroup controller"),
        ("cpu memory dmem\n", None, "not the root cgroup"),  # a container's own view
        ("cpu memory dmem\n", "", "regions: none"),  # the proprietary driver registers none
    ],
)
def test_detection_says_why_there_are_no_limits(
    tmp_path: pathlib.Path, controllers: str | None, capacity: str | None, words: str
) -> None:
    found = detect_dmem(GPUS.gpus, cgroup_tree(tmp_path, controllers, capacity))
    assert found.regions == {}
    assert any(words in note for note in found.notes), found.notes


# -- installing the hook --------------------------------------------------------------


def test_install_writes_the_script_executable(tmp_path: pathlib.Path) -> None:
    hook_dir = tmp_path / "var" / "hooks"
    old = os.umask(0o077)  # a strict umask must not take the execute bits away
    try:
        path = install_hook(str(hook_dir))
    finally:
        os.umask(old)
    assert path == str(hook_dir / HOOK_FILE)
    assert pathlib.Path(path).read_bytes() == hook_script()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
    assert sorted(os.listdir(hook_dir)) == [HOOK_FILE]  # no temp file left behind


def test_install_is_idempotent(tmp_path: pathlib.Path) -> None:
    path = install_hook(str(tmp_path))
    before = os.stat(path)
    assert install_hook(str(tmp_path)) == path
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("damage", ["content", "mode"])
def test_install_replaces_a_stale_or_unexecutable_file_atomically(
    tmp_path: pathlib.Path, damage: str
) -> None:
    path = pathlib.Path(install_hook(str(tmp_path)))
    if damage == "content":
        path.write_text("#!/bin/sh\n# an older release\n")
    else:
        path.chmod(0o644)
    with open(path, "rb") as running:  # a runtime executing the old file
        install_hook(str(tmp_path))
        assert running.read() != hook_script() or damage == "mode"
    assert path.read_bytes() == hook_script()
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert sorted(os.listdir(tmp_path)) == [HOOK_FILE]


def test_the_packaged_script_is_the_one_in_the_source_tree() -> None:
    source = pathlib.Path(__file__).parents[2] / "dra_driver" / "dmemhook" / HOOK_FILE
    assert hook_script() == source.read_bytes()


def test_plugin_start_installs_the_hook_only_when_a_gpu_has_a_region(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dra_driver.plugin.enforcement")
    hook_dir = tmp_path / "hooks"
    bare = cgroup_tree(tmp_path, "cpu memory dmem\n", "")
    assert (
        asyncio.run(
            dmem_hook_settings(
                GPUS.gpus, cgroup_root=bare, hook_dir=str(hook_dir), mode=DmemLimits.AUTO
            )
        )
        is None
    )
    assert not hook_dir.exists()
    assert "limits off for GPU gpu-0" in caplog.text

    root = tmp_path / "cgroup"
    (root / "dmem.capacity").write_text(f"{region_of(GPU1.pci_bus_id)} 85899345920\n")
    settings = asyncio.run(
        dmem_hook_settings(
            GPUS.gpus, cgroup_root=str(root), hook_dir=str(hook_dir), mode=DmemLimits.STRICT
        )
    )
    assert settings == DmemHookSettings(
        hook_path=str(hook_dir / HOOK_FILE),
        regions={GPU1.uuid: (region_of(GPU1.pci_bus_id),)},
        strict=True,
        log_path=str(hook_dir / "dmem-hook.log"),
    )
    assert os.access(settings.hook_path, os.X_OK)

    off = asyncio.run(
        dmem_hook_settings(
            GPUS.gpus, cgroup_root=str(root), hook_dir=str(hook_dir), mode=DmemLimits.OFF
        )
    )
    assert off is None


# -- the plan -------------------------------------------------------------------------


def ctx(dmem: DmemHookSettings | None, sharing: Sharing = Sharing.MPS) -> NodeContext:
    return NodeContext(
        driver_name=DRIVER,
        node_name=NODE,
        pool_name=PoolName(NODE),
        cdi_kind="k8s.gpu.fractional.dev/claim",
        settings=NodeSettings(default=GpuSettings(sharing=sharing)),
        dmem=dmem,
    )


def dmem_on(*gpus: GpuUUID, **kw: Any) -> DmemHookSettings:
    return DmemHookSettings(
        hook_path=HOOK,
        regions={g: (f"nvidia/{g}/vidmem",) for g in gpus},
        **kw,
    )


def claim(*devices: Allocated) -> ResourceClaim:
    return claim_from_dict(resource_claim("ns", "c", uid=UID, node=NODE, devices=devices))


def hooks(plan: PreparePlan) -> dict[str, tuple[Hook, ...]]:
    return {d.name: d.edits.hooks for d in plan.cdi_spec.devices}


def test_an_mps_share_gets_the_hook_with_its_memory() -> None:
    plan = plan_prepare(
        claim(share("gpu-0", memory="10Gi", compute_percent=25)), GPUS, ctx(dmem_on(GPU0.uuid))
    )
    ((hook,),) = hooks(plan).values()
    assert hook == Hook(
        hook_name="createContainer",
        path=HOOK,
        args=("dmem-hook.sh", "--gpu", GPU0.uuid, "--max", str(10 * GIB), "--", REGION0),
        timeout=10,
    )
    # The spec with the hook is one a runtime loads.
    assert cdi_spec_problems(render_spec(plan.cdi_spec)) == []
    rendered = render_spec(plan.cdi_spec)["devices"][0]["containerEdits"]["hooks"]
    assert rendered == [
        {"hookName": "createContainer", "path": HOOK, "args": list(hook.args), "timeout": 10}
    ]


def test_two_shares_of_one_gpu_are_limited_to_their_sum() -> None:
    """count > 1 on one GPU: one MPS namespace, one limit for the claim's containers."""
    rc = claim(share("gpu-0", memory="4Gi", request="a"), share("gpu-0", memory="6Gi", request="b"))
    plan = plan_prepare(rc, GPUS, ctx(dmem_on(GPU0.uuid)))
    assert [d.mode for d in plan.devices] == [Mode.MPS, Mode.MPS]
    found = hooks(plan)
    assert len(found) == 2
    for (hook,) in found.values():
        assert hook.args[hook.args.index("--max") + 1] == str(10 * GIB)


def configured(
    *devices: Allocated, configs: Sequence[tuple[str, tuple[str, ...], dict[str, Any]]]
) -> ResourceClaim:
    """A claim whose allocation carries ``(source, requests, mps section)`` GpuConfigs."""
    raw = resource_claim("ns", "c", uid=UID, node=NODE, devices=devices)
    raw["status"]["allocation"]["devices"]["config"] = [
        {
            "source": source,
            "requests": list(requests),
            "opaque": {
                "driver": DRIVER,
                "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "mps": mps},
            },
        }
        for source, requests, mps in configs
    ]
    return claim_from_dict(raw)


def hook_args(plan: PreparePlan) -> list[tuple[str, ...]]:
    return [hook.args for found in hooks(plan).values() for hook in found]


@pytest.mark.parametrize(
    ("devices", "configs", "args"),
    [
        pytest.param(
            [share("gpu-0", memory="10Gi")],
            [],
            ("--max", str(10 * GIB)),
            id="no-soft-limit-no-min",
        ),
        pytest.param(
            [share("gpu-0", memory="10Gi")],
            [("FromClaim", (), {"memorySoftLimit": "6Gi"})],
            ("--max", str(10 * GIB), "--min", str(6 * GIB)),
            id="soft-limit",
        ),
        pytest.param(
            [share("gpu-0", memory="10Gi")],
            [("FromClaim", (), {"memoryLimit": "8Gi", "memorySoftLimit": "8Gi"})],
            ("--max", str(8 * GIB), "--min", str(8 * GIB)),
            id="soft-equal-to-the-lowered-hard-limit",
        ),
        pytest.param(
            [share("gpu-0", memory="10Gi")],
            [
                ("FromClaim", (), {"memorySoftLimit": "2Gi"}),
                ("FromClass", (), {"memorySoftLimit": "5Gi"}),
            ],
            ("--max", str(10 * GIB), "--min", str(2 * GIB)),
            id="claim-beats-class",
        ),
        pytest.param(
            [share("gpu-0", memory="10Gi")],
            [("FromClass", (), {"memorySoftLimit": "5Gi"})],
            ("--max", str(10 * GIB), "--min", str(5 * GIB)),
            id="from-the-class",
        ),
        pytest.param(
            [share("gpu-0", memory="4Gi", request="a"), share("gpu-0", memory="6Gi", request="b")],
            [
                ("FromClaim", ("a",), {"memorySoftLimit": "3Gi"}),
                ("FromClaim", ("b",), {"memorySoftLimit": "5Gi"}),
            ],
            ("--max", str(10 * GIB), "--min", str(8 * GIB)),
            id="count-2-sums-the-soft-limits",
        ),
        pytest.param(
            [share("gpu-0", memory="4Gi", request="a"), share("gpu-0", memory="6Gi", request="b")],
            [("FromClaim", ("b",), {"memorySoftLimit": "5Gi"})],
            ("--max", str(10 * GIB), "--min", str(5 * GIB)),
            id="count-2-one-soft-limit",
        ),
    ],
)
def test_the_soft_limit_reaches_the_hook(
    devices: list[Allocated],
    configs: list[tuple[str, tuple[str, ...], dict[str, Any]]],
    args: tuple[str, ...],
) -> None:
    plan = plan_prepare(configured(*devices, configs=configs), GPUS, ctx(dmem_on(GPU0.uuid)))
    found = hook_args(plan)
    assert len(found) == len(devices)  # every share of the GPU: one claim-wide limit
    assert all(a == ("dmem-hook.sh", "--gpu", GPU0.uuid, *args, "--", REGION0) for a in found)
    assert cdi_spec_problems(render_spec(plan.cdi_spec)) == []


def test_a_soft_limit_without_a_dmem_region_has_no_effect() -> None:
    rc = configured(
        share("gpu-0", memory="10Gi"), configs=[("FromClaim", (), {"memorySoftLimit": "6Gi"})]
    )
    for context in (ctx(None), ctx(dmem_on(GPU1.uuid))):
        plan = plan_prepare(rc, GPUS, context)
        assert hook_args(plan) == []
        (device,) = plan.devices
        assert isinstance(device, MpsShare) and device.limits.memory_bytes == 10 * GIB


def test_a_soft_limit_above_the_hard_limit_fails_the_claim() -> None:
    rc = configured(
        share("gpu-0", memory="10Gi"),
        configs=[
            ("FromClass", (), {"memoryLimit": "4Gi"}),
            ("FromClaim", (), {"memorySoftLimit": "6Gi"}),
        ],
    )
    with pytest.raises(AllocationError) as info:
        plan_prepare(rc, GPUS, ctx(dmem_on(GPU0.uuid)))
    message = str(info.value)
    assert f"ns/c:{UID}" in message
    assert "mps.memorySoftLimit: 6Gi exceeds the hard memory limit of 4Gi" in message


def test_strict_and_log_reach_the_hook() -> None:
    settings = dmem_on(GPU0.uuid, strict=True, log_path="/var/lib/x/dmem-hook.log")
    hook = dmem_hook(settings, GPU0.uuid, ("r0", "r1"), 5, soft_memory_bytes=3)
    assert hook.args == (
        "dmem-hook.sh", "--strict", "--log", "/var/lib/x/dmem-hook.log",
        "--gpu", GPU0.uuid, "--max", "5", "--min", "3", "--", "r0", "r1",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("context", "devices"),
    [
        (ctx(None), [share("gpu-0", memory="1Gi")]),  # no dmem on the node
        (ctx(dmem_on(GPU1.uuid)), [share("gpu-0", memory="1Gi")]),  # not on this GPU
        (ctx(dmem_on(GPU0.uuid), Sharing.TIMESLICING), [share("gpu-0")]),  # no limits
        (ctx(dmem_on(GPU0.uuid)), [Allocated("gpu-0")]),  # the whole GPU
    ],
    ids=["no-dmem", "other-gpu", "time-sliced", "exclusive"],
)
def test_no_hook_without_dmem_or_without_an_mps_limit(
    context: NodeContext, devices: list[Allocated]
) -> None:
    plan = plan_prepare(claim(*devices), GPUS, context)
    assert all(h == () for h in hooks(plan).values())


def test_the_plan_with_dmem_is_deterministic() -> None:
    rc = claim(share("gpu-0", memory="2Gi"), share("gpu-1", memory="3Gi", request="b"))
    context = ctx(dmem_on(GPU0.uuid, GPU1.uuid))
    first = plan_prepare(rc, GPUS, context)
    again = plan_prepare(rc, GPUS, dataclasses.replace(context))
    assert render_spec(first.cdi_spec) == render_spec(again.cdi_spec)
    limits = {name: h[0].args[h[0].args.index("--max") + 1] for name, h in hooks(first).items()}
    assert sorted(limits.values()) == [str(2 * GIB), str(3 * GIB)]


class _Agent:
    """The mps-agent as the engine sees it: one share per call, as asked."""

    def __init__(self) -> None:
        self.asked: list[int] = []

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
        self.asked.append(memory_limit_bytes)
        return ShareInfo(
            gpu_uuid=gpu_uuid, share_id=share_id, claim_uid=claim_uid,
            memory_limit_bytes=memory_limit_bytes,
            active_thread_percentage=active_thread_percentage, uid=uid, protocol="v3",
            namespace="s_x", pipe_dir="/run/mps/pipe/shares/s_x", shm_dir="/run/mps/shm",
        )  # fmt: skip

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        return True

    async def list_shares(self) -> list[ShareInfo]:
        return []

    async def status(self) -> AgentStatus:
        return AgentStatus(version=1, protocol="v3", daemons=())


def _enforcer(agent: _Agent) -> Enforcer:
    """The engine's enforcer on two fake H100s, with ``agent`` for its MPS calls."""
    return Enforcer(
        backend=FakeGpuBackend("h100-80gb:2", NODE),
        inventory=lambda: GPUS,
        mig_caps=None,
        mps=agent,
    )


def test_the_engine_keeps_the_hook_beside_the_shares_mounts() -> None:
    rc = claim(share("gpu-0", memory="4Gi", request="a"), share("gpu-0", memory="2Gi", request="b"))
    plan = plan_prepare(rc, GPUS, ctx(dmem_on(GPU0.uuid)))
    agent = _Agent()
    enforcer = _enforcer(agent)
    _, spec = asyncio.run(enforcer.apply(rc.ref, plan.devices, plan.cdi_spec))
    assert agent.asked == [6 * GIB]  # the namespace holds what the hook limits to
    for device in spec.devices:
        (hook,) = device.edits.hooks
        assert hook.args[hook.args.index("--max") + 1] == str(6 * GIB)
        paths = {m.container_path for m in device.edits.mounts}
        # A v3 share: only the namespace's directory (the container keeps its /dev/shm).
        assert paths == {"/run/mps/pipe/shares/s_x"}
    assert cdi_spec_problems(render_spec(spec)) == []


def test_a_claim_with_mps_shares_of_two_gpus_is_refused_before_any_side_effect() -> None:
    # A client has one CUDA_MPS_PIPE_DIRECTORY: a container given both shares could
    # reach one GPU's daemon (issue 26, finding 9). Before: two mounts on one path.
    rc = claim(share("gpu-0", memory="4Gi", request="a"), share("gpu-1", memory="2Gi", request="b"))
    plan = plan_prepare(rc, GPUS, ctx(None))
    agent = _Agent()
    enforcer = _enforcer(agent)
    with pytest.raises(AllocationError) as err:
        asyncio.run(enforcer.apply(rc.ref, plan.devices, plan.cdi_spec))
    message = str(err.value)
    assert f"claim {rc.ref}" in message and "gpu-0, gpu-1" in message
    assert "CUDA_MPS_PIPE_DIRECTORY" in message and "one claim per GPU" in message
    assert agent.asked == []  # the agent was never asked
