"""The kubelet plugin-watcher Registration service (``pluginregistration.Registration``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from dra_driver._gen.pluginregistration.v1 import api_pb2 as reg_pb2

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"

# Services on the DRA socket, newest first: the kubelet walks this list in
# order and uses the first DRAPlugin version it knows.
SUPPORTED_SERVICES = (
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1.DRAResourceHealth",
    "v1alpha1.DRAResourceHealth",
)


@dataclass
class RegistrationState:
    """What the kubelet last told us about our registration."""

    registered: bool = False
    error: str | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    on_registered: list[Callable[[], None]] = field(default_factory=list)
    """Called after every successful registration (the kubelet restarted, or
    this is the first one): the node's slices must be published again."""

    def record(self, registered: bool, error: str | None) -> None:
        self.registered, self.error = registered, error
        self.changed.set()
        if registered:
            for callback in self.on_registered:
                callback()


class RegistrationServicer:
    """``pluginregistration.Registration``, served on the registration socket."""

    def __init__(self, driver_name: str, dra_endpoint: str, state: RegistrationState) -> None:
        self.driver_name = driver_name
        self.dra_endpoint = dra_endpoint
        self.state = state

    async def GetInfo(
        self, request: reg_pb2.InfoRequest, context: grpc.aio.ServicerContext
    ) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=DRA_PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.dra_endpoint,
            supported_versions=list(SUPPORTED_SERVICES),
        )

    async def NotifyRegistrationStatus(
        self, request: reg_pb2.RegistrationStatus, context: grpc.aio.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info(
                "kubelet registered driver %s (endpoint %s)", self.driver_name, self.dra_endpoint
            )
            self.state.record(True, None)
        else:
            # Surfaced: logged as an error and kept in RegistrationState, which
            # the plugin's liveness and status report.
            log.error(
                "kubelet rejected the registration of driver %s: %s",
                self.driver_name,
                request.error or "(no reason given)",
            )
            self.state.record(False, request.error or "rejected without a reason")
        return reg_pb2.RegistrationStatusResponse()
