"""The metrics endpoint: real HTTP, port flag parsing, busy ports."""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from dra_driver import __version__
from dra_driver.base.errors import ConfigError
from dra_driver.cli import main
from dra_driver.observability.metrics_server import metrics_port, new_registry, serve_metrics
from tests.support.metrics import Scrape, scrape


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("test_things", "Things counted by the test.", registry=registry).inc(3)
    return registry


def test_serves_the_registry_over_http_until_stopped(registry: CollectorRegistry) -> None:
    server = serve_metrics(0, registry, "127.0.0.1")
    try:
        assert server.port > 0
        got = scrape(server.port)
        assert got.get("test_things_total") == 3
        assert got.types["test_things"] == "counter"
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        scrape(server.port)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_a_busy_port_is_a_config_error_naming_the_flag(
    registry: CollectorRegistry, busy_port: int
) -> None:
    with pytest.raises(ConfigError) as info:
        serve_metrics(busy_port, registry, "127.0.0.1")
    message = str(info.value)
    assert f"--metrics-port {busy_port}" in message
    assert "choose a free port, or 0 to turn metrics off" in message


@pytest.mark.parametrize(
    ("text", "port"), [("0", 0), ("9400", 9400), ("65535", 65535)], ids=["off", "port", "max"]
)
def test_metrics_port(text: str, port: int) -> None:
    assert metrics_port(text) == port


@pytest.mark.parametrize("text", ["-1", "65536", "nine", "", "94.5"])
def test_bad_metrics_port_names_the_flag_and_its_env_twin(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--metrics-port \(METRICS_PORT\)"):
        metrics_port(text)


def test_new_registry_has_build_info_and_process_metrics() -> None:
    got = Scrape(generate_latest(new_registry("mps-agent")).decode())
    assert got.get("fractional_gpu_dra_build_info", version=__version__, component="mps-agent")
    assert got.series("process_cpu_seconds_total")  # the library's standard process metrics


@pytest.mark.parametrize(
    "argv",
    [["kubelet-plugin", "--node-name", "n"], ["mps-agent", "--mps-control", "fake"]],
    ids=["kubelet-plugin", "mps-agent"],
)
def test_cli_rejects_a_bad_metrics_port_before_starting(
    argv: list[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    with caplog.at_level(logging.ERROR, logger="dra_driver"):
        assert main([*argv, "--metrics-port", "http"]) == 2
    assert "--metrics-port (METRICS_PORT): 'http' is not a port number" in caplog.text
