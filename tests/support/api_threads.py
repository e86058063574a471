"""Which threads open a connection to a test's API server.

Every API request of a driver process goes on its event loop
(:mod:`dra_driver.k8s.transport`); a request sent from any other thread (a pool's, a
``to_thread``'s) opens its connection there. ``socket.socket.connect`` is recorded with
the name of the thread that calls it, for connections to the server's port only.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest


@contextmanager
def connects_to(url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the threads that open a connection to the server at ``url``, in order."""
    port = urlsplit(url).port
    threads: list[str] = []
    connect = socket.socket.connect

    def recorded(sock: socket.socket, address: Any) -> None:
        if isinstance(address, tuple) and address[1] == port:
            threads.append(threading.current_thread().name)
        connect(sock, address)

    with monkeypatch.context() as patch:
        patch.setattr(socket.socket, "connect", recorded)
        yield threads
