"""The one-shot subcommands: ``render-slices``, ``demo``, ``simulate`` and
``cleanup``. They run once and exit; none of them needs a GPU."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING, Any

from dra_driver.base.errors import ConfigError
from dra_driver.cli.flags import (
    add_flag,
    common_flags,
    gpu_flags,
    make_backend,
    node_flags,
    parse_node_settings,
    parse_non_negative,
)
from dra_driver.plugin.defaults import DEFAULT_CDI_ROOT, DEFAULT_PLUGINS_DIR

if TYPE_CHECKING:
    from dra_driver.k8s.publisher import SlicePublisher
    from dra_driver.k8s.transport import ApiTransport


def render_parser(sub: Any) -> None:
    """``dra-driver render-slices``."""
    render = sub.add_parser(
        "render-slices", help="print the ResourceSlices the plugin would publish, as YAML"
    )
    node_flags(render)
    gpu_flags(render)
    add_flag(
        render,
        "--kube-version",
        "the cluster to render for (stands in for the plugin's capability probe)",
        default="1.36",
        choices=["1.34", "1.35", "1.36", "1.37"],
    )
    common_flags(render)


def cmd_render_slices(args: argparse.Namespace) -> int:
    import yaml

    from dra_driver.core.settings import Capabilities
    from dra_driver.core.slices import build_slices, validate_pool
    from dra_driver.k8s.publisher import slice_name

    node_name = args.node_name or "node-a"
    backend = make_backend(args, node_name)
    try:
        inventory = asyncio.run(backend.inventory())
    finally:
        asyncio.run(backend.close())
    capabilities = Capabilities.for_version(int(args.kube_version.split(".")[1]))
    slices = build_slices(
        inventory,
        driver_name=args.driver_name,
        node_name=node_name,
        settings=parse_node_settings(args),
        capabilities=capabilities,
    )
    validate_pool([s.spec for s in slices], capabilities)
    documents = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node_name, args.driver_name, s.key)},
            "spec": dict(s.spec),
        }
        for s in slices
    ]
    print(
        f"# {len(documents)} ResourceSlice(s) for node {node_name} on Kubernetes "
        f"{args.kube_version}"
    )
    print(yaml.safe_dump_all(documents, sort_keys=False), end="")
    return 0


def demo_parser(sub: Any) -> None:
    """``dra-driver demo``."""
    demo = sub.add_parser("demo", help="run the node flow on fake GPUs and print who got what")
    add_flag(
        demo, "--fake-gpus", "fake GPUs for the demo", default="h100-80gb:2,l4:1,h100-80gb:1:mig"
    )
    add_flag(demo, "--work-dir", "keep sockets, checkpoint and CDI specs here (default: temp dir)")
    # The demo's table says what went wrong per claim; the driver's own
    # warnings for the two refused example claims would only repeat it.
    common_flags(demo, log_level="ERROR")


def cmd_demo(args: argparse.Namespace) -> int:
    from dra_driver import demo

    return demo.main(args.fake_gpus, args.work_dir, sys.stdout)


def simulate_parser(simulate: argparse.ArgumentParser) -> None:
    # Nothing heavy here: every subcommand (the mps-agent's too) builds all parsers.
    add_flag(simulate, "--nodes", "nodes in the simulated cluster", default="100")
    add_flag(simulate, "--gpus", "fake GPUs of each node: MODEL[:COUNT]", default="h100-80gb:8")
    add_flag(
        simulate,
        "--claims",
        "claims to generate, or a YAML/JSON file listing each claim's memory",
        default="1000",
    )
    add_flag(simulate, "--seed", "seed of the workload generator", default="1")
    add_flag(
        simulate,
        "--mix",
        "model sizes to draw: MEMORY:WEIGHT,... (default: the inference mix, "
        "allocator/simulate.py INFERENCE_MIX)",
    )
    add_flag(
        simulate,
        "--policy",
        "packing policy (both: compare them)",
        default="both",
        choices=["best-fit", "first-fit", "both"],
    )
    add_flag(
        simulate, "--kube-version", "slices as built for", default="1.36", choices=["1.34", "1.36"]
    )
    add_flag(simulate, "--plot", "write a PNG bar chart here (needs matplotlib)")
    common_flags(simulate, log_level="WARNING")


def cmd_simulate(args: argparse.Namespace) -> int:
    import yaml

    from dra_driver.allocator import simulate as sim
    from dra_driver.base.quantity import parse_quantity

    def whole(text: str, flag: str) -> int:
        return parse_non_negative(text, flag, int, "a whole number")

    if args.claims.isdigit():
        memory = sim.generate(
            whole(args.claims, "--claims"),
            whole(args.seed, "--seed"),
            args.mix or sim.INFERENCE_MIX,
        )
    else:
        try:
            with open(args.claims, encoding="utf-8") as handle:
                listed = yaml.safe_load(handle)
            items = listed["claims"] if isinstance(listed, dict) else listed
            memory = [int(parse_quantity(i["memory"] if isinstance(i, dict) else i)) for i in items]
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as err:
            raise ConfigError(
                f"--claims: {args.claims!r} is neither a number nor a file with a list of"
                f" claims (memory quantities, or {{memory: ...}} entries): {err}"
            ) from None
    slices = sim.build_cluster(
        whole(args.nodes, "--nodes"), args.gpus, int(args.kube_version.split(".")[1])
    )
    policies = list(sim.POLICIES) if args.policy == "both" else [args.policy]
    reports = [sim.simulate(slices, memory, policy=p) for p in policies]
    print(sim.format_report(reports))
    if args.plot:
        sim.plot(reports, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def cleanup_parser(sub: Any) -> None:
    cleanup = sub.add_parser("cleanup", help="undo what the driver left on this node (uninstall)")
    node_flags(cleanup)
    add_flag(
        cleanup,
        "--plugin-dir",
        f"the plugin's data directory; default {DEFAULT_PLUGINS_DIR}/<driver name>",
    )
    add_flag(cleanup, "--cdi-root", "the transient CDI specs' directory", default=DEFAULT_CDI_ROOT)
    add_flag(
        cleanup,
        "--backend",
        "GPU backend, to destroy the MIG instances the plugin created",
        default="fake",
        choices=["fake", "nvml"],
    )
    add_flag(cleanup, "--fake-gpus", "fake GPUs (fake backend)", default="h100-80gb:2")
    add_flag(
        cleanup, "--mps-agent-socket", "the mps-agent's socket; default <plugin dir>/mps-agent.sock"
    )
    add_flag(
        cleanup,
        "--kubeconfig",
        "delete this node's ResourceSlices through this API (in-cluster when unset); "
        "'none' to leave them",
    )
    common_flags(cleanup)


def cmd_cleanup(args: argparse.Namespace) -> int:
    from dra_driver.core.cdi import cdi_kind_for_driver
    from dra_driver.plugin.cdi_store import CdiStore
    from dra_driver.plugin.cleanup import CleanupReport, cleanup_node

    plugin_dir = args.plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, args.driver_name)
    node_name = args.node_name or ""
    publisher: SlicePublisher | None = None
    http: ApiTransport | None = None
    if args.kubeconfig != "none":
        if not node_name:
            raise ConfigError("--node-name (NODE_NAME) is required to delete the node's slices")
        from dra_driver.k8s.client import make_api_client
        from dra_driver.k8s.publisher import SlicePublisher
        from dra_driver.k8s.transport import api_transport

        http = api_transport(make_api_client(args.kubeconfig))
        publisher = SlicePublisher(http, driver_name=args.driver_name, node_name=node_name)

    async def cleanup() -> CleanupReport:
        try:
            return await cleanup_node(
                checkpoint_path=os.path.join(plugin_dir, "checkpoint.json"),
                cdi=CdiStore(args.cdi_root, cdi_kind_for_driver(args.driver_name)),
                backend=make_backend(args, node_name or "node"),
                mps_socket=args.mps_agent_socket or os.path.join(plugin_dir, "mps-agent.sock"),
                publisher=publisher,
            )
        finally:
            if http is not None:
                await http.close()

    report = asyncio.run(cleanup())
    print(
        f"MIG instances destroyed: {len(report.mig_destroyed)}, MPS shares released: "
        f"{len(report.shares_released)}, CDI specs removed: {len(report.cdi_specs_removed)}, "
        f"ResourceSlices deleted: {len(report.slices_deleted)}, problems: {len(report.problems)}"
    )
    return 1 if report.problems else 0
