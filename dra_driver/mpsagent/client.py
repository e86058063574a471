"""The plugin's side of the mps-agent socket.

Every method is safe to repeat (``ensure_share`` is idempotent,
``release_share`` of an unknown share is a no-op), so a request may be sent
again after the agent went away.

By default each request has a connection of its own. With ``keep_connections``
(the kubelet plugin's prepare path) up to that many connections stay open
between requests: a wave of ten claims otherwise opens, accepts and closes ten
unix connections on both sides' event loops. One connection carries one request
at a time; concurrent requests take different connections. A kept connection
the agent has closed meanwhile (an agent restart) is noticed by the empty answer
and the request is sent again once on a new connection; a connection whose
request timed out or failed is closed, never kept, so no late answer is read
as the next request's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dra_driver.base.errors import MpsAgentError
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo

_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class MpsAgentUnavailableError(MpsAgentError):
    """The agent could not be reached, or went away mid-request: worth a retry."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


__all__ = ["MpsAgentClient", "MpsAgentError", "MpsAgentUnavailableError"]


class MpsAgentClient:
    def __init__(
        self, socket_path: str, timeout: float = 60.0, *, keep_connections: int = 0
    ) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.keep_connections = keep_connections
        self._idle: list[_Connection] = []
        self._idle_loop: asyncio.AbstractEventLoop | None = None
        self.connections_opened = 0
        """Connections made so far (how often keeping one was not possible)."""

    @property
    def kept_connections(self) -> int:
        """Connections open and waiting for the next request."""
        return len(self._idle)

    def _unavailable(self, what: str) -> MpsAgentUnavailableError:
        return MpsAgentUnavailableError(
            f"the mps-agent is not reachable at {self.socket_path} ({what}); MPS shares "
            "need the mps-agent DaemonSet running on this node"
        )

    async def _call(self, request: wire.Request) -> dict[str, Any]:
        payload = wire.encode_request(request)
        kept = self._take_idle()
        line = b""
        if kept is not None:
            line = await self._exchange(kept, payload, fresh=False)
        if not line:  # no kept connection, or the agent had closed it: a new one
            line = await self._exchange(await self._connect(), payload, fresh=True)
        try:
            reply = wire.parse_response(line)
        except wire.ProtocolError as err:
            raise MpsAgentError("internal", f"bad answer from the mps-agent: {err}") from err
        if isinstance(reply, wire.ErrorReply):
            message = f"mps-agent: {reply.message}"
            if isinstance(request, wire.EnsureShare) and "unknown field(s)" in reply.message:
                message += (
                    " (this node's mps-agent is older than the kubelet plugin, which keeps a "
                    "legacy MPS daemon to one namespace: roll the agent when the node has no "
                    "MPS clients, kubectl delete pod -l app.kubernetes.io/component=mps-agent "
                    "--field-selector spec.nodeName=<node>)"
                )
            raise MpsAgentError(reply.kind, message)
        return reply

    async def _connect(self) -> _Connection:
        try:
            async with asyncio.timeout(self.timeout):
                conn = await asyncio.open_unix_connection(
                    self.socket_path, limit=wire.MAX_LINE_BYTES * 64
                )
        except (OSError, TimeoutError) as err:
            raise self._unavailable(f"{type(err).__name__}: {err}") from err
        self.connections_opened += 1
        return conn

    async def _exchange(self, conn: _Connection, payload: bytes, *, fresh: bool) -> bytes:
        """Send one request, read its answer line; keeps the connection if it may.

        On a kept connection, an empty answer or a reset before any answer means
        the agent closed it: returns ``b""`` so that the caller sends again."""
        reader, writer = conn
        keep = False
        try:
            writer.write(payload)
            async with asyncio.timeout(self.timeout):
                await writer.drain()
                line = await reader.readline()
            keep = bool(line) and line.endswith(b"\n")
        except (OSError, TimeoutError) as err:
            if not fresh and isinstance(err, ConnectionError):
                return b""
            raise self._unavailable(f"{type(err).__name__} during the request") from err
        finally:
            if not (keep and self._keep(conn)):
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        if not line and fresh:
            raise self._unavailable("the agent closed the connection without answering")
        return line

    def _take_idle(self) -> _Connection | None:
        if self._idle_loop is not asyncio.get_running_loop():
            # Kept by another event loop (a test's earlier asyncio.run): unusable here.
            self._idle, self._idle_loop = [], None
        while self._idle:
            conn = self._idle.pop()
            if not conn[1].is_closing() and not conn[0].at_eof():
                return conn
            conn[1].close()
        return None

    def _keep(self, conn: _Connection) -> bool:
        if len(self._idle) >= self.keep_connections:
            return False
        self._idle_loop = asyncio.get_running_loop()
        self._idle.append(conn)
        return True

    async def close(self) -> None:
        """Close the kept connections."""
        idle, self._idle = self._idle, []
        if self._idle_loop is not asyncio.get_running_loop():
            self._idle_loop = None
            return
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def ensure_share(
        self,
        gpu_uuid: str,
        share_id: str,
        *,
        claim_uid: str,
        memory_limit_bytes: int,
        active_thread_percentage: int,
        uid: int | None = None,
        tenant: str | None = None,
        cooperative: bool = False,
    ) -> ShareInfo:
        request = wire.EnsureShare(
            gpu_uuid,
            share_id,
            claim_uid,
            memory_limit_bytes,
            active_thread_percentage,
            uid,
            tenant,
            cooperative,
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
        return wire.status_from_json(await self._call(wire.StatusRequest()))
