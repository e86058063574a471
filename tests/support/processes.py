"""Stopping a child process the way the kubelet stops a pod: SIGTERM, then SIGKILL;
whether a process serves a unix socket; a free loopback port; the machine's CPU time
(the benchmarks)."""

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a child's server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def machine_ticks() -> list[int]:
    """The machine's CPU time so far by kind, in clock ticks (``/proc/stat``'s
    ``cpu`` line: user, nice, system, idle, iowait, irq, softirq, steal; guest
    time is inside user)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def _stat_ticks(pid: int) -> list[int] | None:
    """``/proc/PID/stat``'s utime, stime, cutime and cstime (clock ticks); None once
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return [int(x) for x in fields[11:15]]


def cpu_s(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of ``pid`` (and, with ``children``, of its live
    children and of those it reaped)."""
    ticks = _stat_ticks(pid)
    if ticks is None:
        return 0.0
    own = ticks[0] + ticks[1]
    if not children:
        return own / os.sysconf("SC_CLK_TCK")
    reaped = ticks[2] + ticks[3]
    live = sum(cpu_s(kid, children=True) for kid in live_children(pid))
    return (own + reaped) / os.sysconf("SC_CLK_TCK") + live


def reaped_cpu_s(pid: int) -> float:
    """CPU seconds of the children ``pid`` has waited for (cutime + cstime)."""
    ticks = _stat_ticks(pid)
    return 0.0 if ticks is None else (ticks[2] + ticks[3]) / os.sysconf("SC_CLK_TCK")


def live_children(pid: int) -> list[int]:
    """``pid``'s children now (none once it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(k) for k in f.read().split()]
    except OSError:
        return []
