"""``dra-driver kubelet-plugin``: the kubelet plugin against the API server, until a signal.

:func:`run_plugin` makes what reaches the cluster (the API transport, with every
request on the event loop and none in a thread; the claim source, the slice
publisher, claim status and Events, the pod annotator of the disruption guard, the
metrics endpoint), hands them to
:func:`~dra_driver.app.plugin.start_plugin` as :class:`~dra_driver.app.plugin.PluginParts`
and serves until a signal, with the start-up checks beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from dra_driver.app.plugin import (
    GuardOptions,
    Plugin,
    PluginConfig,
    PluginParts,
    SliceOptions,
    run_until_signalled,
    start_plugin,
)
from dra_driver.core.claim_writes import GuardMode
from dra_driver.core.ports import GpuBackend
from dra_driver.k8s.capabilities import probe_capabilities
from dra_driver.k8s.claim_status import ClaimStatusWriter
from dra_driver.k8s.claims import KubernetesClaimSource
from dra_driver.k8s.client import make_api_client
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.nodes import read_node
from dra_driver.k8s.pods import PodApi
from dra_driver.k8s.publisher import SlicePublisher
from dra_driver.k8s.transport import ApiTransport, api_transport
from dra_driver.observability.metrics_server import MetricsServer, new_registry, serve_metrics
from dra_driver.plugin.activity import CallActivity
from dra_driver.plugin.claim_reporting import COMPONENT, ClaimReporter
from dra_driver.plugin.extended_resources import check_extended_resources

__all__ = [
    "ClusterOptions",
    "GuardSettings",
    "claim_reporter",
    "closing",
    "guard_options",
    "run_plugin",
    "run_with_startup_checks",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterOptions:
    """How ``dra-driver kubelet-plugin`` reaches the cluster and serves metrics."""

    kubeconfig: str | None = None
    """None or empty: the in-cluster config."""
    metrics_port: int = 0
    """0: no metrics served."""
    metrics_address: str = "0.0.0.0"
    extended_resource_names: tuple[str, ...] = ()
    """The start-up check warns if this node's device plugin advertises one."""


@dataclass(frozen=True)
class GuardSettings:
    """The disruption guard's flags (``--disruption-guard`` not off)."""

    mode: GuardMode
    interval_s: float


ReporterFactory = Callable[[ApiTransport, str, str, CallActivity], ClaimReporter]
"""(API transport, driver name, node name, calls in flight) → claim status and Events."""


def run_plugin(
    config: PluginConfig,
    backend: GpuBackend,
    options: ClusterOptions,
    *,
    reporting: ReporterFactory,
    disruption_guard: GuardSettings | None,
) -> None:
    """``dra-driver kubelet-plugin``: build the plugin against the API server and serve
    until a signal (raises :class:`~dra_driver.app.tasks.BackgroundTaskFailed` when a
    background task dies). ``disruption_guard`` None: off."""

    registry = new_registry("kubelet-plugin") if options.metrics_port else None
    # Refuses (ConfigError) a configuration the loop transport does not speak.
    http = api_transport(make_api_client(options.kubeconfig))
    claims = KubernetesClaimSource(http)
    publisher = SlicePublisher(http, driver_name=config.driver_name, node_name=config.node_name)
    slices = SliceOptions(
        publisher=publisher,
        probe=functools.partial(probe_capabilities, http, config.driver_name, config.node_name),
    )
    server: MetricsServer | None = None
    try:
        if registry is not None:
            server = serve_metrics(options.metrics_port, registry, options.metrics_address)
        activity = CallActivity()
        reporter = reporting(http, config.driver_name, config.node_name, activity)
        guard = (
            guard_options(http, config.node_name, disruption_guard, reporter)
            if disruption_guard is not None
            else None
        )
        parts = PluginParts(
            config,
            backend,
            claims,
            slices,
            reporting=reporter,
            activity=activity,
            metrics=registry,
            disruption_guard=guard,
        )
        check = functools.partial(
            check_extended_resources,
            functools.partial(read_node, http, config.node_name),
            node_name=config.node_name,
            names=options.extended_resource_names,
            events=reporter.events,
        )
        asyncio.run(
            closing(http, run_with_startup_checks(functools.partial(start_plugin, parts), check))
        )
    finally:
        if server is not None:
            server.stop()


async def closing(http: ApiTransport, main: Awaitable[None]) -> None:
    """``main``, then the transport's kept connections closed (on the loop they are of)."""
    try:
        await main
    finally:
        await http.close()


async def run_with_startup_checks(
    start: Callable[[], Awaitable[Plugin]], check: Callable[[], Coroutine[Any, Any, object]]
) -> None:
    """The plugin until a signal, with the start-up checks beside it (they only warn,
    so a slow API server never delays serving the kubelet)."""
    task = asyncio.create_task(check(), name="extended-resources-check")
    try:
        await run_until_signalled(start, settle=True)
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def guard_options(
    http: ApiTransport, node_name: str, settings: GuardSettings, reporting: ClaimReporter
) -> GuardOptions:
    """The disruption guard of ``settings``: it annotates this node's pods through
    ``http``, its warnings are Events through ``reporting``."""
    return GuardOptions(
        PodApi(http, node_name),
        mode=settings.mode,
        interval_s=settings.interval_s,
        events=reporting.events,
    )


def claim_reporter(
    http: ApiTransport,
    driver_name: str,
    node_name: str,
    *,
    event_interval_s: float,
    claim_status: bool,
    activity: CallActivity | None = None,
) -> ClaimReporter:
    """The plugin's claim status writer (``claim_status`` False: none) and Event
    recorder; ``activity``: the plugin's calls in flight (status writes wait for a lull)."""

    events = EventRecorder(
        http,
        component=COMPONENT,
        instance=node_name,
        interval_s=event_interval_s,
        aggregate=True,
    )
    status = (
        ClaimStatusWriter(http, driver_name=driver_name, node_name=node_name)
        if claim_status
        else None
    )
    return ClaimReporter(
        driver_name=driver_name,
        node_name=node_name,
        status=status,
        events=events,
        activity=activity,
    )
