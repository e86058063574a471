"""The parts of the official ``kubernetes`` client the driver uses.

The only module that imports ``kubernetes``. What the driver takes from it is
its configuration (host, credentials, TLS, proxies, token refresh), its exception
type and its config loaders; the requests go through the driver's own transport
(:mod:`dra_driver.k8s.transport`, aiohttp). Its generated API classes and models are not used (see
:mod:`dra_driver.k8s.rest`).

Imported here, the package loads as it always does. A driver *process* (the
``dra-driver`` console script, ``python -m dra_driver``) first calls
:func:`~dra_driver.k8s.lean_import.defer_official_client_inits`, so that the
package ``__init__``s that import the unused parts are deferred
(:mod:`dra_driver.k8s.lean_import`): in a pod, with the in-cluster
configuration, the client then costs the plugin 2.4 MB of RSS instead of 22.3.
That is the process's own choice, made in its entry point: a test, a tool or a
user's script importing ``dra_driver`` modules gets the ``kubernetes`` package
exactly as it ships (its ``__version__``, ``dynamic``, ``watch``, the kubeconfig
loader's OAuth), never a half-loaded one.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from kubernetes.client.configuration import Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import load_incluster_config

from dra_driver.k8s.lean_import import (
    defer_package_init,
    is_deferred,
    provisional_module,
    provisionally,
)

__all__ = [
    "ApiException",
    "ConfigException",
    "Configuration",
    "load_incluster_config",
    "load_kube_config",
]


def load_kube_config(**kwargs: Any) -> None:
    """The official ``load_kube_config``, imported on first use.

    In a process that deferred the client's ``__init__``s
    (:func:`~dra_driver.k8s.lean_import.defer_official_client_inits`), the loader
    is imported with stand-ins for what only an OIDC refresh uses; anywhere else it
    is imported as it ships.
    """
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
