"""Connect to the API server with the official client's configuration and transport.

Order, as kubectl and client-go do it for a daemon:

1. ``host`` given: talk plain HTTP(S) to that URL without credentials (tests
   point this at the fake API server);
2. no ``--kubeconfig`` and ``KUBERNETES_SERVICE_HOST`` set: in-cluster service
   account;
3. otherwise the kubeconfig file: ``--kubeconfig``, else ``$KUBECONFIG``, else
   ``~/.kube/config``.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import urllib3
import yaml

from dra_driver import __version__
from dra_driver.base.errors import ConfigError
from dra_driver.k8s.official import (
    ConfigException,
    Configuration,
    RESTClientObject,
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
    :func:`~dra_driver.k8s.transport.api_transport` made from it. ``rest_client`` is
    the client's urllib3 pool, built on first use only by the controller's thread
    path (:mod:`dra_driver.k8s.rest`), which no entry point takes: a configuration
    the loop transport refuses (a SOCKS proxy, say) never gets as far as building a
    pool that may not even import (urllib3's SOCKS needs PySocks).
    """

    def __init__(
        self, configuration: Configuration, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.configuration = configuration
        self._clock = clock
        self.default_headers = {"User-Agent": USER_AGENT}
        host = urllib3.util.parse_url(configuration.host)
        self.path_prefix = (host.path or "").rstrip("/")
        """The host's own path (a proxy's ``https://rancher/k8s/clusters/c-1``), before
        every API path."""
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._pool_lock = threading.Lock()
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
        with self._pool_lock:
            self._auth = (now, headers)
        return headers

    def fresh_auth_headers(self) -> dict[str, str] | None:
        """The credentials' headers if :meth:`auth_headers` would answer them without
        asking the configuration (whose refresh hook may run a kubeconfig's exec
        plugin, a process, or read a token file); None when it would ask."""
        with self._pool_lock:
            cached = self._auth
        if cached is not None and self._clock() - cached[0] < AUTH_REUSE_S:
            return cached[1]
        return None

    @functools.cached_property
    def rest_client(self) -> RESTClientObject:
        """The client's urllib3 pool manager (the controller's thread path only)."""
        return RESTClientObject(self.configuration)

    def connection_pool(self) -> urllib3.HTTPConnectionPool | None:
        """The API server's connection pool, to send a request-URI to; None behind an
        HTTP proxy (the pool manager must write those requests itself).

        The pool manager's ``request`` parses and re-encodes the URL and looks its
        pool up again on every call; taken once here, that is a third less CPU per
        request (measured: 0.38 against 0.64 ms for a claim GET).
        """
        manager = self.rest_client.pool_manager
        if isinstance(manager, urllib3.ProxyManager):
            return None
        with self._pool_lock:
            pool = self._pool
            if pool is None or pool.pool is None:  # none yet, or closed by clear()
                pool = manager.connection_from_url(self.configuration.host)
                self._pool = pool
            return pool

    def close(self) -> None:
        if "rest_client" in self.__dict__:  # built: its connections closed
            self.rest_client.pool_manager.clear()

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def make_api_client(
    kubeconfig: str | None, host: str | None = None, *, pool_size: int | None = None
) -> KubeClient:
    """A :class:`KubeClient` for the cluster; :class:`ConfigError` when none is configured.

    ``pool_size``: connections kept open to the API server (the client's default is
    5 per CPU); a caller with more requests in flight than that would otherwise open,
    and shake hands on, a new connection for each request past it."""
    configuration = Configuration()
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
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
