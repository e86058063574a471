"""``dra-driver``: one console script, one subcommand per component.

Every flag has an environment-variable twin (the flag's name in upper case
with ``_``, e.g. ``--cdi-root`` / ``CDI_ROOT``); the flag wins when both are
given. The Helm chart sets only the environment variables.

Each subcommand's flags and runner live in their own module: ``plugin``
(kubelet-plugin), ``mps_agent``, ``controller``, ``gpu_check`` and ``tools``
(render-slices, demo, simulate, cleanup); ``flags`` holds what they share.
Runners import their component lazily so ``dra-driver version`` stays light.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Sequence

from dra_driver import __version__
from dra_driver.base.errors import DriverError
from dra_driver.cli.controller import cmd_controller, controller_parser
from dra_driver.cli.flags import EnvTwinParser, add_flag, common_flags, env_name
from dra_driver.cli.gpu_check import cmd_gpu_check, gpu_check_parser
from dra_driver.cli.mps_agent import agent_parser, cmd_mps_agent
from dra_driver.cli.plugin import claim_reporting, cmd_plugin, plugin_parser
from dra_driver.cli.tools import (
    cleanup_parser,
    cmd_cleanup,
    cmd_demo,
    cmd_render_slices,
    cmd_simulate,
    demo_parser,
    render_parser,
    simulate_parser,
)
from dra_driver.observability.logs import configure_logging

__all__ = [
    "EnvTwinParser",
    "add_flag",
    "build_parser",
    "claim_reporting",
    "env_name",
    "main",
    "run",
]

log = logging.getLogger("dra_driver")


def build_parser() -> argparse.ArgumentParser:
    parser = EnvTwinParser(
        prog="dra-driver", description="Kubernetes DRA driver for fractional NVIDIA GPUs"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plugin_parser(sub)
    agent_parser(sub)
    controller_parser(sub)
    cleanup_parser(sub)
    render_parser(sub)
    demo_parser(sub)
    gpu_check_parser(sub)
    simulate_parser(sub.add_parser("simulate", help="simulate packing claims on a fake cluster"))

    version = sub.add_parser("version", help="print the version")
    common_flags(version)
    return parser


def cmd_version(args: argparse.Namespace) -> int:
    print(f"dra-driver {__version__}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "kubelet-plugin": cmd_plugin,
    "mps-agent": cmd_mps_agent,
    "controller": cmd_controller,
    "cleanup": cmd_cleanup,
    "render-slices": cmd_render_slices,
    "demo": cmd_demo,
    "gpu-check": cmd_gpu_check,
    "simulate": cmd_simulate,
    "version": cmd_version,
}
"""Each subcommand's runner, by the name :func:`build_parser` gives it: it returns
the process's exit status."""


def run() -> int:
    """The ``dra-driver`` process: :func:`main` in a process of its own.

    A process of the driver's never uses the official client's generated models,
    dynamic client or websockets: their package ``__init__``s are deferred before
    anything imports the client (20 MB of RSS in the plugin). Done here, in the
    entry point, and not in :func:`main`, which tests and tools call in their own
    processes, where ``kubernetes`` must import as it ships.
    """
    from dra_driver.k8s.lean_import import defer_official_client_inits

    defer_official_client_inits()
    return main()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        return COMMANDS[args.command](args)
    except DriverError as err:
        log.error("%s", err)
        return 2
