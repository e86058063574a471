"""WatchCanceller: ending a watch stream from another thread, whatever state it is in."""

from __future__ import annotations

import socket
import threading
import time

import urllib3
from urllib3.exceptions import ProtocolError

from dra_driver.k8s.watch import WatchCanceller


def _streaming_server() -> tuple[socket.socket, threading.Event]:
    """A server that answers one request with headers and then sends nothing."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        done.wait(10)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, done


def _open(server: socket.socket) -> urllib3.BaseHTTPResponse:
    port = server.getsockname()[1]
    pool = urllib3.PoolManager()
    return pool.request("GET", f"http://127.0.0.1:{port}/watch", preload_content=False)


def _read_to_the_end(response: urllib3.BaseHTTPResponse) -> bytes:
    data = b""
    try:
        for chunk in response.stream(1024):
            data += chunk
    except ProtocolError:
        pass  # the stream was cut
    return data


def test_cancel_ends_a_blocked_read() -> None:
    server, done = _streaming_server()
    try:
        response = _open(server)
        canceller = WatchCanceller()
        canceller.attach(response)
        timer = threading.Timer(0.2, canceller.cancel)
        started = time.monotonic()
        timer.start()
        # Without the cancel this read blocks until the server gives up (10 s);
        # the cut stream ends the read (watch_objects treats it as the end).
        assert _read_to_the_end(response) == b""
        timer.join()
        assert time.monotonic() - started < 5
        assert canceller.cancelled
    finally:
        done.set()
        server.close()


def test_cancel_after_the_stream_closed_itself_does_not_raise() -> None:
    # The watch ended on its own (its socket closed) just as the informer stopped:
    # shutting down a closed socket fails with EBADF, which used to escape cancel().
    server, done = _streaming_server()
    try:
        response = _open(server)
        canceller = WatchCanceller()
        canceller.attach(response)
        response.close()
        canceller.cancel()
        canceller.cancel()
        assert canceller.cancelled
    finally:
        done.set()
        server.close()


def test_a_stream_attached_after_cancel_is_ended_at_once() -> None:
    server, done = _streaming_server()
    try:
        canceller = WatchCanceller()
        canceller.cancel()
        response = _open(server)
        started = time.monotonic()
        canceller.attach(response)
        assert _read_to_the_end(response) == b""
        assert time.monotonic() - started < 5
    finally:
        done.set()
        server.close()
