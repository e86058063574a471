"""The agent's unix socket (I/O): request lines in, response lines out (:mod:`.protocol`).

Requests are served one line at a time per connection; a request that fails
answers an error and never stops the agent. A plugin that disconnects
mid-request does not cancel it: the operation completes (it is shielded), and a
repeated ``ensure_share`` is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from typing import Any, Protocol

from dra_driver.mpsagent import protocol as wire
from dra_driver.mpsagent import sockets
from dra_driver.mpsagent.protocol import ShareInfo

log = logging.getLogger(__name__)


class AgentRequestError(Exception):
    """A request the agent refuses or cannot carry out; answered as an error of ``kind``."""

    def __init__(self, kind: wire.ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: wire.ErrorKind = kind


class ShareService(Protocol):
    """What the socket serves (:class:`.agent.MpsAgent`)."""

    async def ensure_share(self, req: wire.EnsureShare) -> ShareInfo: ...
    async def release_share(self, req: wire.ReleaseShare) -> bool: ...
    def list_shares(self) -> list[ShareInfo]: ...
    def status(self) -> wire.AgentStatus: ...


class AgentServer:
    def __init__(self, service: ShareService, socket_path: str) -> None:
        self._service = service
        self.socket_path = socket_path
        self._connections: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None

    async def handle_line(self, line: bytes) -> bytes:
        """One request line to one response line; never raises."""
        try:
            return wire.encode_result(await self._dispatch(wire.parse_request(line)))
        except (wire.ProtocolError, AgentRequestError) as err:
            return wire.encode_error(err.kind, str(err))
        except Exception as err:
            log.exception("mps-agent request failed")
            return wire.encode_error("internal", f"{type(err).__name__}: {err}")

    async def _dispatch(self, request: wire.Request) -> dict[str, Any]:
        service = self._service
        match request:
            case wire.EnsureShare():
                return {"share": wire.share_to_json(await service.ensure_share(request))}
            case wire.ReleaseShare():
                return {"released": await service.release_share(request)}
            case wire.ListShares():
                return {"shares": [wire.share_to_json(s) for s in service.list_shares()]}
            case wire.StatusRequest():
                return wire.status_to_json(service.status())

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while True:
                try:
                    line = await reader.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    writer.write(
                        wire.encode_error(
                            "invalid_request", f"request line over {wire.MAX_LINE_BYTES} bytes"
                        )
                    )
                    await writer.drain()
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                # Shielded: a plugin that goes away mid-request must not cut an
                # operation (a daemon start, a namespace) in half.
                reply = await asyncio.shield(self.handle_line(line))
                writer.write(reply)
                await writer.drain()
        except (ConnectionError, BrokenPipeError):
            pass
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def serve(self) -> None:
        """Bind the socket (refusing if another agent answers on it)."""
        path = self.socket_path
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.stat(path).st_mode):
                if sockets.answers(path):
                    raise RuntimeError(f"another mps-agent is already serving {path}")
                os.unlink(path)
        self._server = await asyncio.start_unix_server(
            self._on_connection, path=path, limit=wire.MAX_LINE_BYTES + 1
        )
        os.chmod(path, 0o660)

    async def close(self) -> None:
        """Stop listening and end every connection (an operation in flight completes)."""
        if self._server is not None:
            self._server.close()
        # Closing the transports ends each connection's loop at its next read (an
        # operation in flight completes first); cancelling the handler tasks instead
        # trips asyncio 3.11's stream callback into logging a CancelledError.
        for writer in list(self._connections.values()):
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def remove_socket(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
