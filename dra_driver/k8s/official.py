"""The parts of the official ``kubernetes`` client the driver uses, imported lean.

The only module that imports ``kubernetes``. What the driver takes from it is
its configuration (host, credentials, TLS, proxies, token refresh), its REST
transport (urllib3's pool, configured from that), its exception type and its
config loaders. Its generated API classes and models are not used (see
:mod:`dra_driver.k8s.rest`), so the package ``__init__``s that import them are
deferred (:mod:`dra_driver.k8s.lean_import`): in a pod, with the in-cluster
configuration, the client costs the plugin 2.4 MB of RSS instead of 22.3.
A kubeconfig loads the official loader, on first use only
(:func:`load_kube_config`), for 1.8 MB: what only its OIDC token refresh uses
(the client's ``ApiClient``, OAuth, requests: 15 MB) is imported when used.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from dra_driver.k8s.lean_import import (
    defer_package_init,
    is_deferred,
    provisional_module,
    provisionally,
)

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
    """The official ``load_kube_config``, imported on first use."""
    if "kubernetes.config.kube_config" not in sys.modules and is_deferred("kubernetes.client"):
        # The loader binds, when imported, what only its OIDC token refresh (and
        # ``new_client_from_config``) uses: ``ApiClient`` (whose import pulls in
        # pydantic and the client's models, 10 MB), ``OAuth2Session`` (requests,
        # 4 MB) and ``oauthlib.oauth2``. It gets classes that import the real
        # ones when first called and return real instances, and oauthlib with
        # its package __init__s deferred; requests_oauthlib imports as usual after.
        defer_package_init("oauthlib")
        defer_package_init("oauthlib.oauth2")
        with (
            provisionally("kubernetes.client", "ApiClient", ApiClientOnFirstUse),
            provisional_module("requests_oauthlib", {"OAuth2Session": OAuth2SessionOnFirstUse}),
        ):
            importlib.import_module("kubernetes.config.kube_config")
    loader = importlib.import_module("kubernetes.config.kube_config")
    loader.load_kube_config(**kwargs)


class ApiClientOnFirstUse:
    """Makes the official client's ``ApiClient``, importing it on the first call."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        real = importlib.import_module("kubernetes.client.api_client").ApiClient
        return real(*args, **kwargs)


class OAuth2SessionOnFirstUse:
    """Makes a ``requests_oauthlib.OAuth2Session``, importing it on the first call."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return importlib.import_module("requests_oauthlib").OAuth2Session(*args, **kwargs)
