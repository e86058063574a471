"""The plugin <-> mps-agent wire format (pure).

One unix stream socket in the plugin directory; newline-delimited JSON, one
request line answered by one response line, any number per connection::

    -> {"v": 1, "op": "ensure_share", "args": {"gpu_uuid": ..., ...}}
    <- {"v": 1, "ok": true, "result": {...}}
    <- {"v": 1, "ok": false, "error": {"kind": "invalid_request", "message": "..."}}

Requests are parsed strictly (unknown keys, wrong types and out-of-range values
are refused with a message naming the field), because a plugin and an agent of
different releases may meet during an upgrade and a silently dropped field
would be a silently dropped limit. Results are parsed leniently (unknown keys
ignored) so an older plugin can read a newer agent's answers. ``v`` is bumped
on any incompatible change; an agent answers a request of another version with
an ``unsupported_version`` error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

PROTOCOL_VERSION = 1
MAX_LINE_BYTES = 64 * 1024

MpsProtocol = Literal["v3", "legacy"]

ErrorKind = Literal[
    "invalid_request",  # malformed or out of range: fix the caller
    "unsupported_version",
    "conflict",  # the share exists with other parameters, or another UID (legacy)
    "daemon_failed",  # the control daemon could not be started or refused a command
    "internal",
]

# GPU UUIDs (GPU-…, MIG-…) become directory names: letters, digits, '-' only.
_GPU_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")
# share ids and claim UIDs are Kubernetes UIDs in practice; allow what a name could hold.
_IDENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# A Kubernetes namespace name: a DNS label (RFC 1123), at most 63 characters.
_K8S_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ProtocolError(ValueError):
    """A line is not a valid message; ``kind`` is the error kind to answer with."""

    def __init__(self, message: str, kind: ErrorKind = "invalid_request") -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


@dataclass(frozen=True)
class EnsureShare:
    """Make sure the GPU's daemon runs and this share's limits are in force (idempotent)."""

    gpu_uuid: str
    share_id: str
    claim_uid: str
    memory_limit_bytes: int
    active_thread_percentage: int
    uid: int | None = None
    """The containers' UID where known; legacy MPS serves one UID at a time."""
    tenant: str | None = None
    """The claim's Kubernetes namespace: a legacy daemon serves one tenant's shares
    unless ``cooperative``."""
    cooperative: bool = False
    """The GPU's node setting ``tenancy: cooperative``: a legacy daemon may serve
    claims of several namespaces."""


@dataclass(frozen=True)
class ReleaseShare:
    """Drop the share; the GPU's daemon stops after its last share (unknown share: no-op)."""

    gpu_uuid: str
    share_id: str


@dataclass(frozen=True)
class ListShares:
    pass


@dataclass(frozen=True)
class StatusRequest:
    pass


Request = EnsureShare | ReleaseShare | ListShares | StatusRequest

_OPS: dict[str, type[Request]] = {
    "ensure_share": EnsureShare,
    "release_share": ReleaseShare,
    "list_shares": ListShares,
    "status": StatusRequest,
}
_OP_OF = {cls: op for op, cls in _OPS.items()}


@dataclass(frozen=True)
class ShareInfo:
    """A live share as the agent holds it, with what its containers need."""

    gpu_uuid: str
    share_id: str
    claim_uid: str
    memory_limit_bytes: int
    active_thread_percentage: int
    uid: int | None
    protocol: MpsProtocol
    namespace: str | None
    """The MPS v3 namespace holding the limits; None under legacy MPS."""
    pipe_dir: str
    """Host directory to mount as the container's pipe directory."""
    shm_dir: str
    """Host directory to mount at the container's ``/dev/shm`` (legacy MPS)."""
    tenant: str | None = None
    """The claim's Kubernetes namespace, as the plugin gave it (None: not given, e.g.
    a share recorded by an older agent)."""


@dataclass(frozen=True)
class DaemonStatus:
    gpu_uuid: str
    pid: int | None
    running: bool
    restarts: int
    shares: int
    server_uid: int | None = None
    """Legacy MPS, while a client waits: the UID its running server serves."""
    waiting_uids: tuple[int, ...] = ()
    """Legacy MPS: UIDs of clients waiting until that server exits (one UID at a time)."""
    namespaces_deleting: int = 0
    """MPS v3: namespaces of released shares whose delete has not succeeded yet."""
    namespace_delete_failures: int = 0
    """MPS v3: failed tries at those deletes since the agent started (each is retried)."""
    spare_namespaces: int = 0
    """MPS v3: namespaces the daemon holds made ahead of the shares that will take them."""
    spare_namespace_failures: int = 0
    """MPS v3: spare namespaces the daemon refused to make since the agent started."""


@dataclass(frozen=True)
class AgentStatus:
    version: int
    protocol: MpsProtocol
    daemons: tuple[DaemonStatus, ...]


# -- requests -------------------------------------------------------------------------


_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
"""Made once: ``json.dumps`` with any option makes a new encoder on every call."""


def encode_request(request: Request) -> bytes:
    # Optional fields at their defaults stay off the wire (an agent reads them absent).
    args = {
        k: v
        for k, v in request.__dict__.items()
        if not (k in ("uid", "tenant") and v is None) and not (k == "cooperative" and v is False)
    }
    doc = {"v": PROTOCOL_VERSION, "op": _OP_OF[type(request)], "args": args}
    return (_COMPACT_JSON.encode(doc) + "\n").encode()


def _load_object(line: bytes | str, what: str) -> dict[str, Any]:
    if len(line) > MAX_LINE_BYTES:
        raise ProtocolError(f"{what} longer than {MAX_LINE_BYTES} bytes")
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"{what} is not JSON: {err}") from err
    if not isinstance(doc, dict):
        raise ProtocolError(f"{what} must be a JSON object, got {type(doc).__name__}")
    return doc


def _check_keys(doc: dict[str, Any], required: set[str], optional: set[str], where: str) -> None:
    unknown = sorted(set(doc) - required - optional)
    if unknown:
        allowed = ", ".join(sorted(required | optional)) or "none"
        raise ProtocolError(f"{where}: unknown field(s) {unknown}; allowed: {allowed}")
    missing = sorted(required - set(doc))
    if missing:
        raise ProtocolError(f"{where}: missing field(s) {missing}")


def _int(doc: dict[str, Any], key: str, low: int, high: int | None = None) -> int:
    value = doc[key]
    # bool is an int in Python; refuse it, JSON true is not a number.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"{key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ProtocolError(f"{key} must be {bound}, got {value}")
    return value


def _str(doc: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = doc[key]
    if not isinstance(value, str) or not pattern.match(value):
        raise ProtocolError(f"{key} must match {pattern.pattern}, got {value!r}")
    return value


def parse_request(line: bytes | str) -> Request:
    """One request line to its typed request; :class:`ProtocolError` says what is wrong."""
    doc = _load_object(line, "request")
    _check_keys(doc, {"v", "op"}, {"args"}, "request")
    version = doc["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"request version {version!r} is not supported; this agent speaks version "
            f"{PROTOCOL_VERSION} (are the plugin and the mps-agent from different releases?)",
            kind="unsupported_version",
        )
    op = doc["op"]
    if op not in _OPS:
        raise ProtocolError(f"unknown op {op!r}; known ops: {', '.join(sorted(_OPS))}")
    args = doc.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError("args must be a JSON object")
    where = f"{op} args"
    if op == "ensure_share":
        _check_keys(
            args,
            {"gpu_uuid", "share_id", "claim_uid", "memory_limit_bytes", "active_thread_percentage"},
            {"uid", "tenant", "cooperative"},
            where,
        )
        uid = args.get("uid")
        cooperative = args.get("cooperative", False)
        if not isinstance(cooperative, bool):
            raise ProtocolError(f"cooperative must be true or false, got {cooperative!r}")
        return EnsureShare(
            gpu_uuid=_str(args, "gpu_uuid", _GPU_UUID),
            share_id=_str(args, "share_id", _IDENT),
            claim_uid=_str(args, "claim_uid", _IDENT),
            memory_limit_bytes=_int(args, "memory_limit_bytes", 1 << 20),
            active_thread_percentage=_int(args, "active_thread_percentage", 1, 100),
            uid=None if uid is None else _int(args, "uid", 0, 2**32 - 1),
            tenant=None if args.get("tenant") is None else _str(args, "tenant", _K8S_NAMESPACE),
            cooperative=cooperative,
        )
    if op == "release_share":
        _check_keys(args, {"gpu_uuid", "share_id"}, set(), where)
        return ReleaseShare(
            gpu_uuid=_str(args, "gpu_uuid", _GPU_UUID), share_id=_str(args, "share_id", _IDENT)
        )
    _check_keys(args, set(), set(), where)
    return ListShares() if op == "list_shares" else StatusRequest()


# -- responses ------------------------------------------------------------------------


def encode_result(result: dict[str, Any]) -> bytes:
    return (json.dumps({"v": PROTOCOL_VERSION, "ok": True, "result": result}) + "\n").encode()


def encode_error(kind: ErrorKind, message: str) -> bytes:
    doc = {"v": PROTOCOL_VERSION, "ok": False, "error": {"kind": kind, "message": message}}
    return (json.dumps(doc) + "\n").encode()


@dataclass(frozen=True)
class ErrorReply:
    kind: str
    message: str


def parse_response(line: bytes | str) -> dict[str, Any] | ErrorReply:
    """A response line: the result object, or the agent's error."""
    doc = _load_object(line, "response")
    if doc.get("ok") is True and isinstance(doc.get("result"), dict):
        result: dict[str, Any] = doc["result"]
        return result
    err = doc.get("error")
    if doc.get("ok") is False and isinstance(err, dict):
        return ErrorReply(kind=str(err.get("kind", "internal")), message=str(err.get("message")))
    raise ProtocolError(f"malformed response: {str(line)[:200]}")


def share_to_json(share: ShareInfo) -> dict[str, Any]:
    return dict(share.__dict__)


def share_from_json(doc: dict[str, Any]) -> ShareInfo:
    """Lenient: ignores keys it does not know (a newer agent may add some)."""
    try:
        protocol = doc["protocol"]
        if protocol not in ("v3", "legacy"):
            raise ProtocolError(f"unknown MPS protocol {protocol!r}")
        uid = doc.get("uid")
        namespace = doc.get("namespace")
        tenant = doc.get("tenant")
        return ShareInfo(
            gpu_uuid=str(doc["gpu_uuid"]),
            share_id=str(doc["share_id"]),
            claim_uid=str(doc["claim_uid"]),
            memory_limit_bytes=int(doc["memory_limit_bytes"]),
            active_thread_percentage=int(doc["active_thread_percentage"]),
            uid=None if uid is None else int(uid),
            protocol=protocol,
            namespace=None if namespace is None else str(namespace),
            pipe_dir=str(doc["pipe_dir"]),
            shm_dir=str(doc["shm_dir"]),
            tenant=None if tenant is None else str(tenant),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"malformed share: {err}") from err


def status_to_json(status: AgentStatus) -> dict[str, Any]:
    return {
        "version": status.version,
        "protocol": status.protocol,
        "daemons": [dict(d.__dict__) for d in status.daemons],
    }


def status_from_json(doc: dict[str, Any]) -> AgentStatus:
    try:
        protocol = doc["protocol"]
        if protocol not in ("v3", "legacy"):
            raise ProtocolError(f"unknown MPS protocol {protocol!r}")
        daemons = tuple(
            DaemonStatus(
                gpu_uuid=str(d["gpu_uuid"]),
                pid=None if d.get("pid") is None else int(d["pid"]),
                running=bool(d["running"]),
                restarts=int(d["restarts"]),
                shares=int(d["shares"]),
                # Absent from an older agent's answer.
                server_uid=None if d.get("server_uid") is None else int(d["server_uid"]),
                waiting_uids=tuple(int(u) for u in d.get("waiting_uids", ())),
                namespaces_deleting=int(d.get("namespaces_deleting", 0)),
                namespace_delete_failures=int(d.get("namespace_delete_failures", 0)),
                spare_namespaces=int(d.get("spare_namespaces", 0)),
                spare_namespace_failures=int(d.get("spare_namespace_failures", 0)),
            )
            for d in doc["daemons"]
        )
        return AgentStatus(version=int(doc["version"]), protocol=protocol, daemons=daemons)
    except (KeyError, TypeError, ValueError) as err:
        raise ProtocolError(f"malformed status: {err}") from err
