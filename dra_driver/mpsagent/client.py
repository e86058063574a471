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
request timed out, failed or was answered with more than one line is closed,
never kept, so no late or extra answer is read as the next request's.

A connection is a small :class:`asyncio.Protocol` rather than a stream pair:
a request is one ``write`` and one future that the answer's line settles from
``data_received``, with one timer for its deadline, instead of a
``StreamReader``'s buffer and waiter and an ``asyncio.timeout`` per request
(two requests per MPS claim, inside the kubelet's waves: docs/benchmarks.md,
"The plugin's own CPU per MPS claim").
"""

from __future__ import annotations

import asyncio
from typing import Any

from dra_driver.base.errors import MpsAgentError
from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent.protocol import AgentStatus, ShareInfo

MAX_ANSWER_BYTES = wire.MAX_LINE_BYTES
"""The longest answer line read: the protocol refuses a longer one, so the client stops
reading there and closes the connection (the rest of such a line is never buffered)."""


class MpsAgentUnavailableError(MpsAgentError):
    """The agent could not be reached, or went away mid-request: worth a retry."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


__all__ = ["MAX_ANSWER_BYTES", "MpsAgentClient", "MpsAgentError", "MpsAgentUnavailableError"]


class _AnswerTooLongError(Exception):
    """The agent's answer line passed :data:`MAX_ANSWER_BYTES`."""


class _Connection(asyncio.Protocol):
    """One unix connection to the agent: one request at a time, answered by the next line.

    The answer future gets the line (newline included), ``b""`` when the agent closed
    the connection first, or the transport's error."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.usable = True
        """False once the connection ended, broke, or must not carry another request."""
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answer: asyncio.Future[bytes] | None = None
        self._buffer = b""

    # --- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():
            # Bytes nobody asked for (never from a well-behaved agent): this
            # connection's next answer could not be told from them.
            self.close()
            return
        buffer = self._buffer + data if self._buffer else data
        end = buffer.find(b"\n")
        if end >= MAX_ANSWER_BYTES or (end < 0 and len(buffer) >= MAX_ANSWER_BYTES):
            self._buffer = b""
            answer.set_exception(_AnswerTooLongError())
            self.close()
            return
        if end < 0:
            self._buffer = buffer
            return
        self._buffer = b""
        if end + 1 < len(buffer):  # more than one line for one request
            self.usable = False
        answer.set_result(buffer[: end + 1])

    def eof_received(self) -> bool:
        self.usable = False
        self._settle_unanswered(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._settle_unanswered(exc)
        if not self.lost.done():
            self.lost.set_result(None)

    # --- one request ------------------------------------------------------------------

    async def request(self, payload: bytes, timeout: float) -> bytes:
        """Send ``payload`` and wait for its answer line (``b""``: closed unanswered)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bytes] = loop.create_future()
        self._answer = answer
        deadline = loop.call_later(timeout, _expire, answer)
        try:
            # A line is far below the transport's buffer limit: no drain needed (an
            # agent that reads nothing fails the request at its deadline).
            self.transport.write(payload)
            return await answer
        finally:
            deadline.cancel()
            self._answer = None

    def close(self) -> None:
        self.usable = False
        if self.transport is not None:
            self.transport.close()

    def _settle_unanswered(self, exc: Exception | None) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            if exc is None:
                answer.set_result(b"")
            else:
                answer.set_exception(exc)


def _expire(answer: asyncio.Future[bytes]) -> None:
    if not answer.done():
        answer.set_exception(TimeoutError())


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
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await loop.create_unix_connection(_Connection, self.socket_path)
        except (OSError, TimeoutError) as err:
            raise self._unavailable(f"{type(err).__name__}: {err}") from err
        self.connections_opened += 1
        return conn

    async def _exchange(self, conn: _Connection, payload: bytes, *, fresh: bool) -> bytes:
        """Send one request, read its answer line; keeps the connection if it may.

        On a kept connection, an empty answer or a reset before any answer means
        the agent closed it: returns ``b""`` so that the caller sends again."""
        keep = False
        try:
            line = await conn.request(payload, self.timeout)
            keep = bool(line)
        except _AnswerTooLongError:
            raise MpsAgentError(
                "internal",
                f"bad answer from the mps-agent: response longer than {MAX_ANSWER_BYTES} bytes",
            ) from None
        except (OSError, TimeoutError) as err:
            if not fresh and isinstance(err, ConnectionError):
                return b""
            raise self._unavailable(f"{type(err).__name__} during the request") from err
        finally:
            if not (keep and conn.usable and self._keep(conn)):
                conn.close()
                await conn.lost
        if not line and fresh:
            raise self._unavailable("the agent closed the connection without answering")
        return line

    def _take_idle(self) -> _Connection | None:
        if self._idle_loop is not asyncio.get_running_loop():
            # Kept by another event loop (a test's earlier asyncio.run): unusable here.
            self._idle, self._idle_loop = [], None
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn
            conn.close()
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
        for conn in idle:
            conn.close()
            await conn.lost

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
