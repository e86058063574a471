"""A small HTTP endpoint served from daemon threads: the standard library's WSGI
server (``wsgiref``), the one ``prometheus_client`` serves the metrics with
(:mod:`.metrics_server`), for endpoints that are not metrics (``/readyz``).

Each request is answered in a thread of its own, so a probe never waits on the event
loop unless the application asks it (and then with a bound of its own choosing).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _ThreadingWsgiServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    """A request's thread never holds the process up at exit."""


class _QuietHandler(WSGIRequestHandler):
    """Requests logged at DEBUG through ``logging``, not to stderr (a probe every few
    seconds would fill the log)."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


@dataclass
class HttpEndpoint:
    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        """The bound port (useful when 0 asked for any free one)."""
        return int(self.server.server_address[1])

    def stop(self) -> None:
        """Stop serving and close the listening socket (blocks up to half a second:
        the server's poll interval)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_http(app: WsgiApp, port: int, address: str, name: str) -> HttpEndpoint:
    """Serve ``app`` on ``address:port`` (0: any free port) until :meth:`HttpEndpoint.stop`.

    Raises :class:`OSError` when the port cannot be bound (the caller names its flag)."""
    server = make_server(
        address, port, app, server_class=_ThreadingWsgiServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return HttpEndpoint(server, thread)
