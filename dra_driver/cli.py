"""``dra-driver``: one console script, one subcommand per component.

Every flag has an environment-variable twin (the flag's name in upper case
with ``_``, e.g. ``--cdi-root`` / ``CDI_ROOT``); the flag wins when both are
given. The Helm chart sets only the environment variables.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dra_driver import __version__
from dra_driver.core.errors import ConfigError, DriverError
from dra_driver.core.ports import GpuBackend
from dra_driver.core.settings import NodeSettings
from dra_driver.dmemhook import DEFAULT_HOOK_DIR
from dra_driver.gpu.dmem import DEFAULT_CGROUP_ROOT
from dra_driver.observability.logs import LOG_FORMATS, configure_logging
from dra_driver.plugin.claim_reporting import ClaimReporter
from dra_driver.plugin.runtime import (
    DEFAULT_CDI_ROOT,
    DEFAULT_DRIVER_NAME,
    DEFAULT_PLUGINS_DIR,
    DEFAULT_REGISTRY_DIR,
    PluginRuntime,
)

log = logging.getLogger("dra_driver")

_N = TypeVar("_N", int, float)


def env_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").upper()


class EnvTwinParser(argparse.ArgumentParser):
    """Checks values that came from environment twins as strictly as flags.

    argparse applies ``type`` to a string default but never checks it against
    ``choices``; an invalid ``LOG_LEVEL`` must fail like ``--log-level`` does.
    Subparsers inherit this class, so each subcommand checks its own flags.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(parsed, action.dest, None)
            if action.choices is None or value is None or value in action.choices:
                continue
            flag = action.option_strings[0] if action.option_strings else action.dest
            choices = ", ".join(map(str, action.choices))
            self.error(f"{env_name(flag)}={value!r} is not a valid {flag} (choose from {choices})")
        return parsed, extras


def add_flag(parser: argparse.ArgumentParser, flag: str, help: str, **kwargs: Any) -> None:
    """Add ``flag`` whose default comes from its environment twin when set."""
    env = env_name(flag)
    if env in os.environ:
        kwargs["default"] = os.environ[env]
    default = kwargs.get("default")
    suffix = f" [env {env}" + (f"; default {default}]" if default not in (None, "") else "]")
    parser.add_argument(flag, help=help + suffix, **kwargs)


def _common(parser: argparse.ArgumentParser, log_level: str = "INFO") -> None:
    add_flag(
        parser,
        "--log-level",
        "log level",
        default=log_level,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    add_flag(
        parser,
        "--log-format",
        "log lines as text or as JSON objects (one per line)",
        default="text",
        choices=list(LOG_FORMATS),
    )


def _metrics_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--metrics-port",
        "serve Prometheus metrics at :PORT/metrics; 0 turns them off",
        default="0",
    )
    add_flag(parser, "--metrics-address", "address the metrics server binds", default="0.0.0.0")


def _node_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(parser, "--node-name", "this node's name (downward API spec.nodeName)")


def _gpu_flags(parser: argparse.ArgumentParser, fake_gpus: str = "h100-80gb:2") -> None:
    add_flag(
        parser,
        "--backend",
        "GPU discovery: nvml (the node's driver) or fake (no GPU needed)",
        default="fake",
        choices=["fake", "nvml"],
    )
    add_flag(
        parser,
        "--fake-gpus",
        "fake GPUs: MODEL[:COUNT[:mig]],... or a YAML/JSON file",
        default=fake_gpus,
    )
    add_flag(
        parser,
        "--sharing",
        "how each non-MIG GPU is shared (a node setting)",
        default="mps",
        choices=["mps", "timeslicing", "exclusive"],
    )
    add_flag(
        parser,
        "--allocator",
        "who allocates this node's GPUs: the kube-scheduler or our controller",
        default="scheduler",
        choices=["scheduler", "controller"],
    )
    add_flag(parser, "--memory-reserve", "device memory kept back on each GPU", default="0")
    add_flag(parser, "--memory-step", "granularity of memory shares", default="256Mi")
    add_flag(parser, "--max-clients", "shares per GPU (MPS allows 48)", default="48")
    add_flag(parser, "--node-config", "YAML file with node settings and per-GPU overrides")


def _simulate_parser(simulate: argparse.ArgumentParser) -> None:
    from dra_driver.allocator.simulate import INFERENCE_MIX

    add_flag(simulate, "--nodes", "nodes in the simulated cluster", default="100")
    add_flag(simulate, "--gpus", "fake GPUs of each node: MODEL[:COUNT]", default="h100-80gb:8")
    add_flag(
        simulate,
        "--claims",
        "claims to generate, or a YAML/JSON file listing each claim's memory",
        default="1000",
    )
    add_flag(simulate, "--seed", "seed of the workload generator", default="1")
    add_flag(simulate, "--mix", "model sizes to draw: MEMORY:WEIGHT,...", default=INFERENCE_MIX)
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
    _common(simulate, log_level="WARNING")


def _run_simulate(args: argparse.Namespace) -> int:
    import yaml

    from dra_driver.allocator import simulate as sim
    from dra_driver.core.quantity import parse_quantity

    def whole(text: str, flag: str) -> int:
        return _non_negative(text, flag, int, "a whole number")

    if args.claims.isdigit():
        memory = sim.generate(whole(args.claims, "--claims"), whole(args.seed, "--seed"), args.mix)
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


def _cleanup_parser(sub: Any) -> None:
    cleanup = sub.add_parser("cleanup", help="undo what the driver left on this node (uninstall)")
    _node_flags(cleanup)
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
    _common(cleanup)


def _health_flags(parser: argparse.ArgumentParser) -> None:
    """Device health of the kubelet plugin (plugin/health_monitor.py)."""
    add_flag(
        parser,
        "--health-probe-interval",
        "seconds between GPU liveness probes and health reports to the kubelet "
        "(0: no probe; reports every 30 s)",
        default="30",
    )
    add_flag(
        parser,
        "--health-recovery-seconds",
        "seconds a device must stay free of non-fatal errors before it is healthy again",
        default="300",
    )
    add_flag(
        parser,
        "--fatal-xid-taint-effect",
        "taint effect of devices whose GPU needs a reset (fatal XID, GPU lost): NoSchedule "
        "keeps new pods away, NoExecute also evicts the pods using them",
        default="NoSchedule",
        choices=["NoSchedule", "NoExecute"],
    )
    add_flag(
        parser,
        "--ignored-xids",
        "comma-separated XIDs that never make a device unhealthy",
        default="",
    )


def _dmem_flags(parser: argparse.ArgumentParser) -> None:
    """cgroup v2 dmem limits for MPS shares (plugin/enforcement.py, dra_driver/dmemhook)."""
    add_flag(
        parser,
        "--dmem-limits",
        "kernel-enforced GPU-memory limits for MPS shares (cgroup v2 dmem hook): auto (where "
        "a GPU has a dmem region), strict (a failing hook fails the container), off",
        default="auto",
        choices=["auto", "strict", "off"],
    )
    add_flag(
        parser,
        "--hook-dir",
        "host directory (hostPath at the same path) the dmem hook script is installed into",
        default=DEFAULT_HOOK_DIR,
    )
    add_flag(
        parser,
        "--cgroup-root",
        "the host's root cgroup v2 hierarchy (dmem detection; mount the host's "
        "/sys/fs/cgroup read-only there)",
        default=DEFAULT_CGROUP_ROOT,
    )


def _claim_reporting_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--claim-status",
        "write status.devices (conditions, enforced limits) on prepared claims: auto, or off",
        default="auto",
        choices=["auto", "off"],
    )
    add_flag(
        parser,
        "--event-interval",
        "seconds before an equal Event on the same object is written again (rate limit)",
        default="60",
    )


def _plugin_parser(sub: Any) -> None:
    """``dra-driver kubelet-plugin``."""
    plugin = sub.add_parser("kubelet-plugin", help="run the node plugin (DaemonSet)")
    _node_flags(plugin)
    add_flag(
        plugin, "--registry-dir", "kubelet plugin registry directory", default=DEFAULT_REGISTRY_DIR
    )
    add_flag(
        plugin,
        "--plugin-dir",
        "plugin data directory (DRA socket, checkpoint); default "
        f"{DEFAULT_PLUGINS_DIR}/<driver name>",
    )
    add_flag(plugin, "--cdi-root", "directory for transient CDI specs", default=DEFAULT_CDI_ROOT)
    add_flag(
        plugin,
        "--rolling-update-uid",
        "pod UID; gives this pod its own socket names so a maxSurge update can overlap",
    )
    _gpu_flags(plugin)
    add_flag(plugin, "--kubeconfig", "kubeconfig file; in-cluster config when unset")
    add_flag(plugin, "--driver-root", "NVIDIA driver install root (NVML backend)", default="/")
    add_flag(plugin, "--proc-root", "the host's /proc (MIG capability files)", default="/proc")
    add_flag(
        plugin,
        "--cdi-hook-path",
        "nvidia-cdi-hook on the host (ldcache update); empty: no hook",
        default="/usr/bin/nvidia-cdi-hook",
    )
    _dmem_flags(plugin)
    add_flag(
        plugin,
        "--mps-agent-socket",
        "the mps-agent's socket; default <plugin dir>/mps-agent.sock",
    )
    add_flag(
        plugin,
        "--inventory-interval",
        "seconds between GPU re-discoveries (0: never)",
        default="60",
    )
    _health_flags(plugin)
    add_flag(
        plugin,
        "--boot-id-file",
        "file with this boot's id (checkpoint trust)",
        default="/proc/sys/kernel/random/boot_id",
    )
    _claim_reporting_flags(plugin)
    _common(plugin)
    _metrics_flags(plugin)


def _agent_parser(sub: Any) -> None:
    """``dra-driver mps-agent``."""
    agent = sub.add_parser("mps-agent", help="run the MPS daemons of this node (DaemonSet)")
    add_flag(agent, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(
        agent,
        "--plugin-dir",
        f"the plugin's data directory; default {DEFAULT_PLUGINS_DIR}/<driver name>",
    )
    add_flag(agent, "--socket", "the agent's socket; default <plugin dir>/mps-agent.sock")
    add_flag(
        agent,
        "--state-dir",
        "MPS pipe, log and shm directories and the agent's state (tmpfs: gone at reboot)",
        default="/run/fractional-gpu-dra/mps",
    )
    add_flag(
        agent,
        "--mps-control",
        "nvidia-cuda-mps-control to drive; 'fake' for the packaged fake (no GPU)",
        default="nvidia-cuda-mps-control",
    )
    add_flag(
        agent,
        "--mps-protocol",
        "MPS protocol: v3 (driver 615+, per-claim limits held by the daemon), legacy, or auto",
        default="auto",
        choices=["auto", "v3", "legacy"],
    )
    add_flag(agent, "--driver-version", "the node's driver version (auto protocol)")
    add_flag(
        agent,
        "--daemon-shm",
        "the MPS daemons' /dev/shm: private (each daemon in its own mount namespace with its "
        "GPU's shm directory, the one its clients get; needs CAP_SYS_ADMIN), agent (the "
        "agent's own; only for the fake), auto (private unless --mps-control=fake)",
        default="auto",
        choices=["auto", "private", "agent"],
    )
    _common(agent)
    _metrics_flags(agent)


def build_parser() -> argparse.ArgumentParser:
    parser = EnvTwinParser(
        prog="dra-driver", description="Kubernetes DRA driver for fractional NVIDIA GPUs"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _plugin_parser(sub)
    _agent_parser(sub)

    controller = sub.add_parser(
        "controller", help="run the allocation controller of the controller path (Deployment)"
    )
    add_flag(controller, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(controller, "--kubeconfig", "kubeconfig file; in-cluster config when unset")
    add_flag(
        controller,
        "--lease-name",
        "the coordination.k8s.io Lease for leader election",
        default="fractional-gpu-dra-controller",
    )
    add_flag(
        controller,
        "--lease-namespace",
        "namespace of the Lease (downward API metadata.namespace)",
        default="default",
    )
    add_flag(
        controller,
        "--pod-name",
        "this replica's identity in the Lease (downward API metadata.name); default hostname",
    )
    add_flag(
        controller,
        "--batch-window",
        "seconds claims that become ready together are collected, then allocated largest"
        " first (0: one at a time in arrival order)",
        default="0.2",
    )
    _common(controller)
    _metrics_flags(controller)

    _cleanup_parser(sub)

    render = sub.add_parser(
        "render-slices", help="print the ResourceSlices the plugin would publish, as YAML"
    )
    _node_flags(render)
    _gpu_flags(render)
    add_flag(
        render,
        "--kube-version",
        "the cluster to render for (stands in for the plugin's capability probe)",
        default="1.36",
        choices=["1.34", "1.35", "1.36", "1.37"],
    )
    _common(render)

    demo = sub.add_parser("demo", help="run the node flow on fake GPUs and print who got what")
    add_flag(
        demo, "--fake-gpus", "fake GPUs for the demo", default="h100-80gb:2,l4:1,h100-80gb:1:mig"
    )
    add_flag(demo, "--work-dir", "keep sockets, checkpoint and CDI specs here (default: temp dir)")
    # The demo's table says what went wrong per claim; the driver's own
    # warnings for the two refused example claims would only repeat it.
    _common(demo, log_level="ERROR")

    _simulate_parser(sub.add_parser("simulate", help="simulate packing claims on a fake cluster"))

    version = sub.add_parser("version", help="print the version")
    _common(version)
    return parser


def _node_settings(args: argparse.Namespace) -> NodeSettings:
    from dra_driver.plugin.node_config import NodeFlags, load_node_settings

    try:
        max_clients = int(args.max_clients)
    except ValueError:
        raise ConfigError(
            f"--max-clients (MAX_CLIENTS): {args.max_clients!r} is not a whole number"
        ) from None
    return load_node_settings(
        NodeFlags(
            sharing=args.sharing,
            allocator=args.allocator,
            memory_reserve=args.memory_reserve,
            memory_step=args.memory_step,
            max_clients=max_clients,
            config_file=args.node_config or None,
        )
    )


def _non_negative(text: str, flag: str, kind: Callable[[str], _N], what: str) -> _N:
    """``text`` (a flag's value) as ``kind``; a ConfigError naming the flag otherwise."""
    try:
        value = kind(text)
    except ValueError:
        value = kind("-1")
    if value < kind("0"):
        raise ConfigError(f"{flag} ({env_name(flag)}): {text!r} is not {what} >= 0")
    return value


def _seconds(text: str, flag: str) -> float:
    return _non_negative(text, flag, float, "a number of seconds")


def _backend(args: argparse.Namespace, node_name: str) -> GpuBackend:
    if args.backend == "nvml":
        from dra_driver.gpu.nvml import NvmlGpuBackend

        return NvmlGpuBackend()
    from dra_driver.gpu.fake import FakeGpuBackend

    return FakeGpuBackend(args.fake_gpus, node_name)


def _render_slices(args: argparse.Namespace) -> int:
    import yaml

    from dra_driver.core.settings import Capabilities
    from dra_driver.core.slice_rules import validate_pool
    from dra_driver.core.slices import build_slices
    from dra_driver.k8s.publisher import slice_name

    node_name = args.node_name or "node-a"
    backend = _backend(args, node_name)
    try:
        inventory = asyncio.run(backend.inventory())
    finally:
        asyncio.run(backend.close())
    capabilities = Capabilities.for_version(int(args.kube_version.split(".")[1]))
    slices = build_slices(
        inventory,
        driver_name=args.driver_name,
        node_name=node_name,
        settings=_node_settings(args),
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


def _run_plugin(args: argparse.Namespace) -> int:
    from dra_driver.core.health import HealthSettings, TaintEffect, parse_xid_list
    from dra_driver.k8s.capabilities import probe_capabilities
    from dra_driver.k8s.claims import KubernetesClaimSource
    from dra_driver.k8s.client import make_api_client
    from dra_driver.k8s.publisher import SlicePublisher
    from dra_driver.observability.metrics_server import MetricsServer, metrics_port, serve_metrics
    from dra_driver.observability.plugin_metrics import PluginMetrics
    from dra_driver.plugin.enforcement import DmemLimits
    from dra_driver.plugin.runtime import (
        PluginConfig,
        SliceOptions,
        run_until_signalled,
    )

    plugin_dir = args.plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, args.driver_name)
    config = PluginConfig(
        driver_name=args.driver_name,
        node_name=args.node_name or "",
        registry_dir=args.registry_dir,
        plugin_dir=plugin_dir,
        cdi_root=args.cdi_root,
        rolling_update_uid=args.rolling_update_uid or None,
        boot_id_file=args.boot_id_file,
        inventory_interval=_seconds(args.inventory_interval, "--inventory-interval"),
        settings=_node_settings(args),
        driver_root=args.driver_root,
        proc_root=args.proc_root,
        cdi_hook_path=args.cdi_hook_path or None,
        mps_agent_socket=args.mps_agent_socket or os.path.join(plugin_dir, "mps-agent.sock"),
        health=HealthSettings(
            recovery_s=_seconds(args.health_recovery_seconds, "--health-recovery-seconds"),
            fatal_effect=TaintEffect(args.fatal_xid_taint_effect),
            ignored_xids=parse_xid_list(args.ignored_xids, "--ignored-xids (IGNORED_XIDS)"),
        ),
        health_probe_interval=_seconds(args.health_probe_interval, "--health-probe-interval"),
        dmem_limits=DmemLimits(args.dmem_limits),
        hook_dir=args.hook_dir,
        cgroup_root=args.cgroup_root,
    )
    config.validate()
    port = metrics_port(args.metrics_port)
    metrics = PluginMetrics() if port else None
    backend = _backend(args, config.node_name)
    api_client = make_api_client(args.kubeconfig)
    claims = KubernetesClaimSource(api_client)
    publisher = SlicePublisher(
        api_client, driver_name=config.driver_name, node_name=config.node_name
    )
    slices = SliceOptions(
        publisher=publisher,
        probe=functools.partial(
            probe_capabilities, api_client, config.driver_name, config.node_name
        ),
    )
    server: MetricsServer | None = None
    try:
        if metrics is not None:
            server = serve_metrics(port, metrics.registry, args.metrics_address)
        reporting = claim_reporting(args, api_client, config.driver_name, config.node_name)
        runtime = PluginRuntime(
            config, backend, claims, slices, reporting=reporting, metrics=metrics
        )
        asyncio.run(run_until_signalled(runtime))
    finally:
        if server is not None:
            server.stop()
        claims.close()
        publisher.close()
    return 0


def claim_reporting(
    args: argparse.Namespace, api_client: Any, driver_name: str, node_name: str
) -> ClaimReporter:
    """The plugin's claim status writer and Event recorder, from its flags."""
    from dra_driver.k8s.claim_status import ClaimStatusWriter
    from dra_driver.k8s.events import EventRecorder
    from dra_driver.plugin.claim_reporting import COMPONENT

    events = EventRecorder(
        api_client,
        component=COMPONENT,
        instance=node_name,
        interval_s=_seconds(args.event_interval, "--event-interval"),
        aggregate=True,
    )
    status = (
        ClaimStatusWriter(api_client, driver_name=driver_name, node_name=node_name)
        if args.claim_status == "auto"
        else None
    )
    return ClaimReporter(driver_name=driver_name, node_name=node_name, status=status, events=events)


def _run_mps_agent(args: argparse.Namespace) -> int:
    from dra_driver.mpsagent import fake_control_path
    from dra_driver.mpsagent.agent import AgentConfig, run_agent
    from dra_driver.mpsagent.commands import UNSHARE_PRIVATE_MOUNT
    from dra_driver.mpsagent.compute_mode import FakeComputeMode, NvidiaSmiComputeMode
    from dra_driver.observability.agent_metrics import AgentMetrics
    from dra_driver.observability.metrics_server import metrics_port, serve_metrics

    plugin_dir = args.plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, args.driver_name)
    fake = args.mps_control == "fake"
    config = AgentConfig(
        socket_path=args.socket or os.path.join(plugin_dir, "mps-agent.sock"),
        state_dir=args.state_dir,
        control_binary=fake_control_path() if fake else args.mps_control,
        protocol=args.mps_protocol,
        compute_mode=FakeComputeMode() if fake else NvidiaSmiComputeMode(),
        driver_version=args.driver_version or None,
        # The fake launcher runs ${PYTHON}: this interpreter has the package.
        daemon_env={**os.environ, "PYTHON": sys.executable} if fake else None,
        shm_namespace=(
            UNSHARE_PRIVATE_MOUNT
            if args.daemon_shm == "private" or (args.daemon_shm == "auto" and not fake)
            else None
        ),
    )
    port = metrics_port(args.metrics_port)
    os.makedirs(os.path.dirname(config.socket_path), exist_ok=True)
    metrics = AgentMetrics() if port else None
    server = serve_metrics(port, metrics.registry, args.metrics_address) if metrics else None
    try:
        asyncio.run(run_agent(config, metrics=metrics))
    finally:
        if server is not None:
            server.stop()
    return 0


def _run_controller(args: argparse.Namespace) -> int:
    import socket

    from dra_driver.controller import ControllerConfig, run_controller
    from dra_driver.observability.metrics_server import metrics_port

    config = ControllerConfig(
        driver_name=args.driver_name,
        kubeconfig=args.kubeconfig or None,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        identity=args.pod_name or socket.gethostname(),
        batch_window_s=_seconds(args.batch_window, "--batch-window"),
        metrics_port=metrics_port(args.metrics_port),
        metrics_address=args.metrics_address,
    )
    asyncio.run(run_controller(config))
    return 0


def _run_cleanup(args: argparse.Namespace) -> int:
    from dra_driver.core.cdi import cdi_kind_for_driver
    from dra_driver.plugin.cdi_store import CdiStore
    from dra_driver.plugin.cleanup import cleanup_node

    plugin_dir = args.plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, args.driver_name)
    node_name = args.node_name or ""
    publisher = None
    if args.kubeconfig != "none":
        if not node_name:
            raise ConfigError("--node-name (NODE_NAME) is required to delete the node's slices")
        from dra_driver.k8s.client import make_api_client
        from dra_driver.k8s.publisher import SlicePublisher

        publisher = SlicePublisher(
            make_api_client(args.kubeconfig), driver_name=args.driver_name, node_name=node_name
        )
    report = asyncio.run(
        cleanup_node(
            checkpoint_path=os.path.join(plugin_dir, "checkpoint.json"),
            cdi=CdiStore(args.cdi_root, cdi_kind_for_driver(args.driver_name)),
            backend=_backend(args, node_name or "node"),
            mps_socket=args.mps_agent_socket or os.path.join(plugin_dir, "mps-agent.sock"),
            publisher=publisher,
        )
    )
    print(
        f"MIG instances destroyed: {len(report.mig_destroyed)}, MPS shares released: "
        f"{len(report.shares_released)}, CDI specs removed: {len(report.cdi_specs_removed)}, "
        f"ResourceSlices deleted: {len(report.slices_deleted)}, problems: {len(report.problems)}"
    )
    return 1 if report.problems else 0


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        if args.command == "version":
            print(f"dra-driver {__version__}")
            return 0
        if args.command == "cleanup":
            return _run_cleanup(args)
        if args.command == "mps-agent":
            return _run_mps_agent(args)
        if args.command == "render-slices":
            return _render_slices(args)
        if args.command == "controller":
            return _run_controller(args)
        if args.command == "demo":
            from dra_driver import demo

            return demo.main(args.fake_gpus, args.work_dir, sys.stdout)
        if args.command == "simulate":
            return _run_simulate(args)
        return _run_plugin(args)
    except DriverError as err:
        log.error("%s", err)
        return 2
