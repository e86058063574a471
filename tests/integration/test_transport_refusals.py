"""A configuration the loop transport does not speak is refused at start, by name.

Every API request of a driver process goes through :mod:`dra_driver.k8s.transport`;
there is no second transport to fall back to. What it does not speak (a SOCKS proxy,
urllib3's socket options, ``assert_hostname``, retries, a proxy's own TLS context, a
host that is not http(s)) stops the process before it serves, with a message that
names the setting and what to do instead.
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

import pytest

from dra_driver import cli
from dra_driver.base.errors import ConfigError
from dra_driver.k8s.client import KubeClient
from dra_driver.k8s.official import Configuration
from dra_driver.k8s.transport import ApiTransport, api_transport, unsupported_setting
from tests.support.node import NODE, NodeDirs

HOST = "https://127.0.0.1:6443"


def _configuration(**settings: Any) -> Configuration:
    configuration = Configuration(host=HOST)
    for name, value in settings.items():
        setattr(configuration, name, value)
    return configuration


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"socket_options": []}, "Configuration.socket_options"),
        ({"assert_hostname": False}, "tls_server_name"),
        ({"retries": 3}, "Configuration.retries"),
        ({"proxy_ssl_context": ssl.create_default_context()}, "proxy_ssl_context"),
        ({"proxy": "socks5://proxy:1080"}, "SOCKS"),
        ({"host": "unix:///run/kube.sock"}, "unix:///run/kube.sock"),
    ],
    ids=["socket_options", "assert_hostname", "retries", "proxy_ssl_context", "socks", "host"],
)
def test_what_it_does_not_speak_is_refused_by_name(settings: dict[str, Any], named: str) -> None:
    configuration = _configuration(**settings)
    why = unsupported_setting(configuration)
    assert why is not None and named in why
    with pytest.raises(ConfigError, match="cannot reach the API server") as err:
        api_transport(KubeClient(configuration))
    assert named in str(err.value)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"proxy": "http://proxy:3128"},
        {"proxy": "socks5://proxy:1080", "no_proxy": "127.0.0.1"},  # bypassed: not used
        {"tls_server_name": "kubernetes.default.svc"},
        {"verify_ssl": False},
    ],
    ids=["plain", "http-proxy", "socks-bypassed", "tls-server-name", "no-verify"],
)
def test_what_it_speaks_gets_a_transport(settings: dict[str, Any]) -> None:
    configuration = _configuration(**settings)
    assert unsupported_setting(configuration) is None
    assert isinstance(api_transport(KubeClient(configuration)), ApiTransport)


def test_the_plugin_stops_at_start_naming_the_setting(
    node_dirs: NodeDirs, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kubeconfig's SOCKS ``proxy-url``: ``dra-driver kubelet-plugin`` exits 2 before
    it serves the kubelet (no socket), and says why."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters: [{{name: c, cluster: {{server: '{HOST}', proxy-url: 'socks5://p:1080'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    argv = [
        "kubelet-plugin",
        *("--node-name", NODE, "--registry-dir", node_dirs.registry),
        *("--plugin-dir", node_dirs.plugin, "--cdi-root", node_dirs.cdi),
        *("--boot-id-file", node_dirs.boot_id_file, "--fake-gpus", "h100-80gb:1"),
        *("--kubeconfig", str(kubeconfig)),
    ]
    with caplog.at_level(logging.ERROR):
        assert cli.main(argv) == 2
    assert "socks5://p:1080" in caplog.text and "SOCKS is not spoken" in caplog.text
    assert list(Path(node_dirs.registry).iterdir()) == []
