"""The two gRPC servers of a kubelet plugin, started and stopped in the right order.

The DRA socket comes up first, so that when the kubelet sees the
registration socket and dials the endpoint it names, that endpoint answers.
Shutdown goes the other way: the registration socket disappears first (the
kubelet deregisters us), then the DRA server drains in-flight calls. Each
socket file is ours to remove; the kubelet never removes them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence

import grpc

from dra_driver._gen.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.kubeletplugin.dra_servicer import ClaimHandler, add_dra_services
from dra_driver.kubeletplugin.health import HealthHub, add_health_services
from dra_driver.kubeletplugin.registration import RegistrationServicer, RegistrationState
from dra_driver.kubeletplugin.sockets import SocketPaths, remove_stale_socket

log = logging.getLogger(__name__)

SOCKET_MODE = 0o660


class PluginServer:
    def __init__(
        self,
        driver_name: str,
        sockets: SocketPaths,
        handler: ClaimHandler,
        health: HealthHub,
        *,
        on_registered: Sequence[Callable[[], None]] = (),
    ) -> None:
        """``on_registered``: called after every successful registration
        (:attr:`RegistrationState.on_registered`)."""
        self.driver_name = driver_name
        self.sockets = sockets
        self.handler = handler
        self.health = health
        self.registration = RegistrationState(on_registered=list(on_registered))
        self._dra: grpc.aio.Server | None = None
        self._reg: grpc.aio.Server | None = None

    async def start(self) -> None:
        for path in (self.sockets.dra, self.sockets.registration):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if remove_stale_socket(path):
                log.info("removed stale socket %s", path)

        self._dra = grpc.aio.server()
        add_dra_services(self._dra, self.handler)
        add_health_services(self._dra, self.health)
        self._bind(self._dra, self.sockets.dra)
        await self._dra.start()
        log.info("DRA service listening on %s", self.sockets.dra)

        self._reg = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(
            RegistrationServicer(self.driver_name, self.sockets.dra, self.registration), self._reg
        )
        self._bind(self._reg, self.sockets.registration)
        await self._reg.start()
        log.info("registration service listening on %s", self.sockets.registration)

    @staticmethod
    def _bind(server: grpc.aio.Server, path: str) -> None:
        if server.add_insecure_port(f"unix://{path}") == 0:
            raise OSError(f"cannot listen on unix socket {path}")
        os.chmod(path, SOCKET_MODE)

    async def stop(self, grace: float = 5.0) -> None:
        if self._reg is not None:
            await self._reg.stop(grace=None)
            self._remove(self.sockets.registration)
            self._reg = None
        await self.health.close()
        if self._dra is not None:
            await self._dra.stop(grace=grace)
            self._remove(self.sockets.dra)
            self._dra = None

    @staticmethod
    def _remove(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
