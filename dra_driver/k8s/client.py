"""Build the official client's ``ApiClient`` from the driver's flags.

Order, as kubectl and client-go do it for a daemon:

1. ``host`` given: talk plain HTTP(S) to that URL without credentials (tests
   point this at the fake API server);
2. no ``--kubeconfig`` and ``KUBERNETES_SERVICE_HOST`` set: in-cluster service
   account;
3. otherwise the kubeconfig file: ``--kubeconfig``, else ``$KUBECONFIG``, else
   ``~/.kube/config``.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from kubernetes.client import ApiClient, Configuration
from kubernetes.config import ConfigException, load_incluster_config, load_kube_config

from dra_driver.base.errors import ConfigError

DEFAULT_KUBECONFIG = "~/.kube/config"


def make_api_client(kubeconfig: str | None, host: str | None = None) -> ApiClient:
    """Return an ``ApiClient`` for the cluster; :class:`ConfigError` when none is configured."""
    configuration = Configuration()
    if host is not None:
        configuration.host = host.rstrip("/")
    elif kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except ConfigException as err:
            raise ConfigError(
                f"in-cluster Kubernetes configuration is unusable ({err}); "
                "pass --kubeconfig (or set KUBECONFIG) to use a kubeconfig file instead"
            ) from err
    else:
        _load_kubeconfig(kubeconfig, configuration)
    return ApiClient(configuration=configuration)


def _load_kubeconfig(kubeconfig: str | None, configuration: Configuration) -> None:
    if kubeconfig is not None:
        source, paths = "--kubeconfig", kubeconfig
    elif os.environ.get("KUBECONFIG"):
        source, paths = "KUBECONFIG", os.environ["KUBECONFIG"]
    else:
        source, paths = "default", DEFAULT_KUBECONFIG
    # KUBECONFIG may list several files; the client merges the ones that exist.
    if not any(Path(p).expanduser().is_file() for p in paths.split(os.pathsep) if p):
        raise ConfigError(
            f"no Kubernetes configuration found: not running in a cluster "
            f"(KUBERNETES_SERVICE_HOST is unset) and the kubeconfig {paths!r} ({source}) "
            "does not exist; pass --kubeconfig or set KUBECONFIG"
        )
    try:
        load_kube_config(  # type: ignore[no-untyped-call]
            config_file=paths, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"kubeconfig {paths!r} ({source}) is unusable: {err}") from err
