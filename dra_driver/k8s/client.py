"""The API server's address and credentials, from the official client's configuration loaders.

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
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml

from dra_driver import __version__
from dra_driver.base.errors import ConfigError
from dra_driver.k8s.official import (
    ConfigException,
    Configuration,
    load_incluster_config,
    load_kube_config,
)

DEFAULT_KUBECONFIG = "~/.kube/config"
AUTH_REUSE_S = 10.0
"""How long the credentials' headers are reused before the configuration is asked
again (and its loader's refresh hook runs): a rotated token is sent within this."""
USER_AGENT = f"fractional-gpu-dra/{__version__}"


class KubeClient:
    """The official client's ``Configuration``, without its API classes.

    ``configuration`` holds the host, credentials (refreshed by the loader's hooks),
    TLS and proxy settings; every request of the driver's processes goes through
    the loop transport made from it (:func:`~dra_driver.k8s.transport.api_transport`).
    The client's own REST transport (urllib3) is never built: a configuration the loop
    transport refuses (a SOCKS proxy, say) is named before anything tries to speak it.
    """

    def __init__(
        self, configuration: Configuration, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.configuration = configuration
        self._clock = clock
        self.default_headers = {"User-Agent": USER_AGENT}
        self._auth_lock = threading.Lock()
        self._auth: tuple[float, dict[str, str]] | None = None

    def auth_headers(self) -> dict[str, str]:
        """The credentials' headers (``Authorization: Bearer ...``), refreshed every
        :data:`AUTH_REUSE_S` seconds.

        Asking the configuration runs its loader's refresh hook, and the in-cluster
        loader's hook sets ``host`` again, whose setter scans the whole environment
        for proxy variables: measured at a third of a claim GET's CPU in a pod's
        environment, for a token that the loader itself re-reads once a minute.
        """
        fresh = self.fresh_auth_headers()
        if fresh is not None:
            return fresh
        now = self._clock()
        headers: dict[str, str] = {}
        for setting in cast(Any, self.configuration).auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        with self._auth_lock:
            self._auth = (now, headers)
        return headers

    def fresh_auth_headers(self) -> dict[str, str] | None:
        """The credentials' headers if :meth:`auth_headers` would answer them without
        asking the configuration (whose refresh hook may run a kubeconfig's exec
        plugin, a process, or read a token file); None when it would ask."""
        with self._auth_lock:
            cached = self._auth
        if cached is not None and self._clock() - cached[0] < AUTH_REUSE_S:
            return cached[1]
        return None


def make_api_client(kubeconfig: str | None, host: str | None = None) -> KubeClient:
    """A :class:`KubeClient` for the cluster; :class:`ConfigError` when none is configured."""
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
    return KubeClient(configuration)


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
        load_kube_config(
            config_file=paths, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, OSError, ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"kubeconfig {paths!r} ({source}) is unusable: {err}") from err
