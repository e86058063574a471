"""List and watch on the event loop, through :class:`~dra_driver.k8s.transport.ApiTransport`.

The requests of :mod:`dra_driver.k8s.watch`'s pure parts: a list read in chunks, one
chunk decoded at a time; a watch whose newline-delimited events are decoded as they
arrive, ending quietly when the server ends it, when it is quiet for the read
timeout or when it is cut; a 410 ``ERROR`` event is
:class:`~dra_driver.k8s.watch.WatchExpiredError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from dra_driver.k8s.errors import translate_api_errors
from dra_driver.k8s.rest import JsonObj
from dra_driver.k8s.transport import ApiTransport
from dra_driver.k8s.watch import (
    DEFAULT_WATCH_TIMEOUT_S,
    LIST_CHUNK_TIMEOUT_S,
    chunk_query,
    decode_event,
    take_chunk,
    watch_query,
)


async def list_in_chunks(
    transport: ApiTransport, path: str, limit: int, each: Callable[[JsonObj], None]
) -> str:
    """``each(item)`` for every object at ``path``, read ``limit`` at a time (0: in one
    answer); returns the list's resourceVersion.

    Chunks keep one chunk decoded at a time instead of the whole list: the slices of a
    large cluster are tens of megabytes decoded. Every chunk is of the first one's
    snapshot; a token that expired meanwhile is an :class:`ApiError` with status 410
    (list again)."""
    token = ""
    while True:
        body = await transport.send_json(
            "GET",
            path,
            query=chunk_query(limit, token),
            what=f"LIST {path}",
            timeout_s=LIST_CHUNK_TIMEOUT_S,
        )
        token, version = take_chunk(body, each)
        if not token:
            return version


async def watch_events(
    transport: ApiTransport,
    path: str,
    resource_version: str,
    emit: Callable[[str, JsonObj], None],
    *,
    timeout_s: int = DEFAULT_WATCH_TIMEOUT_S,
    read_timeout_s: float = 30.0,
) -> None:
    """Watch ``path`` from ``resource_version``, calling ``emit(type, object)`` per event,
    until the stream ends (resume from the last resourceVersion seen)."""
    what = f"WATCH {path}"
    with translate_api_errors(what):
        stream = transport.lines(
            path, watch_query(resource_version, timeout_s), read_timeout_s=read_timeout_s
        )
        async with contextlib.aclosing(stream) as lines:
            async for line in lines:
                event = decode_event(what, line)
                if event is not None:
                    emit(*event)
