"""Flags with environment-variable twins, the flag groups several subcommands
share, and the checked conversions of their string values."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from dra_driver.base.errors import ConfigError
from dra_driver.core.ports import GpuBackend
from dra_driver.core.settings import NodeSettings
from dra_driver.observability.logs import LOG_FORMATS
from dra_driver.plugin.defaults import DEFAULT_DRIVER_NAME

_N = TypeVar("_N", int, float)


def env_name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_").upper()


class EnvTwinParser(argparse.ArgumentParser):
    """Checks values that came from environment twins as strictly as flags.

    argparse applies ``type`` to a string default but never checks it against
    ``choices``; an invalid ``LOG_LEVEL`` must fail like ``--log-level`` does.
    Subparsers inherit this class, so each subcommand checks its own flags.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env_twins: list[argparse.Action] = []
        """The flags :func:`add_flag` added (``add_argument`` returns each Action)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for action in self.env_twins:
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
    action = parser.add_argument(flag, help=help + suffix, **kwargs)
    if isinstance(parser, EnvTwinParser):
        parser.env_twins.append(action)


def common_flags(parser: argparse.ArgumentParser, log_level: str = "INFO") -> None:
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


def metrics_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(
        parser,
        "--metrics-port",
        "serve Prometheus metrics at :PORT/metrics; 0 turns them off",
        default="0",
    )
    add_flag(
        parser,
        "--metrics-address",
        "address the metrics server (and the kubelet plugin's /readyz) binds",
        default="0.0.0.0",
    )


def node_flags(parser: argparse.ArgumentParser) -> None:
    add_flag(parser, "--driver-name", "DRA driver name", default=DEFAULT_DRIVER_NAME)
    add_flag(parser, "--node-name", "this node's name (downward API spec.nodeName)")


def gpu_flags(parser: argparse.ArgumentParser, fake_gpus: str = "h100-80gb:2") -> None:
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
    add_flag(
        parser,
        "--tenancy",
        "whose claims may share a GPU's MPS daemon where it cannot keep clients apart (legacy "
        "MPS, MPS inside MIG): namespace (one Kubernetes namespace's) or cooperative (any)",
        default="namespace",
        choices=["namespace", "cooperative"],
    )
    add_flag(
        parser,
        "--mps-protocol",
        "the mps-agent's MPS protocol (give both the same value): auto (v3 from driver 615 "
        "by --driver-version, else legacy), v3 or legacy",
        default="auto",
        choices=["auto", "v3", "legacy"],
    )
    add_flag(parser, "--driver-version", "the node's driver version, as given to the mps-agent")
    add_flag(parser, "--memory-reserve", "device memory kept back on each GPU", default="0")
    add_flag(parser, "--memory-step", "granularity of memory shares", default="256Mi")
    add_flag(parser, "--max-clients", "shares per GPU (MPS allows 48)", default="48")
    add_flag(parser, "--node-config", "YAML file with node settings and per-GPU overrides")


def parse_node_settings(args: argparse.Namespace) -> NodeSettings:
    from dra_driver.mpsagent.commands import choose_protocol
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
            tenancy=args.tenancy,
            # The agent's own resolution from the same two settings (the chart gives
            # both processes the same): what it runs is what the slices promise.
            legacy_mps=choose_protocol(args.mps_protocol, args.driver_version or None) == "legacy",
            memory_reserve=args.memory_reserve,
            memory_step=args.memory_step,
            max_clients=max_clients,
            config_file=args.node_config or None,
        )
    )


def parse_non_negative(text: str, flag: str, kind: Callable[[str], _N], what: str) -> _N:
    """``text`` (a flag's value) as ``kind``; a ConfigError naming the flag otherwise."""
    try:
        value = kind(text)
    except ValueError:
        value = kind("-1")
    if value < kind("0"):
        raise ConfigError(f"{flag} ({env_name(flag)}): {text!r} is not {what} >= 0")
    return value


def parse_seconds(text: str, flag: str) -> float:
    return parse_non_negative(text, flag, float, "a number of seconds")


def make_backend(args: argparse.Namespace, node_name: str) -> GpuBackend:
    if args.backend == "nvml":
        from dra_driver.gpu.nvml import NvmlGpuBackend

        return NvmlGpuBackend()
    from dra_driver.fakes.gpu import FakeGpuBackend

    return FakeGpuBackend(args.fake_gpus, node_name)
