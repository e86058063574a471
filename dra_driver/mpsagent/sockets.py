"""Unix sockets in MPS pipe directories: does one answer, which are stale (stdlib only,
so the fake control binary, which uses them too, starts fast).

A daemon is alive when its control socket accepts a connection: that is how
NVIDIA's own clients find it ("When CUDA is first initialized in a program, the
CUDA driver attempts to connect to the MPS control daemon. If the connection
attempt fails, the program continues to run as it normally would without MPS",
nvidia-cuda-mps-control(1)). A pid is no such proof: one written in another PID
namespace (an earlier agent's container) may name any process of this one.
"""

from __future__ import annotations

import os
import socket
import stat

PROBE_TIMEOUT_S = 1.0


def answers(path: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when something listens on the unix socket ``path`` (a connection is
    accepted); False for a missing path, a socket nobody listens on (a dead
    process's leftover), something that is not a socket, or a path too long."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(timeout)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True


def is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def stale_sockets(root: str) -> list[str]:
    """The unix sockets under ``root`` that nobody listens on, deepest first."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if is_socket(path) and not answers(path):
                found.append(path)
    return sorted(found, key=lambda p: (-p.count("/"), p))
