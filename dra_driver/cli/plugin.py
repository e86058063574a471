"""``dra-driver kubelet-plugin``: the node plugin (DaemonSet)."""

from __future__ import annotations

import argparse
import functools
import os
from typing import TYPE_CHECKING, Any

from dra_driver.cli.flags import (
    add_flag,
    common_flags,
    gpu_flags,
    make_backend,
    metrics_flags,
    node_flags,
    parse_node_settings,
    parse_seconds,
)
from dra_driver.core.claim_writes import GuardMode
from dra_driver.core.ports import GpuBackend
from dra_driver.dmemhook import DEFAULT_HOOK_DIR
from dra_driver.gpu.dmem import DEFAULT_CGROUP_ROOT
from dra_driver.plugin.defaults import DEFAULT_CDI_ROOT, DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR

if TYPE_CHECKING:  # the plugin's own modules load when it runs, not for every subcommand
    from dra_driver.app.plugin_daemon import GuardSettings
    from dra_driver.k8s.transport import ApiTransport
    from dra_driver.plugin.activity import CallActivity
    from dra_driver.plugin.claim_reporting import ClaimReporter


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


def _disruption_guard_flags(parser: argparse.ArgumentParser) -> None:
    """plugin/disruption_guard.py."""
    add_flag(
        parser,
        "--disruption-guard",
        "annotate the pods of prepared claims with karpenter.sh/do-not-disrupt=true and "
        "cluster-autoscaler.kubernetes.io/safe-to-evict=false: off, annotated (claims "
        "annotated <driver>/disruption-guard=true), all (every claim not annotated false)",
        default="off",
        choices=[m.value for m in GuardMode],
    )
    add_flag(
        parser,
        "--disruption-guard-interval",
        "seconds between passes over the node's pods (guards pods that joined a prepared "
        "claim, drops guards of claims unprepared while the plugin was down); 0: at start only",
        default="60",
    )


def plugin_parser(sub: Any) -> None:
    """``dra-driver kubelet-plugin``."""
    plugin = sub.add_parser("kubelet-plugin", help="run the node plugin (DaemonSet)")
    node_flags(plugin)
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
    gpu_flags(plugin)
    add_flag(
        plugin,
        "--fake-health-dir",
        "fake backend: directory watched for fault-injection files (XIDs, lost GPUs, resets; "
        "format in dra_driver/fakes/gpu_faults.py); default <plugin dir>/fake-health; "
        "ignored with --backend nvml",
    )
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
    _disruption_guard_flags(plugin)
    add_flag(
        plugin,
        "--readiness-port",
        "serve GET /readyz at :PORT (200 once registered with the kubelet and the "
        "ResourceSlices are published, 503 with why otherwise); 0 turns it off",
        default="0",
    )
    add_flag(
        plugin,
        "--extended-resource-names",
        "comma-separated extended resource names our DeviceClasses serve (KEP-5004, e.g. "
        "nvidia.com/gpu); at start the plugin warns if this node's device plugin advertises one",
        default="",
    )
    common_flags(plugin)
    metrics_flags(plugin)


def cmd_plugin(args: argparse.Namespace) -> int:
    from dra_driver.app.plugin import PluginConfig
    from dra_driver.app.plugin_daemon import ClusterOptions, run_plugin
    from dra_driver.core.health import HealthSettings, TaintEffect, parse_xid_list
    from dra_driver.core.slices import parse_names
    from dra_driver.observability.metrics_server import metrics_port
    from dra_driver.plugin.enforcement import DmemLimits

    plugin_dir = args.plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, args.driver_name)
    config = PluginConfig(
        driver_name=args.driver_name,
        node_name=args.node_name or "",
        registry_dir=args.registry_dir,
        plugin_dir=plugin_dir,
        cdi_root=args.cdi_root,
        rolling_update_uid=args.rolling_update_uid or None,
        boot_id_file=args.boot_id_file,
        inventory_interval=parse_seconds(args.inventory_interval, "--inventory-interval"),
        settings=parse_node_settings(args),
        driver_root=args.driver_root,
        proc_root=args.proc_root,
        cdi_hook_path=args.cdi_hook_path or None,
        mps_agent_socket=args.mps_agent_socket or os.path.join(plugin_dir, "mps-agent.sock"),
        health=HealthSettings(
            recovery_s=parse_seconds(args.health_recovery_seconds, "--health-recovery-seconds"),
            fatal_effect=TaintEffect(args.fatal_xid_taint_effect),
            ignored_xids=parse_xid_list(args.ignored_xids, "--ignored-xids (IGNORED_XIDS)"),
        ),
        health_probe_interval=parse_seconds(args.health_probe_interval, "--health-probe-interval"),
        dmem_limits=DmemLimits(args.dmem_limits),
        hook_dir=args.hook_dir,
        cgroup_root=args.cgroup_root,
        readiness_port=_readiness_port(args.readiness_port),
        readiness_address=args.metrics_address,
    )
    config.validate()
    port = metrics_port(args.metrics_port)
    backend = _plugin_backend(args, config.node_name, plugin_dir)
    run_plugin(
        config,
        backend,
        ClusterOptions(
            kubeconfig=args.kubeconfig,
            metrics_port=port,
            metrics_address=args.metrics_address,
            extended_resource_names=parse_names(args.extended_resource_names),
        ),
        reporting=functools.partial(claim_reporting, args),
        disruption_guard=disruption_guard(args),
    )
    return 0


def _readiness_port(text: str) -> int | None:
    from dra_driver.base.errors import ConfigError

    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ConfigError(
            f"--readiness-port (READINESS_PORT): {text!r} is not a port number (1-65535), "
            "or 0 to turn /readyz off"
        )
    return port or None


def _plugin_backend(args: argparse.Namespace, node_name: str, plugin_dir: str) -> GpuBackend:
    """The GPU backend; the fake one watches ``--fake-health-dir`` for injected faults."""
    if args.backend != "fake":
        return make_backend(args, node_name)
    from dra_driver.fakes.gpu import FakeGpuBackend
    from dra_driver.fakes.gpu_faults import DIR_NAME

    health_dir = args.fake_health_dir or os.path.join(plugin_dir, DIR_NAME)
    return FakeGpuBackend(args.fake_gpus, node_name, health_dir=health_dir)


def claim_reporting(
    args: argparse.Namespace,
    http: ApiTransport,
    driver_name: str,
    node_name: str,
    activity: CallActivity | None = None,
) -> ClaimReporter:
    """The plugin's claim status writer and Event recorder, from its flags;
    ``activity``: the plugin's calls in flight (status writes wait for a lull)."""
    from dra_driver.app.plugin_daemon import claim_reporter

    return claim_reporter(
        http,
        driver_name,
        node_name,
        event_interval_s=parse_seconds(args.event_interval, "--event-interval"),
        claim_status=args.claim_status == "auto",
        activity=activity,
    )


def disruption_guard(args: argparse.Namespace) -> GuardSettings | None:
    """The plugin's disruption guard from its flags; None when ``--disruption-guard=off``."""
    from dra_driver.app.plugin_daemon import GuardSettings

    mode = GuardMode(args.disruption_guard)
    if mode is GuardMode.OFF:
        return None
    interval_s = parse_seconds(args.disruption_guard_interval, "--disruption-guard-interval")
    return GuardSettings(mode, interval_s)
