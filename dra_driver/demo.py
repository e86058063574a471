"""``dra-driver demo``: the whole node-side flow on one machine, no cluster, no GPU.

Fake GPUs; an in-memory claim source holding a few allocated example claims;
the kubelet plugin on real unix sockets in a temp dir; a kubelet-like client
that registers it over gRPC and prepares the claims; a table of what each
claim got. Later issues extend it (slices, the allocator, enforcement).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from dra_driver.core.ids import ClaimRef
from dra_driver.core.model import Inventory
from dra_driver.core.settings import Capabilities, NodeSettings
from dra_driver.core.slice_rules import validate_pool
from dra_driver.core.slices import build_slices
from dra_driver.gpu.fake import FakeGpuBackend
from dra_driver.k8s.publisher import slice_name
from dra_driver.plugin.runtime import DEFAULT_DRIVER_NAME, PluginConfig, PluginRuntime
from dra_driver.testing.kubelet import FakeKubelet, PrepareResult
from dra_driver.testing.memory_claims import InMemoryClaimSource
from dra_driver.testing.objects import Allocated, claim_ref, resource_claim, share

NODE = "demo-node"


def example_claims(node: str, driver: str) -> list[dict[str, Any]]:
    """Claims a scheduler could have allocated on ``node``, plus two it should refuse."""
    return [
        resource_claim(
            "default", "llm-inference", node=node, driver=driver, devices=[Allocated("gpu-0")]
        ),
        resource_claim(
            "research",
            "trainer",
            node=node,
            driver=driver,
            devices=[Allocated("gpu-1", request="big")],
        ),
        resource_claim(
            "default",
            "notebook-share",
            node=node,
            driver=driver,
            devices=[
                share(
                    "gpu-2",
                    memory="10Gi",
                    compute_percent=25,
                    share_id="7d3f52c1-0b7e-4f0e-9a55-2b1d5e0c9a10",
                )
            ],
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


def _print_slices(inventory: Inventory, out: TextIO) -> None:
    """A summary of the ResourceSlices the plugin would publish on a 1.36 cluster."""
    caps = Capabilities.for_version(36)
    slices = build_slices(
        inventory,
        driver_name=DEFAULT_DRIVER_NAME,
        node_name=NODE,
        settings=NodeSettings(),
        capabilities=caps,
    )
    validate_pool([s.spec for s in slices], caps)
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


def _result_rows(
    refs: Sequence[ClaimRef], results: dict[str, PrepareResult], cdi_root: str, kind_prefix: str
) -> list[list[str]]:
    rows = [["CLAIM", "DEVICE", "SHARE", "CDI DEVICE ID", "SPEC FILE (in CDI root) / ERROR"]]
    for ref in refs:
        result = results[ref.uid]
        name = f"{ref.namespace}/{ref.name}"
        if result.error:
            rows.append([name, "-", "-", "-", "ERROR: " + result.error.split(": ", 1)[-1]])
            continue
        spec = os.path.join(cdi_root, f"{kind_prefix}{ref.uid}.json")
        for d in result.devices:
            rows.append(
                [
                    name,
                    f"{d.pool_name}/{d.device_name}",
                    d.share_id[:8] + "…" if d.share_id else "-",
                    ",".join(d.cdi_device_ids),
                    os.path.basename(spec) if os.path.exists(spec) else "(missing)",
                ]
            )
    return rows


def _node_dirs(work_dir: str) -> PluginConfig:
    """Lay out a node's kubelet directories under ``work_dir``."""
    config = PluginConfig(
        driver_name=DEFAULT_DRIVER_NAME,
        node_name=NODE,
        registry_dir=os.path.join(work_dir, "plugins_registry"),
        plugin_dir=os.path.join(work_dir, "plugins", DEFAULT_DRIVER_NAME),
        cdi_root=os.path.join(work_dir, "cdi"),
        boot_id_file=os.path.join(work_dir, "boot_id"),
    )
    for folder in (config.registry_dir, config.plugin_dir, config.cdi_root):
        os.makedirs(folder, exist_ok=True)
    with open(config.boot_id_file, "w", encoding="ascii") as handle:
        handle.write("demo-boot\n")
    return config


async def run_demo(fake_gpus: str, config: PluginConfig, out: TextIO) -> int:
    registry, cdi_root = config.registry_dir, config.cdi_root
    claims = example_claims(NODE, DEFAULT_DRIVER_NAME)
    runtime = PluginRuntime(
        config,
        FakeGpuBackend(fake_gpus, NODE),
        InMemoryClaimSource(claims),
    )
    kubelet = FakeKubelet(registry)
    await runtime.start()
    try:
        inventory = await runtime.backend.inventory()
        print(f"node {NODE}: fake GPUs {fake_gpus}", file=out)
        for gpu in inventory.gpus:
            memory = f"{gpu.memory_bytes / 2**30:.1f} GiB"
            print(f"  {gpu.device_name}  {gpu.product_name}  {memory}  {gpu.uuid}", file=out)
        _print_slices(inventory, out)
        plugin = await kubelet.wait_for_plugin(DEFAULT_DRIVER_NAME)
        print(f"\nkubelet registered {plugin.name}: endpoint {plugin.endpoint}", file=out)
        print(
            f"  plugin offers {', '.join(plugin.supported)}; kubelet uses {plugin.service}",
            file=out,
        )

        refs = [claim_ref(c) for c in claims]
        results = await plugin.prepare(refs)
        kind_prefix = f"k8s.{DEFAULT_DRIVER_NAME}-claim_"
        print(
            f"\nNodePrepareResources ({len(refs)} claims in one call), CDI root {cdi_root}:",
            file=out,
        )
        _table(_result_rows(refs, results, cdi_root, kind_prefix), out)

        again = await plugin.prepare(refs)
        same = all(again[r.uid] == results[r.uid] for r in refs)
        print(
            f"\nrepeated prepare returns the recorded result: {'yes' if same else 'NO'}", file=out
        )

        async for health in plugin.watch_health("v1alpha1"):
            states = Counter(
                "Healthy" if d.health == 1 else f"health {d.health}" for d in health.devices
            )
            summary = ", ".join(f"{n} {state}" for state, n in states.items())
            print(f"health stream (v1alpha1): {len(health.devices)} devices: {summary}", file=out)
            break

        prepared = [r for r in refs if not results[r.uid].error]
        errors = await plugin.unprepare(prepared)
        left = sorted(os.listdir(cdi_root))
        print(
            f"\nNodeUnprepareResources ({len(prepared)} claims): "
            f"{'all ok' if not any(errors.values()) else errors}; CDI specs left: {len(left)}",
            file=out,
        )
        ok = same and not any(errors.values()) and not left
        return 0 if ok else 1
    finally:
        await kubelet.close()
        await runtime.stop()
        print(f"plugin stopped; sockets removed: {not os.listdir(registry)}", file=out)


def main(fake_gpus: str, work_dir: str | None, out: TextIO) -> int:
    if work_dir:
        os.makedirs(work_dir, exist_ok=True)
        return asyncio.run(run_demo(fake_gpus, _node_dirs(work_dir), out))
    # Unix socket paths must stay short: keep the temp dir near the root.
    with tempfile.TemporaryDirectory(prefix="dra-demo-") as tmp:
        return asyncio.run(run_demo(fake_gpus, _node_dirs(tmp), out))
