"""The pure parts of a raw list and watch of any kind, as JSON.

Why raw: kubernetes 37.0.2's typed ``watch.Watch`` deserialises resource.k8s.io
events into the wrong models (and its models drop fields they do not know), so a
watch is one ``GET ...?watch=true`` whose newline-delimited JSON events are decoded
here, and a list is read in chunks (``limit`` and ``continue``, as client-go's
reflector lists). The requests themselves go on the event loop
(:mod:`dra_driver.k8s.watch_loop`, through :mod:`dra_driver.k8s.transport`). An
``ERROR`` event with a 410 Status (resourceVersion too old) is
:class:`WatchExpiredError`, and the caller relists.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from dra_driver.base.errors import ApiError
from dra_driver.k8s.errors import truncate
from dra_driver.k8s.rest import JsonObj

DEFAULT_WATCH_TIMEOUT_S = 300
"""Server-side ``timeoutSeconds`` of one watch request."""

LIST_CHUNK_TIMEOUT_S = 60.0

MERGE_PATCH = "application/merge-patch+json"


class WatchExpiredError(ApiError):
    """The watch's resourceVersion is older than the server keeps (410 Gone/Expired)."""


def chunk_query(limit: int, token: str) -> list[tuple[str, str]]:
    query = [("limit", str(limit))] if limit > 0 else []
    if token:
        query.append(("continue", token))
    return query


def take_chunk(body: JsonObj, each: Callable[[JsonObj], None]) -> tuple[str, str]:
    """``each(item)`` for the items of one chunk of a list, with ``kind``/``apiVersion``
    filled in from the list; returns (the continue token, the list's resourceVersion)."""
    kind = str(body.get("kind", ""))
    item_kind = kind[: -len("List")] if kind.endswith("List") else kind
    for raw in body.pop("items", None) or []:
        if isinstance(raw, dict):
            raw.setdefault("kind", item_kind)
            raw.setdefault("apiVersion", body.get("apiVersion", ""))
            each(raw)
    meta = body.get("metadata") or {}
    return str(meta.get("continue") or ""), str(meta.get("resourceVersion", ""))


def watch_query(resource_version: str, timeout_s: int) -> list[tuple[str, str]]:
    return [
        ("watch", "true"),
        ("resourceVersion", resource_version),
        ("timeoutSeconds", str(timeout_s)),
        ("allowWatchBookmarks", "true"),
    ]


def decode_event(what: str, line: str | bytes) -> tuple[str, JsonObj] | None:
    """One line of a watch stream: (type, object); None for a blank line. Raises
    :class:`WatchExpiredError` for a 410 ``ERROR`` event, :class:`ApiError` for
    another ``ERROR`` event or a line that is not an event."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except ValueError as err:
        raise ApiError(f"{what}: bad event {truncate(repr(line))}") from err
    if not isinstance(event, dict):
        raise ApiError(f"{what}: bad event {truncate(repr(line))}")
    etype = str(event.get("type", ""))
    obj = event.get("object") or {}
    if etype == "ERROR":
        code = obj.get("code")
        message = f"{what}: {obj.get('message', 'watch error')}"
        if code == 410:
            raise WatchExpiredError(message, status=410)
        raise ApiError(message, status=code if isinstance(code, int) else None)
    return etype, obj
