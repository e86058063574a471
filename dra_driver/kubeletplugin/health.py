"""DRAResourceHealth streams (v1alpha1 for 1.34 to 1.36 kubelets, v1 for 1.37+).

A :class:`HealthHub` holds the current health of every device we publish;
each open stream sends the full list at once and again after every update, as
the API asks: devices missing from a message become Unknown in the kubelet,
and so does every device whose last report is older than its
``health_check_timeout_seconds`` (30 s when 0). The health monitor
(``plugin/health_monitor.py``) therefore updates the hub on every change
*and* periodically, with :func:`health_states` built from the health model.
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

from dra_driver._gen.dra_health.v1 import api_pb2 as v1_pb2
from dra_driver._gen.dra_health.v1 import api_pb2_grpc as v1_grpc
from dra_driver._gen.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from dra_driver._gen.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from dra_driver.core.health import DeviceHealth, Status

MESSAGE_LIMIT = 1024
"""The API's limit on ``message``; longer ones are cut as the kubelet would cut them."""


class Health(enum.IntEnum):
    """Values equal the proto enum ``HealthStatus``."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealthState:
    pool_name: str
    device_name: str
    health: Health
    last_updated: int
    """Unix seconds."""
    message: str = ""
    timeout_seconds: int = 0
    """How long the kubelet may trust the entry; 0 leaves it to the kubelet's default."""


_HEALTH_OF = {Status.HEALTHY: Health.HEALTHY, Status.UNHEALTHY: Health.UNHEALTHY}


def health_states(
    devices: Iterable[DeviceHealth], pool_name: str, *, now: float, timeout_seconds: int
) -> list[DeviceHealthState]:
    """The health model's view as the stream sends it: checked ``now``, valid ``timeout_seconds``.

    The message of an unhealthy device starts with its reason, so the pod
    status shows the same word as the device's taint.
    """
    return [
        DeviceHealthState(
            pool_name,
            d.device_name,
            _HEALTH_OF.get(d.status, Health.UNKNOWN),
            int(now),
            f"{d.reason}: {d.message}" if d.reason else d.message,
            timeout_seconds,
        )
        for d in devices
    ]


def truncate_message(message: str) -> str:
    """At most :data:`MESSAGE_LIMIT` characters, ``...`` marking a cut (as the kubelet does)."""
    if len(message) <= MESSAGE_LIMIT:
        return message
    return message[: MESSAGE_LIMIT - 3] + "..."


class HealthHub:
    def __init__(self, devices: Iterable[DeviceHealthState] = ()) -> None:
        self._devices = tuple(devices)
        self._version = 0
        self._closed = False
        self._changed = asyncio.Condition()

    def snapshot(self) -> tuple[int, tuple[DeviceHealthState, ...]]:
        return self._version, self._devices

    async def update(self, devices: Iterable[DeviceHealthState]) -> None:
        async with self._changed:
            self._devices = tuple(devices)
            self._version += 1
            self._changed.notify_all()

    def _news_since(self, version: int) -> bool:
        return self._closed or self._version != version

    async def close(self) -> None:
        """End every open stream (server shutdown)."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    async def watch(self) -> AsyncIterator[tuple[DeviceHealthState, ...]]:
        """The current list, then the list after every change, until closed."""
        version, devices = self.snapshot()
        yield devices
        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._news_since, version))
                if self._closed:
                    return
                version, devices = self._version, self._devices
            yield devices


def _response(pb2: ModuleType, devices: Iterable[DeviceHealthState]) -> Any:
    response = pb2.NodeWatchResourcesResponse()
    for d in devices:
        response.devices.add(
            device=pb2.DeviceIdentifier(pool_name=d.pool_name, device_name=d.device_name),
            health=int(d.health),
            last_updated_time=d.last_updated,
            health_check_timeout_seconds=d.timeout_seconds,
            message=truncate_message(d.message),
        )
    return response


class HealthService:
    """NodeWatchResources for one API version (given its generated message module)."""

    def __init__(self, hub: HealthHub, pb2: ModuleType) -> None:
        self.hub = hub
        self.pb2 = pb2

    async def NodeWatchResources(
        self, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for devices in self.hub.watch():
            yield _response(self.pb2, devices)


def add_health_services(server: grpc.aio.Server, hub: HealthHub) -> None:
    v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(HealthService(hub, v1alpha1_pb2), server)
    v1_grpc.add_DRAResourceHealthServicer_to_server(HealthService(hub, v1_pb2), server)
