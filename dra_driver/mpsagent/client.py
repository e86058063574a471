"""The plugin's side of the mps-agent socket.

One short connection per request: the plugin holds no connection state, so a
plugin restart, or an agent restart between two requests, needs no reconnect
logic. Every method is safe to repeat (``ensure_share`` is idempotent,
``release_share`` of an unknown share is a no-op).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dra_driver.base.errors import MpsAgentError
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo


class MpsAgentUnavailableError(MpsAgentError):
    """The agent could not be reached, or went away mid-request: worth a retry."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


__all__ = ["MpsAgentClient", "MpsAgentError", "MpsAgentUnavailableError"]


class MpsAgentClient:
    def __init__(self, socket_path: str, timeout: float = 60.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _unavailable(self, what: str) -> MpsAgentUnavailableError:
        return MpsAgentUnavailableError(
            f"the mps-agent is not reachable at {self.socket_path} ({what}); MPS shares "
            "need the mps-agent DaemonSet running on this node"
        )

    async def _call(self, request: wire.Request) -> dict[str, Any]:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.socket_path, limit=wire.MAX_LINE_BYTES * 64),
                self.timeout,
            )
        except (OSError, TimeoutError) as err:
            raise self._unavailable(f"{type(err).__name__}: {err}") from err
        try:
            writer.write(wire.encode_request(request))
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), self.timeout)
        except (OSError, TimeoutError) as err:
            raise self._unavailable(f"{type(err).__name__} during the request") from err
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        if not line:
            raise self._unavailable("the agent closed the connection without answering")
        try:
            reply = wire.parse_response(line)
        except wire.ProtocolError as err:
            raise MpsAgentError("internal", f"bad answer from the mps-agent: {err}") from err
        if isinstance(reply, wire.ErrorReply):
            raise MpsAgentError(reply.kind, f"mps-agent: {reply.message}")
        return reply

    async def ensure_share(
        self,
        gpu_uuid: str,
        share_id: str,
        *,
        claim_uid: str,
        memory_limit_bytes: int,
        active_thread_percentage: int,
        uid: int | None = None,
    ) -> ShareInfo:
        request = wire.EnsureShare(
            gpu_uuid, share_id, claim_uid, memory_limit_bytes, active_thread_percentage, uid
        )
        result = await self._call(request)
        return wire.share_from_json(result["share"])

    async def release_share(self, gpu_uuid: str, share_id: str) -> bool:
        """True if the agent held the share."""
        result = await self._call(wire.ReleaseShare(gpu_uuid, share_id))
        return bool(result.get("released"))

    async def list_shares(self) -> list[ShareInfo]:
        result = await self._call(wire.ListShares())
        return [wire.share_from_json(s) for s in result.get("shares", [])]

    async def status(self) -> AgentStatus:
        return wire.status_from_json(await self._call(wire.Status()))
