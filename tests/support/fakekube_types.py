"""Vocabulary of the fake Kubernetes API: served kinds and ``Status`` errors.

See :mod:`tests.support.fakekube` for the server and what it implements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JsonObj = dict[str, Any]


@dataclass(frozen=True)
class ResourceKind:
    """One served resource: where it lives in the REST tree and how it is scoped."""

    group: str
    """API group; ``""`` for the core group (``/api/v1``)."""
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = True
    """Whether ``.../{name}/status`` exists and main-resource writes keep status."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``plural.group`` as the API server names it in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


# What the driver talks to so far; one line per further kind.
DEFAULT_KINDS: tuple[ResourceKind, ...] = (
    ResourceKind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True),
    ResourceKind(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        namespaced=False,
        status_subresource=False,
    ),
    ResourceKind(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "DeviceClass",
        namespaced=False,
        status_subresource=False,
    ),
    ResourceKind("", "v1", "nodes", "Node", namespaced=False),
    ResourceKind("", "v1", "pods", "Pod", namespaced=True),
    ResourceKind("", "v1", "namespaces", "Namespace", namespaced=False),
    ResourceKind("", "v1", "events", "Event", namespaced=True, status_subresource=False),
    ResourceKind(
        "coordination.k8s.io", "v1", "leases", "Lease", namespaced=True, status_subresource=False
    ),
)


# --- Errors -------------------------------------------------------------------


def status_object(code: int, reason: str, message: str, details: JsonObj | None = None) -> JsonObj:
    """A ``v1 Status`` failure body, as the API server sends with error codes."""
    status: JsonObj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    return status


_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class FakeApiError(Exception):
    """An API failure; the HTTP layer sends it as a Status, the Python API raises it."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        kind: ResourceKind | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.message = message
        self.details: JsonObj = {}
        if kind is not None and name is not None:
            self.details = {"name": name, "group": kind.group, "kind": kind.plural}

    def status(self) -> JsonObj:
        return status_object(self.code, self.reason, self.message, self.details)


def not_found(kind: ResourceKind, name: str) -> FakeApiError:
    return FakeApiError(404, f'{kind.qualified} "{name}" not found', kind=kind, name=name)


def bad_request(message: str) -> FakeApiError:
    return FakeApiError(400, message)


def unknown_path() -> FakeApiError:
    # No details: this is how the API server says "no such API", not "no such object".
    return FakeApiError(404, "the server could not find the requested resource")
