"""Which hosts a ``no_proxy`` list lets bypass the configuration's proxy
(:func:`dra_driver.k8s.transport.bypasses_proxy`), as a table."""

from __future__ import annotations

import pytest

from dra_driver.k8s.transport import bypasses_proxy

CASES = [
    ("api.example.com:6443", "api.example.com", "", False),
    ("api.example.com:6443", "api.example.com", "*", True),
    ("api.example.com:6443", "api.example.com", "example.com", True),
    ("api.example.com:6443", "api.example.com", ".example.com", True),
    ("api.example.com:6443", "api.example.com", "other.com, ,example.com", True),
    ("api.example.com:6443", "api.example.com", "xample.com", False),
    ("api.example.com:6443", "api.example.com", "api.example.com:6443", True),
    ("api.example.com:6443", "api.example.com", "API.EXAMPLE.COM", True),
    ("10.96.0.1:443", "10.96.0.1", "10.0.0.0/8", True),
    ("10.96.0.1:443", "10.96.0.1", "10.96.0.1", True),
    ("10.96.0.1:443", "10.96.0.1", "192.168.0.0/16", False),
    ("[fd00::1]:443", "fd00::1", "fd00::/8", True),
]


@pytest.mark.parametrize(
    ("netloc", "hostname", "no_proxy", "bypass"), CASES, ids=[f"{c[0]}|{c[2]}" for c in CASES]
)
def test_bypasses_proxy(netloc: str, hostname: str, no_proxy: str, bypass: bool) -> None:
    assert bypasses_proxy(netloc, hostname, no_proxy) is bypass
