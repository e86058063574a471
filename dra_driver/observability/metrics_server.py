"""The Prometheus endpoint of one process (``--metrics-port``).

Each process (kubelet plugin, mps-agent, controller) keeps its metrics in its
own :class:`~prometheus_client.CollectorRegistry`, so tests can run several in
one interpreter, and serves it over plain HTTP from a daemon thread
(``prometheus_client``'s WSGI server): scrapes never wait on the event loop.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector, start_http_server

from dra_driver import __version__
from dra_driver.base.errors import ConfigError
from dra_driver.observability.http_server import HttpEndpoint

log = logging.getLogger(__name__)

PREFIX = "fractional_gpu_dra_"
"""Every metric of ours starts with this (``process_*`` are the library's standard ones)."""
MAX_PORT = 65535

MetricsRegistry = CollectorRegistry
"""One process's metrics (what :func:`serve_metrics` serves), named here for the
modules that build with one and may not import ``prometheus_client``."""


def new_registry(component: str) -> CollectorRegistry:
    """A registry for one process: ``process_*`` metrics and ``fractional_gpu_dra_build_info``."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    build = Gauge(
        PREFIX + "build_info",
        "Always 1; labels say which driver version and component this process is.",
        ["version", "component"],
        registry=registry,
    )
    build.labels(__version__, component).set(1)
    return registry


def metrics_port(text: str) -> int:
    """The value of ``--metrics-port`` (``METRICS_PORT``) as a port; 0 means off."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= MAX_PORT:
        raise ConfigError(
            f"--metrics-port (METRICS_PORT): {text!r} is not a port number (1-65535), "
            "or 0 to turn metrics off"
        )
    return port


MetricsServer = HttpEndpoint
"""A served registry: the same server and thread as every other HTTP endpoint of ours."""


def serve_metrics(
    port: int, registry: CollectorRegistry, address: str = "0.0.0.0"
) -> MetricsServer:
    """Serve ``registry`` at ``http://address:port/metrics`` until :meth:`MetricsServer.stop`.

    ``port`` 0 binds any free port (tests). Raises ConfigError naming the
    flag when the port cannot be bound.
    """
    try:
        server, thread = start_http_server(port, addr=address, registry=registry)
    except OSError as err:
        raise ConfigError(
            f"--metrics-port {port}: cannot listen on {address}:{port}: {err}; "
            "choose a free port, or 0 to turn metrics off"
        ) from err
    served = MetricsServer(server, thread)
    log.info("metrics at http://%s:%d/metrics", address, served.port)
    return served
