"""The DRAPlugin node service, v1 and v1beta1, over one shared handler.

The two API versions differ only in ``Device.share_id`` (v1, 1.35+); both are
served on the same socket so 1.32 and 1.33 kubelets (v1beta1) and 1.34+ kubelets
(v1) work. Per-claim failures go into the response map; a gRPC error is kept
for failures of the whole call, because the kubelet then ignores the response.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import grpc

from dra_driver._gen.dra.v1 import api_pb2 as v1_pb2
from dra_driver._gen.dra.v1 import api_pb2_grpc as v1_grpc
from dra_driver._gen.dra.v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver._gen.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.base.errors import ClaimError, DriverError
from dra_driver.base.ids import ClaimRef, ClaimUID
from dra_driver.core.prepare import error_reason

log = logging.getLogger(__name__)


class PreparedDevice(Protocol):
    """What the kubelet learns about one prepared device."""

    @property
    def request_names(self) -> tuple[str, ...]: ...
    @property
    def pool_name(self) -> str: ...
    @property
    def device_name(self) -> str: ...
    @property
    def cdi_device_ids(self) -> tuple[str, ...]: ...
    @property
    def share_id(self) -> str | None: ...


@dataclass(frozen=True)
class ClaimOutcome:
    """The answer for one claim: its devices, or an error naming the claim and cause."""

    devices: Sequence[PreparedDevice] = ()
    error: str | None = None
    reason: str = ""
    """With ``error``: a short CamelCase cause (metrics, Events); not sent to the kubelet."""
    repeated: bool = False
    """Prepare: the claim had been prepared already; nothing was done."""

    @classmethod
    def failed(cls, claim: ClaimRef, err: BaseException) -> ClaimOutcome:
        """The answer for ``claim`` failed by ``err``: the one place its message is made.

        A ClaimError names its claim already; any other cause gets the claim's name in
        front (an unexpected error by its type too: it is a bug to report)."""
        if isinstance(err, ClaimError) and err.claim.uid == claim.uid:
            message = str(err)
        else:
            cause = str(err) if isinstance(err, DriverError) else repr(err)
            message = f"claim {claim}: {cause}"
        return cls(error=message, reason=error_reason(err))


class ClaimHandler(Protocol):
    """The driver behind the service (the prepare/unprepare engine)."""

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]: ...

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[ClaimUID, ClaimOutcome]: ...


async def _refs_or_abort(
    claims: Sequence[Any], context: grpc.aio.ServicerContext
) -> list[ClaimRef]:
    refs = []
    for claim in claims:
        if not (claim.namespace and claim.name and claim.uid):
            # The kubelet always sends all three: a malformed request fails whole.
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "every claim needs namespace, name and uid"
            )
        refs.append(ClaimRef(claim.namespace, claim.name, ClaimUID(claim.uid)))
    return refs


class DRAPluginService:
    """NodePrepare/NodeUnprepareResources for one API version.

    One class serves both versions: it is given the version's generated
    message module, and sends ``share_id`` only where that module has it.
    """

    def __init__(self, handler: ClaimHandler, pb2: ModuleType) -> None:
        self.handler = handler
        self.pb2 = pb2
        self.with_share_id = "share_id" in pb2.Device.DESCRIPTOR.fields_by_name

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        refs = await _refs_or_abort(request.claims, context)
        outcomes = await self.handler.prepare(refs)
        response = self.pb2.NodePrepareResourcesResponse()
        for ref in refs:
            outcome = outcomes.get(ref.uid) or ClaimOutcome(error=f"claim {ref}: not processed")
            entry = response.claims[ref.uid]
            if outcome.error is not None:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                out = entry.devices.add(
                    request_names=list(device.request_names),
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=list(device.cdi_device_ids),
                )
                if self.with_share_id and device.share_id is not None:
                    out.share_id = device.share_id
        return response

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        refs = await _refs_or_abort(request.claims, context)
        outcomes = await self.handler.unprepare(refs)
        response = self.pb2.NodeUnprepareResourcesResponse()
        for ref in refs:
            outcome = outcomes.get(ref.uid) or ClaimOutcome(error=f"claim {ref}: not processed")
            response.claims[ref.uid].error = outcome.error or ""
        return response


def add_dra_services(server: grpc.aio.Server, handler: ClaimHandler) -> None:
    v1_grpc.add_DRAPluginServicer_to_server(DRAPluginService(handler, v1_pb2), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DRAPluginService(handler, v1beta1_pb2), server)
