"""Stopping a child process the way the kubelet stops a pod: SIGTERM, then SIGKILL;
whether a process serves a unix socket; the machine's CPU time (the benchmarks)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any] | None, grace_s: float) -> int | None:
    """SIGTERM ``proc``, SIGKILL it if it still runs after ``grace_s``; its exit status
    (None: there was no process). One that already exited is only reaped."""
    if proc is None:
        return None
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def live_socket(path: str) -> bool:
    """Whether a process accepts connections on the unix socket ``path`` now (a file
    left behind by one that exited does not count)."""
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
        except OSError:
            return False
    return True


def machine_ticks() -> list[int]:
    """The machine's CPU time so far by kind, in clock ticks (``/proc/stat``'s
    ``cpu`` line: user, nice, system, idle, iowait, irq, softirq, steal; guest
    time is inside user)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]
