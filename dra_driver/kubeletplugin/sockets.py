"""Socket paths for the registration and DRA services.

Without a rolling-update UID the names are the conventional
``<registry dir>/<driver>-reg.sock`` and ``<plugin dir>/dra.sock``. With one
(the pod UID, from the downward API) every pod gets its own pair, so the old
and the new pod of a ``maxSurge`` update can both be registered; the kubelet
calls the newest connected one. A registration name that would not fit the
108-byte AF_UNIX limit falls back to a hash of the UID.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import stat
from dataclasses import dataclass

from dra_driver.base.errors import ConfigError

UNIX_PATH_MAX = 107
"""sun_path is 108 bytes including the terminating NUL."""


@dataclass(frozen=True)
class SocketPaths:
    registration: str
    dra: str


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _fits(path: str) -> bool:
    return len(os.fsencode(path)) <= UNIX_PATH_MAX


def socket_paths(
    driver_name: str, registry_dir: str, plugin_dir: str, rolling_update_uid: str | None = None
) -> SocketPaths:
    registry_dir = os.path.abspath(registry_dir)
    plugin_dir = os.path.abspath(plugin_dir)
    if not rolling_update_uid:
        reg = os.path.join(registry_dir, f"{driver_name}-reg.sock")
        dra = os.path.join(plugin_dir, "dra.sock")
    else:
        uid = rolling_update_uid
        short = _b64(hashlib.sha256(uid.encode()).digest()[:8])
        shortest = _b64(hashlib.sha256(driver_name.encode() + b"\0" + uid.encode()).digest()[:16])
        candidates = [
            f"{driver_name}-{uid}-reg.sock",
            f"{driver_name}-{short}-reg.sock",
            f"dra-{shortest}-reg.sock",
        ]
        reg = next(
            (
                os.path.join(registry_dir, c)
                for c in candidates
                if _fits(os.path.join(registry_dir, c))
            ),
            os.path.join(registry_dir, candidates[-1]),
        )
        dra = os.path.join(plugin_dir, f"dra-{uid}.sock")
    for what, path, flag in (
        ("registration", reg, "--registry-dir"),
        ("DRA", dra, "--plugin-dir"),
    ):
        if not _fits(path):
            raise ConfigError(
                f"{what} socket path {path} is {len(os.fsencode(path))} bytes, over the "
                f"{UNIX_PATH_MAX}-byte unix socket limit; use a shorter {flag}"
            )
    return SocketPaths(registration=reg, dra=dra)


def remove_stale_socket(path: str) -> bool:
    """Remove a socket file of ours left by a previous run; refuse to touch other files.

    A socket that still accepts connections belongs to a live plugin (a second
    instance started without ``--rolling-update-uid``): taking it over would cut
    that instance off from the kubelet, so that is an error instead.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise ConfigError(
            f"{path} exists and is not a socket; remove it or choose another directory"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        pass  # nobody listens: stale
    else:
        raise ConfigError(
            f"another process is serving on {path}; give each plugin instance its own "
            "sockets with --rolling-update-uid (the pod UID)"
        )
    finally:
        probe.close()
    os.unlink(path)
    return True
