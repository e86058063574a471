"""A kubelet-like client: registers a DRA plugin and calls it, as the kubelet does.

It follows the kubelet's plugin-watcher sequence: watch the registry
directory for a new socket, dial it, ``GetInfo``, validate the answer (type
``DRAPlugin``, a name, an absolute endpoint, a DRAPlugin service it knows,
walking the plugin's list in order), then ``NotifyRegistrationStatus``. After
that it calls NodePrepareResources / NodeUnprepareResources on the endpoint
with the chosen API version and checks the response map the way the kubelet
does (an entry for every claim, none for unknown ones). It opens the
DRAResourceHealth stream (v1alpha1 or v1) as the 1.34+ kubelet does, and
:func:`health_reports` reads one message of it.

It polls the directory (every 20 ms) instead of using inotify; the kubelet uses
fsnotify, which differs only in latency.
"""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dra_driver._gen.dra.v1 import api_pb2 as v1_pb2
from dra_driver._gen.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._gen.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver._gen.dra_health.v1 import api_pb2 as health_v1_pb2
from dra_driver._gen.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from dra_driver._gen.dra_health.v1alpha1 import api_pb2 as health_v1alpha1_pb2
from dra_driver._gen.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from dra_driver._gen.pluginregistration.v1 import api_pb2 as reg_pb2
from dra_driver._gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.base.ids import ClaimRef

KUBELET_DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What a 1.34+ kubelet knows, newest first."""


class RegistrationFailed(Exception):
    """The plugin's GetInfo answer did not pass the kubelet's validation."""


class ProtocolViolation(Exception):
    """The plugin answered in a way the kubelet rejects (missing or extra claims)."""


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}
"""The proto's HealthStatus values, as the pod status spells them."""


@dataclass(frozen=True)
class HealthReport:
    """One device of a NodeWatchResources message, as the kubelet reads it."""

    pool_name: str
    device_name: str
    health: str
    """``Healthy``, ``Unhealthy`` or ``Unknown``."""
    message: str
    last_updated: int
    timeout_seconds: int


def health_reports(message: Any) -> dict[str, HealthReport]:
    """Device name → its report, from one NodeWatchResourcesResponse (either version)."""
    return {
        d.device.device_name: HealthReport(
            pool_name=d.device.pool_name,
            device_name=d.device.device_name,
            health=HEALTH_NAMES.get(d.health, "Unknown"),
            message=d.message,
            last_updated=d.last_updated_time,
            timeout_seconds=d.health_check_timeout_seconds,
        )
        for d in message.devices
    }


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def validate_plugin_info(
    info: Any,
    expected_name: str | None = None,
    known_services: Sequence[str] = KUBELET_DRA_SERVICES,
) -> str:
    """The kubelet's checks on a GetInfo answer; returns the chosen DRAPlugin service."""
    if info.type != "DRAPlugin":
        raise RegistrationFailed(f"plugin type {info.type!r} is not DRAPlugin")
    if not info.name:
        raise RegistrationFailed("plugin has no name")
    if expected_name is not None and info.name != expected_name:
        raise RegistrationFailed(f"plugin name {info.name!r}, expected {expected_name!r}")
    if not info.endpoint or not os.path.isabs(info.endpoint):
        raise RegistrationFailed(f"endpoint {info.endpoint!r} is not an absolute path")
    for version in info.supported_versions:
        if version in known_services:
            return str(version)
    raise RegistrationFailed(
        f"no supported DRAPlugin service in {list(info.supported_versions)}; "
        f"this kubelet knows {list(known_services)}"
    )


class RegisteredPlugin:
    """A plugin the fake kubelet registered: calls go to its DRA endpoint."""

    def __init__(self, name: str, endpoint: str, service: str, supported: Sequence[str]) -> None:
        self.name = name
        self.endpoint = endpoint
        self.service = service
        self.supported = tuple(supported)
        self.channel = grpc.aio.insecure_channel(f"unix://{endpoint}")
        if service == "v1.DRAPlugin":
            self._pb2: Any = v1_pb2
            self._stub: Any = v1_grpc.DRAPluginStub(self.channel)
        else:
            self._pb2 = v1beta1_pb2
            self._stub = v1beta1_grpc.DRAPluginStub(self.channel)

    def _request_claims(self, refs: Sequence[ClaimRef]) -> list[Any]:
        return [self._pb2.Claim(namespace=r.namespace, name=r.name, uid=r.uid) for r in refs]

    @staticmethod
    def _check_keys(refs: Sequence[ClaimRef], keys: Sequence[str]) -> None:
        wanted = {r.uid for r in refs}
        got = set(keys)
        if got - wanted:
            raise ProtocolViolation(f"response has unknown claims {sorted(got - wanted)}")
        if wanted - got:
            raise ProtocolViolation(f"response skipped claims {sorted(wanted - got)}")

    async def prepare(
        self, refs: Sequence[ClaimRef], timeout: float = 45.0
    ) -> dict[str, PrepareResult]:
        request = self._pb2.NodePrepareResourcesRequest(claims=self._request_claims(refs))
        response = await self._stub.NodePrepareResources(request, timeout=timeout)
        self._check_keys(refs, list(response.claims.keys()))
        out: dict[str, PrepareResult] = {}
        for uid, entry in response.claims.items():
            devices = tuple(
                PreparedDevice(
                    request_names=tuple(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                    share_id=(
                        d.share_id if self._pb2 is v1_pb2 and d.HasField("share_id") else None
                    ),
                )
                for d in entry.devices
            )
            out[uid] = PrepareResult(devices=devices, error=entry.error)
        return out

    async def unprepare(self, refs: Sequence[ClaimRef], timeout: float = 45.0) -> dict[str, str]:
        request = self._pb2.NodeUnprepareResourcesRequest(claims=self._request_claims(refs))
        response = await self._stub.NodeUnprepareResources(request, timeout=timeout)
        self._check_keys(refs, list(response.claims.keys()))
        return {uid: entry.error for uid, entry in response.claims.items()}

    async def watch_health(self, version: str = "v1alpha1") -> AsyncGenerator[Any, None]:
        """Open the health stream as the kubelet does; yields each full device list."""
        if version == "v1":
            stream = health_v1_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
                health_v1_pb2.NodeWatchResourcesRequest()
            )
        else:
            stream = health_v1alpha1_grpc.DRAResourceHealthStub(self.channel).NodeWatchResources(
                health_v1alpha1_pb2.NodeWatchResourcesRequest()
            )
        try:
            async for message in stream:
                yield message
        finally:
            stream.cancel()

    async def close(self) -> None:
        await self.channel.close()


class FakeKubelet:
    def __init__(
        self, registry_dir: str, known_services: Sequence[str] = KUBELET_DRA_SERVICES
    ) -> None:
        self.registry_dir = registry_dir
        self.known_services = tuple(known_services)
        self.plugins: dict[str, RegisteredPlugin] = {}
        self._seen: set[str] = set()

    async def register_socket(
        self, path: str, expected_name: str | None = None
    ) -> RegisteredPlugin:
        """Dial a registration socket and run the kubelet's handshake."""
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            await asyncio.wait_for(channel.channel_ready(), timeout=10)
            stub = reg_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=1)
            try:
                service = validate_plugin_info(info, expected_name, self.known_services)
            except RegistrationFailed as err:
                await stub.NotifyRegistrationStatus(
                    reg_pb2.RegistrationStatus(plugin_registered=False, error=str(err)), timeout=5
                )
                raise
            plugin = RegisteredPlugin(info.name, info.endpoint, service, info.supported_versions)
            await asyncio.wait_for(plugin.channel.channel_ready(), timeout=10)
            self.plugins[info.name] = plugin
            await stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5
            )
            return plugin

    async def wait_for_plugin(
        self, expected_name: str | None = None, timeout: float = 10.0
    ) -> RegisteredPlugin:
        """Watch the registry dir until a new socket appears, then register it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                names = sorted(os.listdir(self.registry_dir))
            except FileNotFoundError:  # the kubelet has not made it yet
                names = []
            for name in names:
                path = os.path.join(self.registry_dir, name)
                if path in self._seen or not _is_socket(path):
                    continue
                self._seen.add(path)
                return await self.register_socket(path, expected_name)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no plugin socket appeared in {self.registry_dir}")
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        for plugin in self.plugins.values():
            await plugin.close()
        self.plugins.clear()
