"""Whether a process is running, and which process a pid is (stdlib only)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (dead, not yet reaped) is not running."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:  # reaped between the two looks
        return False
    except (OSError, IndexError):
        return True


def identity(pid: int) -> tuple[int, tuple[str, ...]] | None:
    """``pid``'s start time (clock ticks after boot, ``/proc/<pid>/stat`` field 22) and
    command line; None if no such process. The two together tell a process from a
    later one that reuses its pid, or from one of another PID namespace that had
    the same number."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, IndexError):
        return None
    try:
        started = int(after_name[19])  # field 22; fields 1-2 are before the split
    except (IndexError, ValueError):
        return None
    return started, tuple(a.decode(errors="replace") for a in argv if a)
