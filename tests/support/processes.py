"""Stopping a child process the way the kubelet stops a pod: SIGTERM, then SIGKILL."""

from __future__ import annotations

import signal
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
