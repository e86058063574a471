"""``dra-driver controller``: the allocation controller of the controller path."""

from __future__ import annotations

import argparse
from typing import Any

from dra_driver.cli.flags import add_flag, common_flags, metrics_flags, parse_seconds
from dra_driver.plugin.defaults import DEFAULT_DRIVER_NAME


def controller_parser(sub: Any) -> None:
    """``dra-driver controller``."""
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
        "--lease-duration",
        "seconds a Lease holds without renewal before another replica may take it",
        default="15",
    )
    add_flag(
        controller,
        "--renew-deadline",
        "seconds the leader keeps retrying a failed renewal before it exits (status 2),"
        " less than --lease-duration",
        default="10",
    )
    add_flag(
        controller,
        "--retry-period",
        "seconds between attempts to take the Lease or to retry a failed renewal",
        default="2",
    )
    add_flag(
        controller,
        "--batch-window",
        "seconds an idle controller holds its first claim, so that the claims that come"
        " with it are allocated largest first with it (claims are always taken largest"
        " first; 0: one at a time in arrival order)",
        default="0.2",
    )
    add_flag(
        controller,
        "--allocation-events",
        "true: a Normal Allocated Event on each claim allocated (one more write per pod"
        " than the native path; refusals and failures always get their Event)",
        default="false",
        choices=["true", "false"],
    )
    common_flags(controller)
    metrics_flags(controller)


def cmd_controller(args: argparse.Namespace) -> int:
    import socket

    from dra_driver.app.controller import run
    from dra_driver.controller import ControllerConfig
    from dra_driver.observability.metrics_server import metrics_port

    config = ControllerConfig(
        driver_name=args.driver_name,
        kubeconfig=args.kubeconfig or None,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        identity=args.pod_name or socket.gethostname(),
        lease_duration_s=parse_seconds(args.lease_duration, "--lease-duration"),
        renew_deadline_s=parse_seconds(args.renew_deadline, "--renew-deadline"),
        # client-go's rhythm: a leader renews, and a candidate retries, every retry period.
        renew_interval_s=parse_seconds(args.retry_period, "--retry-period"),
        retry_interval_s=parse_seconds(args.retry_period, "--retry-period"),
        batch_window_s=parse_seconds(args.batch_window, "--batch-window"),
        allocation_events=args.allocation_events == "true",
        metrics_port=metrics_port(args.metrics_port),
        metrics_address=args.metrics_address,
    )
    run(config)
    return 0
