"""The files of one GPU's MPS daemon (I/O): its directories, the record of the
process an agent started, its pid file and control log.

Directories: ``<state dir>/<gpu dir>/{pipe,log,shm}``, the GPU's directory a short
fixed-length name derived from its UUID (:mod:`.layout`: every socket path fits a
unix socket address), with the UUID recorded in it.

The record (``<gpu dir>/daemon.json``: pid, start time, command line) is how an
agent knows the daemon it started again, and only it: a pid alone may come from
another PID namespace (the agent's previous container) and name an unrelated
process of this one (:mod:`.daemon` says when a pid counts).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from dra_driver.mpsagent.layout import (
    GPU_UUID_FILE,
    SOCKET_NAME,
    check_socket_path,
    gpu_dir_name,
)
from dra_driver.mpsagent.procs import identity
from dra_driver.state.files import atomic_write

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"
"""Written by the daemon into its pipe directory (dra-facts 10)."""
CONTROL_LOG = "control.log"
"""The control daemon's log in its log directory (docs:appendix-logging)."""
PREVIOUS_MODE_FILE = "compute-mode.previous"
"""The GPU's compute mode before its daemon first started (in the GPU's directory)."""
RECORD_FILE = "daemon.json"
"""In the GPU's directory: the daemon this agent started (pid, start time, command line)."""
SHM_MODE = 0o1777
"""Like /dev/shm: clients of any UID create their shared memory there."""
LOG_TAIL_BYTES = 1 << 20


class DaemonError(RuntimeError):
    """The daemon could not be started, or refused or failed a command."""


@dataclass(frozen=True)
class DaemonDirs:
    gpu_uuid: str
    root: str
    pipe: str
    log: str
    shm: str

    @classmethod
    def for_gpu(cls, state_dir: str, gpu_uuid: str) -> DaemonDirs:
        """The short layout (:mod:`.layout`); raises :class:`SocketPathTooLong` when
        the daemon's control socket would not fit."""
        root = os.path.join(state_dir, gpu_dir_name(gpu_uuid))
        dirs = cls(
            gpu_uuid=gpu_uuid,
            root=root,
            pipe=os.path.join(root, "pipe"),
            log=os.path.join(root, "log"),
            shm=os.path.join(root, "shm"),
        )
        check_socket_path(dirs.control)
        return dirs

    def create(self) -> None:
        """Make the directories and record whose they are; DaemonError if they are
        another GPU's (two UUIDs with the same short name)."""
        os.makedirs(self.root, mode=0o755, exist_ok=True)
        owner = os.path.join(self.root, GPU_UUID_FILE)
        try:
            with open(owner) as f:
                recorded = f.read().strip()
        except FileNotFoundError:
            atomic_write(owner, f"{self.gpu_uuid}\n".encode(), fsync=False)
            recorded = self.gpu_uuid
        if recorded != self.gpu_uuid:
            raise DaemonError(
                f"{self.root} belongs to {recorded} ({owner}), not to {self.gpu_uuid}: two "
                "UUIDs with the same short directory name; remove the directory of the one "
                "no longer on this node"
            )
        for path in (self.pipe, self.log, self.shm):
            os.makedirs(path, mode=0o755, exist_ok=True)
        os.chmod(self.shm, SHM_MODE)

    @property
    def control(self) -> str:
        """The daemon's control socket (docs:mpsv3-namespaces "Namespace Routing")."""
        return os.path.join(self.pipe, SOCKET_NAME)

    @property
    def pid_file(self) -> str:
        return os.path.join(self.pipe, PID_FILE)

    @property
    def control_log(self) -> str:
        return os.path.join(self.log, CONTROL_LOG)

    @property
    def previous_mode(self) -> str:
        return os.path.join(self.root, PREVIOUS_MODE_FILE)

    @property
    def record(self) -> str:
        return os.path.join(self.root, RECORD_FILE)


@dataclass(frozen=True)
class DaemonRecord:
    """The daemon an agent started: enough to know the process again, and only it."""

    pid: int
    start_time: int
    cmdline: tuple[str, ...]

    def matches_live_process(self) -> bool:
        return identity(self.pid) == (self.start_time, self.cmdline)

    @classmethod
    def of(cls, pid: int) -> DaemonRecord | None:
        found = identity(pid)
        return None if found is None else cls(pid, found[0], found[1])

    @classmethod
    def load(cls, path: str) -> DaemonRecord | None:
        try:
            with open(path) as f:
                doc = json.load(f)
            return cls(int(doc["pid"]), int(doc["start_time"]), tuple(map(str, doc["cmdline"])))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("ignoring the unreadable MPS daemon record %s: %s", path, err)
            return None

    def save(self, path: str) -> None:
        doc = {"pid": self.pid, "start_time": self.start_time, "cmdline": list(self.cmdline)}
        atomic_write(path, json.dumps(doc).encode(), fsync=False)


def read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def read_tail(path: str, size: int = LOG_TAIL_BYTES) -> str:
    """The last ``size`` bytes of a log (it grows for the daemon's whole life)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
