"""The dmem hook: a POSIX ``sh`` script the container runtime runs on the host.

``dmem-hook.sh`` (in this package) is a CDI ``createContainer`` hook that sets a
container's device-memory limit in its cgroup v2 ``dmem`` controller (see the
script's header for what it does and why it is ``sh``: the host may have no
Python). The runtime runs it *on the host*, so the kubelet plugin copies it at
start into a host directory (``--hook-dir``, a hostPath at the same path in the
plugin's pod) and names that path in the claims' CDI specs.

:func:`install_hook` is that copy: atomic (a temp file in the same directory,
renamed over the target, so a runtime never executes a half-written script),
idempotent (an identical, executable file is left alone), mode 0755.
"""

from __future__ import annotations

import os
from importlib import resources

from dra_driver.state.files import atomic_write

__all__ = ["DEFAULT_HOOK_DIR", "HOOK_FILE", "HOOK_MODE", "hook_path", "hook_script", "install_hook"]

HOOK_FILE = "dmem-hook.sh"
DEFAULT_HOOK_DIR = "/var/lib/fractional-gpu-dra/hooks"
HOOK_MODE = 0o755


def hook_script() -> bytes:
    """The packaged script's bytes."""
    return resources.files(__name__).joinpath(HOOK_FILE).read_bytes()


def hook_path(hook_dir: str) -> str:
    return os.path.join(hook_dir, HOOK_FILE)


def install_hook(hook_dir: str) -> str:
    """Put the hook into ``hook_dir`` (created if missing); return its path.

    Returns without writing when the file there already has this release's
    bytes and mode 0755. Otherwise the new file is written beside it, fsynced,
    given mode 0755 explicitly (whatever the umask) and renamed over it; a
    runtime that is executing the old file keeps the old inode.
    """
    data = hook_script()
    target = hook_path(hook_dir)
    os.makedirs(hook_dir, mode=0o755, exist_ok=True)
    try:
        with open(target, "rb") as f:
            same = f.read() == data
        if same and os.stat(target).st_mode & 0o7777 == HOOK_MODE:
            return target
    except FileNotFoundError:
        pass
    atomic_write(target, data, mode=0o600, chmod=HOOK_MODE)
    return target
