"""Whether a process is running; stdlib only, so the fake control binary starts fast."""

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
