"""Atomic file replacement.

Readers (the container runtime scanning the CDI dir, a second plugin process
reading the checkpoint) must never see a half-written file: we write a temp
file in the same directory under a name they ignore (leading dot, ``.tmp``
suffix, so neither ``*.json`` nor ``*.yaml`` matches), fsync it, and rename it
over the target. The rename is atomic within one filesystem.

The directory itself is not fsynced: that would only make the rename survive
an OS crash or power loss, and after one the node has a new boot id, so the
checkpoint and every CDI spec are discarded at start-up anyway. A killed
process loses nothing either way (the page cache outlives it).
"""

from __future__ import annotations

import contextlib
import os
import secrets


def temp_name_for(path: str) -> str:
    folder, base = os.path.split(path)
    return os.path.join(folder, f".{base}.{secrets.token_hex(4)}.tmp")


def atomic_write(
    path: str, data: bytes, mode: int = 0o644, fsync: bool = True, *, chmod: int | None = None
) -> None:
    """Replace ``path`` with ``data`` atomically; the data is fsynced first when asked.

    The file is created with ``mode`` less the umask; with ``chmod`` it gets
    exactly that mode instead (``os.fchmod`` before the rename, whatever the umask).
    """
    tmp = temp_name_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if chmod is not None:
                os.fchmod(fd, chmod)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_if_exists(path: str) -> bool:
    """Unlink ``path``; True if it existed."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
