"""The one boundary where the official client's errors become ours.

Every request (:mod:`dra_driver.k8s.transport`) runs inside
:func:`translate_api_errors`, so nothing above :mod:`dra_driver.k8s` sees
``ApiException`` or a transport's error::

    ApiException 404                     -> ApiNotFoundError
    ApiException 409                     -> ApiConflictError
    ApiException 429, 5xx, 0 (transport) -> ApiUnavailableError
    ApiException other                   -> ApiError
    OSError (the transport's: no answer) -> ApiUnavailableError

The original exception stays reachable as ``__cause__``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

from dra_driver.base.errors import (
    ApiConflictError,
    ApiError,
    ApiNotFoundError,
    ApiUnavailableError,
)
from dra_driver.k8s.official import ApiException

BODY_MAX_CHARS = 512
"""Response bodies are cut to this length so one bad reply cannot flood the logs."""

# Status 0 is what the client uses when no HTTP response was received (TLS errors).
_RETRYABLE_STATUSES = frozenset({0, 429})

# Errors raised when there is no HTTP response at all: the transport raises aiohttp's
# as OSError (ConnectionError, TimeoutError, ssl.SSLError and friends).
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError,)


def error_class_for_status(status: int | None) -> type[ApiError]:
    """Which of our errors an HTTP status becomes; pure, so it is tested as a table."""
    if status == 404:
        return ApiNotFoundError
    if status == 409:
        return ApiConflictError
    if status is None or status in _RETRYABLE_STATUSES or 500 <= status <= 599:
        return ApiUnavailableError
    return ApiError


def truncate(text: str, limit: int = BODY_MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more chars)"


def describe_body(body: object) -> str:
    """The useful part of an error response body.

    For a Kubernetes ``Status`` object that is its ``message``; anything else
    is shown raw. Either way the result is truncated.
    """
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        parsed = json.loads(body)
    except ValueError:
        return truncate(body.strip())
    if isinstance(parsed, dict) and parsed.get("kind") == "Status" and parsed.get("message"):
        return truncate(str(parsed["message"]))
    return truncate(body.strip())


def api_error_from_exception(what: str, err: ApiException) -> ApiError:
    """Our error for a failed call described by ``what`` (e.g. ``GET resourceclaims ns/x``)."""
    status = err.status if isinstance(err.status, int) else None
    reason = str(err.reason or "").strip()
    parts = [what, f"HTTP {status}" if status else "no HTTP response"]
    if reason:
        parts.append(truncate(reason))
    detail = describe_body(err.body)
    if detail:
        parts.append(detail)
    return error_class_for_status(status)(": ".join(parts), status=status)


@contextmanager
def translate_api_errors(what: str) -> Iterator[None]:
    """Run an API call, re-raising client and transport errors as :class:`ApiError`.

    ``what`` names the call for the message, e.g. ``"GET resourceclaims default/foo"``.
    """
    try:
        yield
    except ApiException as err:
        raise api_error_from_exception(what, err) from err
    except _TRANSPORT_ERRORS as err:
        message = truncate(f"{what}: transport error: {type(err).__name__}: {err}")
        raise ApiUnavailableError(message) from err
