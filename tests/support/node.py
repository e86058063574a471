"""One simulated node for integration tests: its directories and kubelet plugin."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from dra_driver.app.plugin import Plugin, PluginConfig, PluginParts, start_plugin
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.fakes.claims import InMemoryClaimSource
from dra_driver.fakes.gpu import FakeGpuBackend
from dra_driver.fakes.kubelet import KUBELET_DRA_SERVICES, FakeKubelet, RegisteredPlugin
from tests.support.leaks import pending_tasks

T = TypeVar("T")

DRIVER = "gpu.fractional.dev"
NODE = "node-a"


def run_checked(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that fails the test if the coroutine leaks a running task (the
    check of :mod:`tests.support.leaks`, with no grace: pending one pass after it)."""

    async def wrapper() -> T:
        result = await coro
        leaked = await pending_tasks(grace_s=0)
        assert not leaked, f"leaked asyncio tasks: {leaked}"
        return result

    return asyncio.run(wrapper())


@dataclass
class NodeDirs:
    """The host paths one simulated node's plugin uses."""

    root: str
    registry: str
    plugin: str
    cdi: str
    boot_id_file: str

    def kubeconfig(self, url: str, token: str | None = None, name: str = "kubeconfig") -> str:
        """A kubeconfig file ``name`` for the API server at ``url``, with a bearer
        ``token`` (none: no credentials); its path."""
        path = os.path.join(self.root, name)
        write_kubeconfig(path, url, token)
        return path

    def set_boot_id(self, boot_id: str) -> None:
        with open(self.boot_id_file, "w", encoding="ascii") as handle:
            handle.write(boot_id + "\n")

    def config(self, rolling_update_uid: str | None = None) -> PluginConfig:
        return PluginConfig(
            driver_name=DRIVER,
            node_name=NODE,
            registry_dir=self.registry,
            plugin_dir=self.plugin,
            cdi_root=self.cdi,
            rolling_update_uid=rolling_update_uid,
            boot_id_file=self.boot_id_file,
            # Shares are time-sliced here: these tests exercise the engine, not
            # MPS (tests/integration/test_enforcement.py runs the mps-agent).
            settings=NodeSettings(default=GpuSettings(Sharing.TIMESLICING)),
        )

    def parts(
        self,
        claims: InMemoryClaimSource,
        gpus: str = "h100-80gb:4",
        rolling_update_uid: str | None = None,
    ) -> PluginParts:
        """A plugin on fake GPUs ``gpus`` serving ``claims`` from these directories."""
        return PluginParts(self.config(rolling_update_uid), FakeGpuBackend(gpus, NODE), claims)

    def cdi_files(self) -> list[str]:
        return sorted(os.listdir(self.cdi)) if os.path.isdir(self.cdi) else []


@contextlib.asynccontextmanager
async def serving(
    dirs: NodeDirs,
    claims: InMemoryClaimSource,
    *,
    gpus: str = "h100-80gb:4",
    known_services: Sequence[str] = KUBELET_DRA_SERVICES,
) -> AsyncIterator[tuple[Plugin, RegisteredPlugin]]:
    """A started plugin, registered with a kubelet-like client; both closed after."""
    runtime = await start_plugin(dirs.parts(claims, gpus=gpus))
    kubelet = FakeKubelet(dirs.registry, known_services)
    try:
        yield runtime, await kubelet.wait_for_plugin(DRIVER)
    finally:
        await kubelet.close()
        await runtime.stop()


def write_kubeconfig(
    path: str | os.PathLike[str], url: str, token: str | None = None, *, ca: str | None = None
) -> None:
    """A kubeconfig for the API server at ``url``; ``token``: a bearer token (a
    ServiceAccount's, from :meth:`~tests.support.fakekube.FakeKubeApi.token_for`);
    ``ca``: the CA file that signed an HTTPS server's certificate."""
    user = f"{{token: '{token}'}}" if token else "{}"
    trust = f", certificate-authority: '{ca}'" if ca else ""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: fake, cluster: {{server: '{url}'{trust}}}}}]\n"
            f"users: [{{name: fake, user: {user}}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
            "current-context: fake\n"
        )
