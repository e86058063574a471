"""``dra-driver demo``: the whole node-side flow on one machine, no cluster, no GPU.

Fake GPUs (two H100s, an L4 and an H100 with MIG on); the slices the node
would publish; the mps-agent with the packaged fake MPS control daemon; the
kubelet plugin on real unix sockets in a temp dir; a kubelet-like client that
registers it over gRPC and prepares example claims: two MPS shares of one GPU
with different limits, a whole GPU, a time-sliced share, a MIG instance made
on demand, two MPS shares of one MIG instance (made on demand) with different
limits, and two claims the node must refuse; then a table of what each
claim got; device health: an XID on a fake GPU, the device taint the node
would publish and the kubelet's health stream, then the GPU's reset and the
recovery; and the unprepare that undoes it all.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TextIO

from dra_driver.allocator.allocate import AllocatorState
from dra_driver.allocator.simulate import claim_object, device_class, order_batch
from dra_driver.app.agent import run_agent
from dra_driver.app.plugin import Plugin, PluginConfig, PluginParts, start_plugin
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.base.quantity import format_bytes
from dra_driver.core.model import Inventory
from dra_driver.core.prepare import (
    Admin,
    Exclusive,
    MigInstance,
    MpsInMig,
    MpsShare,
    PlannedDevice,
    TimeSliced,
    mig_of,
)
from dra_driver.core.published import device_names
from dra_driver.core.settings import (
    Allocator,
    Capabilities,
    GpuSettings,
    NodeSettings,
    Sharing,
    Tenancy,
)
from dra_driver.core.slices import DesiredSlice, build_slices, validate_pool
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import (
    FakeKubelet,
    HealthReport,
    PrepareResult,
    RegisteredPlugin,
    health_reports,
)
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.fakes.objects import Allocated, claim_ref, resource_claim, share
from dra_driver.k8s.slice_plan import slice_name
from dra_driver.mpsagent.agent import AgentConfig
from dra_driver.mpsagent.client import MpsAgentClient
from dra_driver.mpsagent.compute_mode import FakeComputeMode
from dra_driver.mpsagent.protocol import ShareInfo
from dra_driver.plugin.defaults import DEFAULT_DRIVER_NAME
from dra_driver.plugin.health_monitor import HealthMonitor
from dra_driver.state.checkpoint import CheckpointClaim

NODE = "demo-node"
MIG_SHARED = "gpu-3-mig-1g10gb-19-1"
"""A 1g.10gb partition of the MIG GPU whose instances are MPS-shared in the demo."""


def example_claims(node: str, driver: str) -> list[dict[str, Any]]:
    """Claims a scheduler could have allocated on ``node``, plus two it should refuse."""
    return [
        # Two pods' claims sharing gpu-0 under MPS, each with its own limits.
        resource_claim(
            "default",
            "llm-small",
            node=node,
            driver=driver,
            devices=[share("gpu-0", memory="10Gi", compute_percent=25)],
        ),
        resource_claim(
            "default",
            "llm-large",
            node=node,
            driver=driver,
            devices=[share("gpu-0", memory="30Gi", compute_percent=50)],
        ),
        resource_claim(
            "research",
            "trainer",
            node=node,
            driver=driver,
            devices=[Allocated("gpu-1", request="big")],
        ),
        resource_claim("default", "notebook", node=node, driver=driver, devices=[share("gpu-2")]),
        # A MIG 1g.10gb instance, created at prepare on the MIG-enabled gpu-3.
        resource_claim(
            "default",
            "mig-job",
            node=node,
            driver=driver,
            devices=[Allocated("gpu-3-mig-1g10gb-19-0")],
        ),
        # Two claims sharing one MIG instance as MPS clients, each with its own limits:
        # the instance is made on demand and destroyed after the last unprepare.
        resource_claim(
            "default",
            "mig-small",
            node=node,
            driver=driver,
            devices=[share(MIG_SHARED, memory="2Gi", compute_percent=30)],
        ),
        resource_claim(
            "default",
            "mig-large",
            node=node,
            driver=driver,
            devices=[share(MIG_SHARED, memory="4Gi", compute_percent=60)],
        ),
        resource_claim(
            "default", "other-node", node="node-b", driver=driver, devices=[Allocated("gpu-0")]
        ),
        resource_claim("default", "not-allocated", node=node, driver=driver, allocated=False),
    ]


def _describe_device(device: Mapping[str, Any]) -> str:
    attrs = device.get("attributes", {})
    kind = attrs.get("type", {}).get("string")
    if kind == "mig":
        return str(attrs["profile"]["string"])
    sharing = attrs.get("sharing", {}).get("string", "?")
    memory = device.get("capacity", {}).get("memory", {})
    if device.get("allowMultipleAllocations"):
        policy = memory.get("requestPolicy", {})
        step = policy.get("validRange", {}).get("step", "?")
        clients = device["capacity"].get("clients", {}).get("value", "?")
        return (
            f"{device['name']} {sharing}: memory {memory.get('value')} in {step} steps, "
            f"computePercent, {clients} clients"
        )
    return f"{device['name']} {sharing}: memory {memory.get('value')}"


def _slices_for_136(
    inventory: Inventory,
    settings: NodeSettings,
    taints: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[DesiredSlice]:
    """The ResourceSlices the plugin would publish on a 1.36 cluster, validated as a pool."""
    caps = Capabilities.for_version(36)
    slices = build_slices(
        inventory,
        driver_name=DEFAULT_DRIVER_NAME,
        node_name=NODE,
        settings=settings,
        capabilities=caps,
        taints=taints,
    )
    validate_pool([s.spec for s in slices], caps)
    return slices


def _print_slices(inventory: Inventory, settings: NodeSettings, out: TextIO) -> None:
    """A summary of the ResourceSlices the plugin would publish on a 1.36 cluster."""
    slices = _slices_for_136(inventory, settings)
    print(
        f"\nResourceSlices for a Kubernetes 1.36 cluster ({len(slices)}; "
        "`dra-driver render-slices` prints them in full):",
        file=out,
    )
    for desired in slices:
        name = slice_name(NODE, DEFAULT_DRIVER_NAME, desired.key)
        counters = desired.spec.get("sharedCounters", ())
        if counters:
            sets = ", ".join(f"{c['name']} ({len(c['counters'])} counters)" for c in counters)
            print(f"  {name}: counter sets {sets}", file=out)
        described = [_describe_device(d) for d in desired.spec.get("devices", ())]
        mig = Counter(d for d in described if " " not in d)
        whole = [d for d in described if " " in d]
        for line in whole:
            print(f"  {name}: {line}", file=out)
        if mig:
            parts = ", ".join(f"{profile} x{n}" for profile, n in mig.items())
            print(f"  {name}: {sum(mig.values())} MIG placements ({parts})", file=out)


def _table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), file=out
        )
        if n == 0:
            print("  ".join("-" * w for w in widths), file=out)


DEMO_BURST = (40, 28, 14, 10, 6, 72, 6)
"""GiB of a burst of inference claims for the controller's allocator."""


def _print_allocator(inventory: Inventory, out: TextIO) -> None:
    """The controller path: its allocator packs a burst of share claims, largest first."""
    slices = build_slices(
        inventory,
        driver_name=DEFAULT_DRIVER_NAME,
        node_name=NODE,
        settings=NodeSettings(default=GpuSettings(allocator=Allocator.CONTROLLER)),
        capabilities=Capabilities.for_version(36),
    )
    state = AllocatorState(
        slices=[{"spec": s.spec} for s in slices],
        classes=[device_class(DEFAULT_DRIVER_NAME)],
        allocated_claims=[],
        driver_name=DEFAULT_DRIVER_NAME,
    )
    placed: dict[str, list[str]] = {}
    for number, gib in enumerate(order_batch(g * 2**30 for g in DEMO_BURST)):
        outcome = state.allocate(claim_object(number, gib))
        where = outcome.allocation.results[0].device if outcome.allocation else "(no room)"
        placed.setdefault(where, []).append(format_bytes(gib))
    print(
        f"\ncontroller path: the allocator packs {len(DEMO_BURST)} share claims "
        f"({', '.join(f'{g}Gi' for g in DEMO_BURST)}) best fit, largest first:",
        file=out,
    )
    for device, sizes in placed.items():
        print(f"  {device}: {' + '.join(sizes)}", file=out)


def _enforced(device: PlannedDevice) -> str:
    match device:
        case MpsShare(limits=limits) | MpsInMig(limits=limits):
            sm = f", {limits.compute_percent}% SMs" if limits.compute_percent else ""
            inside = f" in MIG {device.mig.profile_name}" if isinstance(device, MpsInMig) else ""
            return f"MPS {format_bytes(limits.memory_bytes)}{sm}{inside}"
        case MigInstance(mig=mig):
            return f"MIG {mig.profile_name}" + (" (created)" if mig.created else "")
        case Exclusive():
            return "whole GPU"
        case TimeSliced():
            return "time-sliced"
        case Admin():
            return device.mode.value


def _print_mig_daemons(
    daemons: Sequence[Any], recorded: Mapping[ClaimUID, CheckpointClaim], out: TextIO
) -> None:
    """The daemons of MIG instances: one per instance, its claims its MPS clients."""
    for daemon in daemons:
        if not daemon.gpu_uuid.startswith("MIG-"):
            continue
        devices = {
            d.device_name
            for claim in recorded.values()
            for d in claim.devices
            if (mig := mig_of(d)) is not None and mig.mig_uuid == daemon.gpu_uuid
        }
        print(
            f"mps-agent: MPS daemon for MIG instance {daemon.gpu_uuid} "
            f"({', '.join(sorted(devices))}, made on demand; pid {daemon.pid}) holds "
            f"{daemon.shares} share(s) under legacy MPS (v3 namespaces are for whole GPUs: "
            "its limits are daemon defaults and client env); the instance goes after the "
            "last unprepare",
            file=out,
        )


def _result_rows(
    refs: Sequence[ClaimRef],
    results: dict[str, PrepareResult],
    recorded: Mapping[ClaimUID, CheckpointClaim],
) -> list[list[str]]:
    rows = [["CLAIM", "DEVICE", "ENFORCED", "CDI DEVICE ID", "ERROR"]]
    for ref in refs:
        result = results[ref.uid]
        name = f"{ref.namespace}/{ref.name}"
        if result.error:
            rows.append([name, "-", "-", "-", result.error.split(": ", 1)[-1]])
            continue
        for got, planned in zip(result.devices, recorded[ref.uid].devices, strict=True):
            rows.append(
                [name, got.device_name, _enforced(planned), ",".join(got.cdi_device_ids), ""]
            )
    return rows


HEALTH_DEMO_GPU = 1
HEALTH_DEMO_XID = 48
HEALTH_WAIT_S = 10.0
SHOWN_TAINTS = 3


async def _health_of(stream: AsyncIterator[Any], device: str, wanted: str) -> HealthReport:
    """Read the health stream until ``device`` reports ``wanted`` (as the kubelet hears it)."""

    async def read() -> HealthReport:
        async for message in stream:
            report = health_reports(message).get(device)
            if report is not None and report.health == wanted:
                return report
        raise RuntimeError("the health stream ended")

    return await asyncio.wait_for(read(), HEALTH_WAIT_S)


def _published_taints(inventory: Inventory, settings: NodeSettings, monitor: HealthMonitor) -> str:
    """The taints of the slices a 1.36 cluster would get now, one ``slice/device: taint``."""
    slices = _slices_for_136(inventory, settings, monitor.taints())
    found = [
        f"{slice_name(NODE, DEFAULT_DRIVER_NAME, s.key)} device {d['name']}: "
        f"{t['key']}={t['value']}:{t['effect']}"
        for s in slices
        for d in s.spec.get("devices", ())
        for t in d.get("taints", ())
    ]
    if len(found) > SHOWN_TAINTS:
        found = [*found[:SHOWN_TAINTS], f"... ({len(found)} devices in all)"]
    return "; ".join(found) or "none"


async def _show_health(
    runtime: Plugin, backend: FakeGpuBackend, plugin: RegisteredPlugin, out: TextIO
) -> bool:
    """An XID on a fake GPU: the taint, the health stream, then the reset and the recovery."""
    monitor = runtime.health_monitor
    inventory = await backend.inventory()
    index = min(HEALTH_DEMO_GPU, len(inventory.gpus) - 1)
    gpu = inventory.gpus[index]
    device = next(
        name
        for name in device_names(inventory)
        if name == gpu.device_name or name.startswith(f"{gpu.device_name}-mig-")
    )
    stream = plugin.watch_health("v1alpha1")
    try:
        first = health_reports(await anext(stream))
        states = Counter(r.health for r in first.values())
        summary = ", ".join(f"{n} {state}" for state, n in states.items())
        print(f"\nhealth stream (v1alpha1): {len(first)} devices: {summary}", file=out)

        backend.inject_xid(index, HEALTH_DEMO_XID, "double-bit ECC error")
        sick = await _health_of(stream, device, "Unhealthy")
        print(f"XID {HEALTH_DEMO_XID} injected on {device}:", file=out)
        print(f"  health stream: {device} {sick.health}: {sick.message}", file=out)
        tainted = _published_taints(inventory, runtime.config.settings, monitor)
        print(f"  device taints published: {tainted}", file=out)

        # A fatal XID clears when the GPU is reset: the probe finds it resetting, then back.
        backend.inject_reset(index)
        await monitor.probe_once()
        await monitor.probe_once()
        well = await _health_of(stream, device, "Healthy")
        untainted = _published_taints(inventory, runtime.config.settings, monitor)
        print(
            f"GPU reset seen: {device} {well.health}; device taints published: {untainted}",
            file=out,
        )
        return tainted != "none" and untainted == "none"
    finally:
        await stream.aclose()


def _node_dirs(work_dir: str) -> PluginConfig:
    """Lay out a node's kubelet directories under ``work_dir``."""
    plugin_dir = os.path.join(work_dir, "plugins", DEFAULT_DRIVER_NAME)
    config = PluginConfig(
        driver_name=DEFAULT_DRIVER_NAME,
        node_name=NODE,
        registry_dir=os.path.join(work_dir, "plugins_registry"),
        plugin_dir=plugin_dir,
        cdi_root=os.path.join(work_dir, "cdi"),
        boot_id_file=os.path.join(work_dir, "boot_id"),
        # gpu-0 is MPS-shared (the default), gpu-2 time-sliced; gpu-3's MIG instances
        # are MPS-shared (its own sharing: mps).
        settings=NodeSettings(
            per_gpu={
                "2": GpuSettings(Sharing.TIMESLICING),
                "3": GpuSettings(mig_sharing=Sharing.MPS, tenancy=Tenancy.COOPERATIVE),
            }
        ),
        mps_agent_socket=os.path.join(plugin_dir, "mps-agent.sock"),
    )
    for folder in (config.registry_dir, config.plugin_dir, config.cdi_root):
        os.makedirs(folder, exist_ok=True)
    with open(config.boot_id_file, "w", encoding="ascii") as handle:
        handle.write("demo-boot\n")
    return config


def _agent_config(config: PluginConfig, work_dir: str) -> AgentConfig:
    """The mps-agent with the packaged fake nvidia-cuda-mps-control (MPS v3)."""
    assert config.mps_agent_socket is not None
    return AgentConfig(
        socket_path=config.mps_agent_socket,
        state_dir=os.path.join(work_dir, "mps"),
        control_binary=fake_control_path(),
        protocol="v3",
        compute_mode=FakeComputeMode(),
        daemon_env={**os.environ, "PYTHON": sys.executable},
    )


async def run_demo(fake_gpus: str, config: PluginConfig, work_dir: str, out: TextIO) -> int:
    agent_ready = asyncio.Event()
    agent = asyncio.create_task(
        run_agent(_agent_config(config, work_dir), install_signal_handlers=False, ready=agent_ready)
    )
    try:
        await asyncio.wait_for(agent_ready.wait(), timeout=10)
        return await _run_plugin_side(fake_gpus, config, out)
    finally:
        agent.cancel()
        await asyncio.gather(agent, return_exceptions=True)


async def _run_plugin_side(fake_gpus: str, config: PluginConfig, out: TextIO) -> int:
    registry, cdi_root = config.registry_dir, config.cdi_root
    claims = example_claims(NODE, DEFAULT_DRIVER_NAME)
    backend = FakeGpuBackend(fake_gpus, NODE)
    kubelet = FakeKubelet(registry)
    runtime = await start_plugin(PluginParts(config, backend, InMemoryClaimSource(claims)))
    try:
        inventory = await runtime.backend.inventory()
        print(f"node {NODE}: fake GPUs {fake_gpus}", file=out)
        for gpu in inventory.gpus:
            memory = f"{gpu.memory_bytes / 2**30:.1f} GiB"
            print(f"  {gpu.device_name}  {gpu.product_name}  {memory}  {gpu.uuid}", file=out)
        _print_slices(inventory, config.settings, out)
        _print_allocator(inventory, out)
        plugin = await kubelet.wait_for_plugin(DEFAULT_DRIVER_NAME)
        print(f"\nkubelet registered {plugin.name}: endpoint {plugin.endpoint}", file=out)
        print(
            f"  plugin offers {', '.join(plugin.supported)}; kubelet uses {plugin.service}",
            file=out,
        )

        refs = [claim_ref(c) for c in claims]
        results = await plugin.prepare(refs)
        recorded = runtime.driver.checkpoints.load().claims
        print(
            f"\nNodePrepareResources ({len(refs)} claims in one call); one CDI spec per "
            f"claim in {cdi_root}:",
            file=out,
        )
        _table(_result_rows(refs, results, recorded), out)

        assert config.mps_agent_socket is not None
        agent = MpsAgentClient(config.mps_agent_socket)
        daemons = (await agent.status()).daemons
        for daemon in daemons:
            if daemon.gpu_uuid.startswith("MIG-"):
                continue
            print(
                f"\nmps-agent: MPS daemon for {daemon.gpu_uuid} (pid {daemon.pid}) holds "
                f"{daemon.shares} namespace(s), one per claim, with their limits",
                file=out,
            )
        _print_mig_daemons(daemons, recorded, out)

        again = await plugin.prepare(refs)
        same = all(again[r.uid] == results[r.uid] for r in refs)
        print(f"repeated prepare returns the recorded result: {'yes' if same else 'NO'}", file=out)

        recovered = await _show_health(runtime, backend, plugin, out)

        prepared = [r for r in refs if not results[r.uid].error]
        errors = await plugin.unprepare(prepared)
        left = sorted(os.listdir(cdi_root))
        shares = await _shares_once_calls_pause(agent, out)
        migs = sum(len(g.mig_devices) for g in (await runtime.backend.inventory()).gpus)
        print(
            f"\nNodeUnprepareResources ({len(prepared)} claims): "
            f"{'all ok' if not any(errors.values()) else errors}; CDI specs left: {len(left)}, "
            f"MPS namespaces left: {len(shares)}, MIG instances left: {migs}",
            file=out,
        )
        ok = (
            same and recovered and not any(errors.values()) and not left and not shares and not migs
        )
        return 0 if ok else 1
    finally:
        await kubelet.close()
        await runtime.stop()
        print(f"plugin stopped; sockets removed: {not os.listdir(registry)}", file=out)


async def _shares_once_calls_pause(agent: MpsAgentClient, out: TextIO) -> list[ShareInfo]:
    """The agent's shares once the plugin's deferred releases are sent: an MPS v3
    share goes after its unprepare's answer, when the calls pause
    (plugin/deferred_releases.py); at most 5 s."""
    started = time.monotonic()
    shares = await agent.list_shares()
    at_answer = len(shares)
    while shares and time.monotonic() < started + 5:
        await asyncio.sleep(0.02)
        shares = await agent.list_shares()
    if at_answer != len(shares):
        print(
            f"\nMPS shares at the unprepare's answer: {at_answer}; the MPS v3 ones are "
            f"released once the kubelet's calls pause ({at_answer - len(shares)} within "
            f"{(time.monotonic() - started) * 1000:.0f} ms)",
            file=out,
        )
    return shares


def main(fake_gpus: str, work_dir: str | None, out: TextIO) -> int:
    if work_dir:
        os.makedirs(work_dir, exist_ok=True)
        return asyncio.run(run_demo(fake_gpus, _node_dirs(work_dir), work_dir, out))
    # Unix socket paths must stay short: keep the temp dir near the root.
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as tmp:
        return asyncio.run(run_demo(fake_gpus, _node_dirs(tmp), tmp, out))
