"""Retiring the GPU directories of agents before the short layout (I/O).

Agents before :mod:`.layout` named a GPU's directory by its UUID
(``<state dir>/GPU-<uuid>/{pipe,log,shm}``), which under MPS v3 put namespace
sockets past the unix socket limit. A starting agent migrates each such
directory explicitly, once:

1. a daemon still answering on its ``pipe/control`` (an earlier agent that
   crashed, so it did not quit its daemons) is asked to ``quit``: the new agent
   serves the GPU from the new directory, and two daemons must not drive one
   GPU. Its clients lose their MPS connection, as they would in any agent
   upgrade (the chart rolls the agent only on delete, when a node has no MPS
   clients). The agent restores every recorded share at the new daemon.
2. the GPU's recorded compute mode (``compute-mode.previous``) moves to the new
   directory, so the mode the GPU had before MPS is still what is restored.
3. the directory is renamed ``retired-<uuid>``, not removed: running
   containers may still have its shm directory mounted. The state dir is a
   tmpfs, so a reboot removes it.

A directory whose daemon does not quit is left as it is, with an error logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Mapping

from dra_driver.mpsagent import commands as cmd
from dra_driver.mpsagent import sockets
from dra_driver.mpsagent.daemon_files import PREVIOUS_MODE_FILE, DaemonDirs
from dra_driver.mpsagent.layout import SOCKET_NAME, is_old_gpu_dir

log = logging.getLogger(__name__)

RETIRED_PREFIX = "retired-"
QUIT_WAIT_S = 10.0


async def _quit(control_binary: str, env: Mapping[str, str], control: str) -> bool:
    """Ask the daemon on ``control`` to quit (v3's ``-q``, then legacy's ``quit``: the
    old agent's protocol is not known); True once it no longer answers."""
    for call in (cmd.quit_call("v3"), cmd.quit_call("legacy")):
        try:
            proc = await asyncio.create_subprocess_exec(
                control_binary,
                *call.args,
                env=dict(env),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(proc.communicate((call.stdin or "").encode()), QUIT_WAIT_S)
        except (OSError, TimeoutError) as err:
            log.warning("`%s` for the daemon on %s failed: %s", call, control, err)
            continue
        loop = asyncio.get_running_loop()
        deadline = loop.time() + QUIT_WAIT_S
        while sockets.answers(control) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if not sockets.answers(control):
            return True
    return False


def _old_gpu_dirs(state_dir: str) -> list[str]:
    try:
        names = sorted(os.listdir(state_dir))
    except FileNotFoundError:
        return []
    return [n for n in names if is_old_gpu_dir(n) and os.path.isdir(os.path.join(state_dir, n))]


def _move(state_dir: str, gpu_uuid: str) -> str:
    """Steps 2 and 3 for one GPU; the retired directory's path."""
    old = os.path.join(state_dir, gpu_uuid)
    new = DaemonDirs.for_gpu(state_dir, gpu_uuid)
    new.create()
    previous = os.path.join(old, PREVIOUS_MODE_FILE)
    if os.path.exists(previous) and not os.path.exists(new.previous_mode):
        os.replace(previous, new.previous_mode)
    retired = os.path.join(state_dir, RETIRED_PREFIX + gpu_uuid)
    if os.path.lexists(retired):  # retired before, and made again by an old agent
        retired += f".{time.time_ns()}"
    with contextlib.suppress(FileNotFoundError):
        os.rename(old, retired)
    log.info("GPU %s: moved to %s (the old directory is now %s)", gpu_uuid, new.root, retired)
    return retired


async def retire_old_gpu_dirs(
    state_dir: str, control_binary: str, base_env: Mapping[str, str]
) -> list[str]:
    """Migrate every old-layout GPU directory under ``state_dir``; the UUIDs done."""
    done = []
    for name in await asyncio.to_thread(_old_gpu_dirs, state_dir):
        old = os.path.join(state_dir, name)
        pipe, logs = os.path.join(old, "pipe"), os.path.join(old, "log")
        control = os.path.join(pipe, SOCKET_NAME)
        if sockets.answers(control):
            env = cmd.daemon_env(base_env, name, pipe, logs, "legacy")
            if not await _quit(control_binary, env, control):
                log.error(
                    "the MPS daemon an earlier agent left on %s does not quit; its directory "
                    "%s stays and GPU %s may get a second daemon: stop it by hand",
                    control,
                    old,
                    name,
                )
                continue
            log.warning(
                "quit the MPS daemon an earlier agent left in %s (the old directory layout); "
                "GPU %s's shares are served from its new directory",
                old,
                name,
            )
        await asyncio.to_thread(_move, state_dir, name)
        done.append(name)
    return done
