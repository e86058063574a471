"""Which filesystem a path is on, read from ``/proc/self/mountinfo``.

Used to tell a memory filesystem (tmpfs, ramfs: the chart's ``/var/run/cdi``),
where a small write cannot block, from a disk, where it can (and where an
fsync takes milliseconds): the plugin writes CDI specs on a memory filesystem
from its event loop, sparing a thread hop per claim, and on a disk from a thread.
"""

from __future__ import annotations

import os

MOUNTINFO = "/proc/self/mountinfo"
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """``(mount point, filesystem type)`` of each line of a mountinfo file.

    A line is ``id parent major:minor root mountpoint options [optional...] -
    fstype source superoptions``; spaces in paths are written ``\\040``.
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if len(fields) <= dash + 1 or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        mounts.append((point, fields[dash + 1]))
    return mounts


def filesystem_of(path: str, mounts: list[tuple[str, str]]) -> str | None:
    """The type of the filesystem mounted deepest above ``path`` (absolute, resolved)."""
    best: tuple[int, str] | None = None
    for point, fstype in mounts:
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= best[0]):
            best = (len(point), fstype)
    return None if best is None else best[1]


def on_memory_filesystem(path: str, mountinfo: str = MOUNTINFO) -> bool:
    """Whether ``path`` (or, if it does not exist yet, its nearest existing parent)
    is on tmpfs or ramfs; False when that cannot be read."""
    here = os.path.realpath(path)
    while not os.path.exists(here) and here != os.path.dirname(here):
        here = os.path.dirname(here)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return False
    return filesystem_of(here, mounts) in MEMORY_FILESYSTEMS
