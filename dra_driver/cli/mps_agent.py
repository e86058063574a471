"""``dra-driver mps-agent``: the MPS daemons of a node (DaemonSet)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dra_driver.base.errors import ConfigError
from dra_driver.cli.flags import add_flag, common_flags, metrics_flags
from dra_driver.plugin.defaults import DEFAULT_DRIVER_NAME, DEFAULT_PLUGINS_DIR

DEFAULT_SPARE_NAMESPACES = 2
"""A GPU's shares usually come a pod or two at a time; what an idle namespace costs a
real daemon is not documented (a namespace holds caps, not memory or SMs:
docs:mpsv3-namespaces), so few."""


def spare_count(text: str) -> int:
    """The value of ``--spare-namespaces`` (``SPARE_NAMESPACES``): 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(
            f"--spare-namespaces (SPARE_NAMESPACES): {text!r} is not a whole number; give "
            "0 (no spare namespaces) or more"
        )
    return value


def agent_parser(sub: Any) -> None:
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
        "MPS protocol: v3 (driver 615+, limits held by the daemon per namespace), legacy, or auto",
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
    add_flag(
        agent,
        "--mps-control-channel",
        "how commands reach each daemon: process (one run of the control binary per "
        "command, as NVIDIA documents) or persistent (unverified, legacy daemons only: one "
        "long-lived control shell per daemon, framed by a sentinel no document describes; "
        "falls back to process when the shell does not answer as expected)",
        default="process",
        choices=["process", "persistent"],
    )
    add_flag(
        agent,
        "--spare-namespaces",
        "MPS v3: namespaces each running daemon keeps made ahead of the shares (made when "
        "the plugin's calls pause), so a new share's prepare sends one control command, "
        "not two; 0: none",
        default=str(DEFAULT_SPARE_NAMESPACES),
    )
    common_flags(agent)
    metrics_flags(agent)


def cmd_mps_agent(args: argparse.Namespace) -> int:
    from dra_driver.app.agent import AgentOptions, run_mps_agent
    from dra_driver.observability.metrics_server import metrics_port

    plugin_dir = args.plugin_dir or os.path.join(DEFAULT_PLUGINS_DIR, args.driver_name)
    options = AgentOptions(
        socket_path=args.socket or os.path.join(plugin_dir, "mps-agent.sock"),
        state_dir=args.state_dir,
        mps_control=args.mps_control,
        protocol=args.mps_protocol,
        driver_version=args.driver_version or None,
        persistent_control_channel=args.mps_control_channel == "persistent",
        daemon_shm=args.daemon_shm,
        spare_namespaces=spare_count(args.spare_namespaces),
        metrics_port=metrics_port(args.metrics_port),
        metrics_address=args.metrics_address,
    )
    run_mps_agent(options)
    return 0
