"""Where the agent puts each daemon's directories, short enough for unix sockets (pure).

A unix socket's address holds at most 107 bytes of path (``sun_path`` is 108
bytes with the terminating NUL; dra-facts 10.1), and the MPS v3 server binds
``<pipe dir>/<server>/<namespace>/control`` (docs:mpsv3-namespaces "Namespace
Routing"). With names taken as they come (a GPU UUID of 40 characters, a share
id of 36) the chart's state dir gave 127 bytes, so every name on that path is
short and of fixed length here:

* a GPU's directory is ``gpu-`` + 10 hex digits of the SHA-256 of its UUID
  (``mig-`` for a MIG instance's ``MIG-<uuid>``); the UUID is recorded in the
  directory (:data:`GPU_UUID_FILE`), which is how a reader maps one to the other
  and how a collision would be caught;
* a share's v3 namespace is ``s_`` + 12 hex digits: of the SHA-256 of its share id
  (:func:`dra_driver.mpsagent.commands.namespace_name`), or random for a spare
  namespace made ahead of the share that takes it (:func:`spare_namespace_name`);
  the agent's state file records each share's namespace and pipe directory.

So the longest socket path is the state dir plus :data:`LONGEST_SOCKET_SUFFIX`
bytes, whatever the UUIDs and share ids; :func:`check_state_dir` refuses a state
dir that leaves no room at start, and :func:`check_socket_path` guards each path
where it is made. Only ``control`` is a documented socket name; if the real
server binds longer names beside it (gpu-unverified), the 107-byte limit still
leaves them 50 bytes of room under the chart's state dir.

Earlier agents named a GPU's directory by its UUID (``<state dir>/GPU-...``);
:func:`is_old_gpu_dir` recognises those (see :mod:`.migrate`).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets

from dra_driver.base.errors import ConfigError

UNIX_PATH_MAX = 107
"""Bytes of path a unix socket address holds (``sun_path[108]`` less the NUL)."""

GPU_UUID_FILE = "gpu-uuid"
"""In a GPU's directory: the UUID of the GPU (or MIG instance) it belongs to."""

GPU_DIR_HEX = 10
NAMESPACE_HEX = 12
SERVER_NAME = "shares"
"""The one MPS v3 server of a GPU's daemon (lowercase, digits, '_', <= 64)."""
NAMESPACE_PREFIX = "s_"
"""Namespaces we create start with this, so ones we did not make are left alone."""
SOCKET_NAME = "control"

STATE_DIR_FLAG = "--state-dir (the chart's mpsAgent.stateDir)"

# A GPU's or MIG instance's UUID as earlier agents used it for a directory name.
_OLD_GPU_DIR = re.compile(r"^(GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]*$")


class SocketPathTooLong(ValueError):
    """A unix socket path over :data:`UNIX_PATH_MAX` bytes."""


class StateDirTooLong(ConfigError):
    """``--state-dir`` leaves the deepest MPS socket no room (``dra-driver`` exits 2)."""


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def is_mig_uuid(uuid: str) -> bool:
    """A MIG instance's UUID (``nvidia-smi -L``: ``MIG-<uuid>``), not a GPU's."""
    return uuid.startswith("MIG-")


def gpu_dir_name(gpu_uuid: str) -> str:
    """The fixed-length directory name of a GPU's (or MIG instance's) daemon."""
    kind = "mig" if is_mig_uuid(gpu_uuid) else "gpu"
    return f"{kind}-{_digest(gpu_uuid, GPU_DIR_HEX)}"


def namespace_name(share_id: str) -> str:
    """The fixed-length MPS v3 namespace of a share (names: [a-z0-9_]{1,64},
    docs:mpsv3-interface "CLI Command Structure")."""
    return NAMESPACE_PREFIX + _digest(share_id, NAMESPACE_HEX)


SPARE_MARK = "p"
"""After the prefix of a spare namespace's name: not a hex digit, so no share's derived
name can ever be a spare's (the share would take over a namespace still spare)."""


def spare_namespace_name() -> str:
    """A new spare namespace's name: random, as long as a share's namespace's."""
    return NAMESPACE_PREFIX + SPARE_MARK + secrets.token_hex(NAMESPACE_HEX // 2)[1:]


_OUR_NAMESPACE = re.compile(
    rf"^{re.escape(NAMESPACE_PREFIX)}(?:[0-9a-f]{{{NAMESPACE_HEX}}}"
    rf"|{SPARE_MARK}[0-9a-f]{{{NAMESPACE_HEX - 1}}})$"
)


def is_short_namespace(name: str) -> bool:
    """``name`` is one of ours in this layout (a share's, derived or spare), so a
    recorded share keeps it; an earlier layout's name is derived again."""
    return _OUR_NAMESPACE.match(name) is not None


LONGEST_SOCKET_SUFFIX = len(
    f"/{gpu_dir_name('GPU-x')}/pipe/{SERVER_NAME}/{namespace_name('x')}/{SOCKET_NAME}"
)
"""What the deepest socket adds to the state dir: a namespace's ``control``."""

MAX_STATE_DIR_BYTES = UNIX_PATH_MAX - LONGEST_SOCKET_SUFFIX


def check_socket_path(path: str) -> str:
    """``path``, or :class:`SocketPathTooLong` naming it, its length and the limit."""
    size = len(os.fsencode(path))
    if size > UNIX_PATH_MAX:
        raise SocketPathTooLong(
            f"unix socket path {path} is {size} bytes; a unix socket address holds at most "
            f"{UNIX_PATH_MAX} (AF_UNIX path too long); choose a shorter {STATE_DIR_FLAG}"
        )
    return path


def check_state_dir(state_dir: str) -> None:
    """Refuse a state dir too long for the deepest socket under it (at start)."""
    size = len(os.fsencode(state_dir.rstrip("/")))
    if size > MAX_STATE_DIR_BYTES:
        raise StateDirTooLong(
            f"the MPS state dir {state_dir} is {size} bytes; MPS sockets under it need "
            f"{LONGEST_SOCKET_SUFFIX} more and a unix socket address holds at most "
            f"{UNIX_PATH_MAX}, so it may be at most {MAX_STATE_DIR_BYTES} bytes: set "
            f"{STATE_DIR_FLAG} to a shorter path (the default is /run/fractional-gpu-dra/mps)"
        )


def is_old_gpu_dir(name: str) -> bool:
    """A GPU directory named by its UUID, as agents before the short layout made."""
    return bool(_OLD_GPU_DIR.match(name))
