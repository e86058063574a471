"""The parts of the official ``kubernetes`` client the driver uses, imported lean.

The only module that imports ``kubernetes``. What the driver takes from it is
its configuration (host, credentials, TLS, proxies, token refresh), its REST
transport (urllib3's pool, configured from that), its exception type and its
config loaders. Its generated API classes and models are not used (see
:mod:`dra_driver.k8s.rest`), so the package ``__init__``s that import them are
deferred (:mod:`dra_driver.k8s.lean_import`): in a pod, with the in-cluster
configuration, the client costs the plugin 2.4 MB of RSS instead of 22.3.
A kubeconfig still loads the official loader, which imports OAuth, requests
and the client's ``ApiClient`` (pydantic): :func:`load_kube_config` does that
on first use only.
"""

from __future__ import annotations

from typing import Any

from dra_driver.k8s.lean_import import defer_package_init

defer_package_init("kubernetes")
defer_package_init(
    "kubernetes.client",
    {
        "Configuration": "kubernetes.client.configuration",
        "ApiClient": "kubernetes.client.api_client",
        "ApiException": "kubernetes.client.exceptions",
    },
)
defer_package_init("kubernetes.client.models")
defer_package_init("kubernetes.config")
defer_package_init("kubernetes.utils")

from kubernetes.client.configuration import Configuration  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.client.rest import RESTClientObject  # noqa: E402
from kubernetes.config.config_exception import ConfigException  # noqa: E402
from kubernetes.config.incluster_config import load_incluster_config  # noqa: E402

__all__ = [
    "ApiException",
    "ConfigException",
    "Configuration",
    "RESTClientObject",
    "load_incluster_config",
    "load_kube_config",
]


def load_kube_config(**kwargs: Any) -> None:
    """The official ``load_kube_config``, imported on first use (it costs 15 MB)."""
    # Deferred on purpose: see the module's docstring.
    from kubernetes.config.kube_config import load_kube_config as load  # noqa: PLC0415

    load(**kwargs)  # type: ignore[no-untyped-call]
