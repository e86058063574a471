"""What we tell ``nvidia-cuda-mps-control``, and how we read its answers (pure).

Two protocols (dra-facts 10, 10.1):

* **MPS v3** (driver 615+, ``-p 3`` / ``CUDA_MPS_PROTOCOL_VERSION=3``): commands
  are ``module verb`` arguments on the command line. Per GPU: one daemon, one
  named server (:data:`SERVER_NAME`), one namespace per share holding the share's
  pinned memory limit and active thread percentage. A client picks its
  namespace by the socket it connects to, ``<pipe>/<server>/<namespace>/control``,
  so the container's pipe directory is that namespace directory and nothing else
  (mounted at its host path; the names on it are short, :mod:`.layout`).
  Multiuser mode (``-m``): clients of any UID share the server.
* **Legacy MPS** (protocol 2): commands are lines on stdin. Per GPU one control
  daemon; its defaults are the largest share's limits (a client's environment can
  only lower the daemon's value), and each share's caps go into its containers'
  environment. Cooperative, and one UID at a time.

The daemon of a MIG instance always speaks legacy MPS (:func:`daemon_protocol`):
v3 namespaces are documented for non-MIG GPUs only.

Provenance of every command form is marked where it is rendered:
``docs:<page>`` names the NVIDIA MPS documentation page (docs.nvidia.com/deploy/mps,
release 615/620) the form was taken from. **None of the forms has been run
against a real GPU yet** (``gpu-unverified``); the fake control executable
(:mod:`dra_driver.fakes.mps_control`) implements them as documented.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_driver.mpsagent import layout
from dra_driver.mpsagent.layout import SOCKET_NAME, check_socket_path, is_mig_uuid
from dra_driver.mpsagent.protocol import MpsProtocol, ShareInfo

# The names on a namespace's socket path are .layout's, which keeps that path short.
SERVER_NAME = layout.SERVER_NAME
NAMESPACE_PREFIX = layout.NAMESPACE_PREFIX
namespace_name = layout.namespace_name

CONTAINER_SHM_DIR = "/dev/shm"

MIB = 1 << 20
V3_MIN_DRIVER_MAJOR = 615


@dataclass(frozen=True)
class ControlCall:
    """One run of ``nvidia-cuda-mps-control``: arguments after the binary, and stdin."""

    args: tuple[str, ...] = ()
    stdin: str | None = None

    def __str__(self) -> str:
        return " ".join(self.args) if self.args else (self.stdin or "").strip()


@dataclass(frozen=True)
class ShareLimits:
    share_id: str
    memory_limit_bytes: int
    active_thread_percentage: int
    taken_namespace: str | None = None
    """The spare namespace the share took (the agent records it); None: the share's
    namespace is the one named after it."""

    @property
    def namespace(self) -> str:
        return self.taken_namespace or namespace_name(self.share_id)


@dataclass(frozen=True)
class Limits:
    """A namespace's limits alone: what a spare's were set to ahead of its share."""

    memory_limit_bytes: int
    active_thread_percentage: int

    @classmethod
    def of_share(cls, share: ShareLimits) -> Limits:
        return cls(share.memory_limit_bytes, share.active_thread_percentage)

    def of(self, namespace: str) -> ShareLimits:
        """These limits for ``namespace`` (a spare: no share holds it yet)."""
        return ShareLimits("", self.memory_limit_bytes, self.active_thread_percentage, namespace)


# -- choices --------------------------------------------------------------------------


def choose_protocol(setting: str, driver_version: str | None) -> MpsProtocol:
    """``v3``/``legacy`` as configured; ``auto``: v3 from driver release 615 on.

    ``auto`` without a known driver version picks legacy, which every driver speaks.
    """
    if setting in ("v3", "legacy"):
        return "v3" if setting == "v3" else "legacy"
    if setting != "auto":
        raise ValueError(f"MPS protocol {setting!r} is not one of v3, legacy, auto")
    if not driver_version:
        return "legacy"
    major = re.match(r"^\s*(\d+)", driver_version)
    return "v3" if major and int(major.group(1)) >= V3_MIN_DRIVER_MAJOR else "legacy"


def daemon_protocol(agent_protocol: MpsProtocol, daemon_uuid: str) -> MpsProtocol:
    """The protocol of the daemon for ``daemon_uuid`` (a GPU's, or a MIG instance's).

    A MIG instance's daemon speaks legacy MPS whatever the agent's protocol: MPS v3
    servers, namespaces and memory partitioning are documented for non-MIG GPUs
    only (NVIDIA Dynamo, "Per-GPU Compute and Memory Limits with MPS",
    Requirements: "MIG disabled" for both; docs:mpsv3-memory-partitioning: "MIG is
    explicitly unsupported"), while MPS itself runs inside a MIG instance (MIG
    user guide). No source says v3 namespaces work there (nor that they fail:
    gpu-unverified either way).
    """
    return "legacy" if is_mig_uuid(daemon_uuid) else agent_protocol


def legacy_device_key(daemon_uuid: str) -> str:
    """How legacy per-device limits name the daemon's one device.

    A GPU: its UUID ("The dev argument may be a device UUID string or an integer
    ordinal", docs:mpsv2-interface ``set_default_device_pinned_mem_limit``; for
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, "device ordinals and/or device UUIDs",
    docs:appendix-environment-variables, and Dynamo's verified ``GPU-<uuid>=2G``).
    A MIG instance: ordinal ``0``. Its daemon runs with
    ``CUDA_VISIBLE_DEVICES=MIG-<uuid>``, and the server remaps the visible
    devices, so its clients see that instance as device 0
    (docs:appendix-environment-variables ``CUDA_VISIBLE_DEVICES``). A MIG UUID
    as the key is documented nowhere, and a limit keyed by a device the server
    does not know is ignored (docs:mpsv2-interface), as a client drops every
    pinned limit when its list names a device it cannot see (Dynamo).
    gpu-unverified.
    """
    return "0" if is_mig_uuid(daemon_uuid) else daemon_uuid


def memory_limit_value(limit_bytes: int) -> str:
    """``<MiB>M``, rounded down so the limit never exceeds what was granted.

    Both protocols take an integer with a unit suffix (docs:mpsv2-interface
    ``set_default_device_pinned_mem_limit``: "G" or "M"; docs:mpsv3-interface:
    ``4G``, ``512M``, ``1024K``). Mebibytes are exact enough and valid for both.
    """
    mib = limit_bytes // MIB
    if mib < 1:
        raise ValueError(f"MPS memory limits are whole MiB; {limit_bytes} bytes is below 1 MiB")
    return f"{mib}M"


# -- the daemon -----------------------------------------------------------------------


def daemon_args(protocol: MpsProtocol) -> tuple[str, ...]:
    """Arguments that start the control daemon in the foreground.

    ``-f`` (docs:mpsv2-interface, docs:mpsv3-interface "Control Daemon Options"):
    the agent supervises the daemon as its own child (see :mod:`.daemon`).
    v3 adds ``-p 3`` and ``-m`` (multiuser). gpu-unverified.
    """
    return ("-f", "-p", "3", "-m") if protocol == "v3" else ("-f",)


def daemon_env(
    base: Mapping[str, str], gpu_uuid: str, pipe_dir: str, log_dir: str, protocol: MpsProtocol
) -> dict[str, str]:
    """The daemon's environment, also used for every command sent to it.

    Only its GPU is visible (``CUDA_VISIBLE_DEVICES=<uuid>``); pipe and log
    directories are its own (docs:appendix-environment-variables). For v3 the
    protocol is also selected by ``CUDA_MPS_PROTOCOL_VERSION=3``, which takes
    precedence over ``-p`` (docs:mpsv3-interface "Enabling MPS v3").
    """
    # Client-side caps or a protocol inherited from the agent's own env must not leak in.
    inherited = (
        "CUDA_MPS_PROTOCOL_VERSION",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    )
    env = {k: v for k, v in base.items() if k not in inherited}
    env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
    env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
    if protocol == "v3":
        env["CUDA_MPS_PROTOCOL_VERSION"] = "3"
    return env


def quit_call(protocol: MpsProtocol) -> ControlCall:
    """Stop the daemon and its servers.

    v3: ``-q`` (docs:mpsv3-interface, docs:quick-start); legacy: ``quit`` on stdin
    (docs:mpsv2-interface). gpu-unverified.
    """
    return ControlCall(args=("-q",)) if protocol == "v3" else ControlCall(stdin="quit\n")


def probe_call(protocol: MpsProtocol) -> ControlCall:
    """A harmless query that succeeds once the daemon answers (readiness)."""
    if protocol == "v3":
        # docs:mpsv3-interface "Server"; gpu-unverified.
        return ControlCall(args=("server", "list", "--format=csv,noheader"))
    return ControlCall(stdin="get_server_list\n")  # docs:mpsv2-interface; gpu-unverified.


# -- MPS v3 ---------------------------------------------------------------------------
# All forms: docs:mpsv3-interface ("Server", "Namespace"); gpu-unverified.


def v3_server_create(server: str = SERVER_NAME) -> ControlCall:
    # Multiuser mode allows only uid 0 and defaults to the connecting user (root,
    # the agent); --allowed-devices is left out: the daemon sees only its GPU.
    return ControlCall(args=("server", "create", server))


def v3_namespace_create(namespace: str, server: str = SERVER_NAME) -> ControlCall:
    return ControlCall(args=("namespace", "create", namespace, f"--server={server}"))


def v3_namespace_set(limits: ShareLimits, server: str = SERVER_NAME) -> ControlCall:
    return ControlCall(
        args=(
            "namespace",
            "set",
            limits.namespace,
            f"--server={server}",
            f"--pinned-memory-limit={memory_limit_value(limits.memory_limit_bytes)}",
            f"--active-thread-percentage={limits.active_thread_percentage}",
        )
    )


def v3_namespace_delete(namespace: str, server: str = SERVER_NAME) -> ControlCall:
    # --force: the claim is released, so any client left in it must go too.
    return ControlCall(args=("namespace", "delete", namespace, f"--server={server}", "--force"))


def v3_namespace_list(server: str = SERVER_NAME) -> ControlCall:
    return ControlCall(args=("namespace", "list", f"--server={server}", "--format=csv,noheader"))


def v3_server_list() -> ControlCall:
    return ControlCall(args=("server", "list", "--format=csv,noheader"))


def render_v3_apply(limits: ShareLimits, namespace_exists: bool) -> list[ControlCall]:
    """Create the share's namespace if missing, then (re)set its limits (a spare
    namespace the share took exists already: only its limits are set)."""
    calls = [] if namespace_exists else [v3_namespace_create(limits.namespace)]
    return [*calls, v3_namespace_set(limits)]


def render_v3_restore(
    shares: Iterable[ShareLimits], present: Iterable[str], server_exists: bool
) -> list[ControlCall]:
    """Bring a daemon (fresh after a restart, or adopted) to exactly ``shares``.

    Our namespaces that no share holds any more are deleted; namespaces without
    our prefix are left alone.
    """
    present_set = set(present)
    wanted = {s.namespace: s for s in shares}
    calls = [] if server_exists else [v3_server_create()]
    for name in sorted(wanted):
        calls += render_v3_apply(wanted[name], name in present_set)
    calls += [
        v3_namespace_delete(name)
        for name in sorted(present_set - set(wanted))
        if name.startswith(NAMESPACE_PREFIX)
    ]
    return calls


# -- legacy MPS -----------------------------------------------------------------------
# All forms: docs:mpsv2-interface (interactive commands on stdin); gpu-unverified.
# The device is named by :func:`legacy_device_key`: a GPU by UUID, as NVIDIA's DRA
# driver does; a MIG instance by ordinal 0 (the docs name no MIG UUID form).


def legacy_defaults(shares: Sequence[ShareLimits]) -> tuple[int, int]:
    """The daemon defaults: the largest share's memory and thread percentage."""
    return (
        max(s.memory_limit_bytes for s in shares),
        max(s.active_thread_percentage for s in shares),
    )


def render_legacy_apply(
    daemon_uuid: str, shares: Sequence[ShareLimits], server_pids: Sequence[int]
) -> list[ControlCall]:
    """Daemon defaults no larger than the largest share, for new and running servers.

    ``set_default_*`` only affects servers started afterwards, so a running
    server (``get_server_list``) gets the same values with the per-PID forms.
    No shares: nothing to set (the daemon is about to stop). ``daemon_uuid``: the
    GPU's or the MIG instance's the daemon runs for (:func:`legacy_device_key`).
    """
    if not shares:
        return []
    mem_bytes, pct = legacy_defaults(shares)
    mem = memory_limit_value(mem_bytes)
    dev = legacy_device_key(daemon_uuid)
    calls = [
        ControlCall(stdin=f"set_default_active_thread_percentage {pct}\n"),
        ControlCall(stdin=f"set_default_device_pinned_mem_limit {dev} {mem}\n"),
    ]
    for pid in server_pids:
        calls.append(ControlCall(stdin=f"set_active_thread_percentage {pid} {pct}\n"))
        calls.append(ControlCall(stdin=f"set_device_pinned_mem_limit {pid} {dev} {mem}\n"))
    return calls


def parse_legacy_server_list(stdout: str) -> list[int]:
    """``get_server_list``: server PIDs, one per line (docs:mpsv2-interface)."""
    return [int(tok) for tok in stdout.split() if tok.isdigit()]


# Control log lines (docs:appendix-logging "Control Log", and the same forms in public
# transcripts of real daemons, e.g. kubernetes-sigs/dra-driver-nvidia-gpu#1153):
#   [2013-08-05 12:50:23.347 Control 13894] Starting new server 13929 for user 500
#   [2013-08-05 12:50:24.870 Control 13894] NEW SERVER 13929: Ready
#   [2013-08-05 13:02:26.226 Control 13894] Server 13929 exited with status 0
#   [2013-08-05 13:02:10.866 Control 13894] NEW CLIENT 19276 from user 500: Server already exists
# The text after "NEW CLIENT <pid> from user <uid>:" varies and is not relied on; a
# client in another PID namespace is logged with PID 0. gpu-unverified here: this
# project has not run a legacy daemon with clients of two UIDs on a GPU yet.
_LOG_DAEMON_START = re.compile(r"Starting control daemon")
_LOG_SERVER_START = re.compile(r"Starting new server (\d+) for user (\d+)")
_LOG_SERVER_EXIT = re.compile(r"Server (\d+) exited")
_LOG_NEW_CLIENT = re.compile(r"NEW CLIENT (\d+) from user (\d+)")


@dataclass(frozen=True)
class UidWait:
    """Legacy MPS: clients of ``waiting_uids`` wait until the server of ``server_uid`` exits."""

    server_pid: int
    server_uid: int
    waiting_uids: tuple[int, ...]


def legacy_uid_wait(control_log: str, live_server_pids: Iterable[int]) -> UidWait | None:
    """Who waits on another UID's server, from the control log and ``get_server_list``.

    The legacy control daemon runs one server at a time, as the UID of the client
    that made it start it; a client of another UID is queued until that server's
    clients are all gone (docs:mpsv2-interface, nvidia-cuda-mps-control(1)). So: the
    live server's UID is the one its "Starting new server" line names, and a client
    whose "NEW CLIENT" line came after that, with another UID, waits. Only the lines
    since the daemon's last start count. None when nothing waits (or the log does
    not name the live server, e.g. when it was cut).
    """
    lines = control_log.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if _LOG_DAEMON_START.search(lines[i]):
            lines = lines[i + 1 :]
            break
    live = set(live_server_pids)
    # Every server of this daemon: pid -> [uid, start line, exit line (None: no exit)].
    servers: dict[int, list[int | None]] = {}
    clients: list[tuple[int, int]] = []  # (line index, uid)
    for index, line in enumerate(lines):
        if match := _LOG_SERVER_START.search(line):
            servers[int(match[1])] = [int(match[2]), index, None]
        elif (match := _LOG_SERVER_EXIT.search(line)) and int(match[1]) in servers:
            servers[int(match[1])][2] = index
        elif match := _LOG_NEW_CLIENT.search(line):
            clients.append((index, int(match[2])))
    running = [
        (start, pid, uid)
        for pid, (uid, start, exited) in servers.items()
        if pid in live and exited is None and uid is not None and start is not None
    ]
    if not running:
        return None
    _, pid, uid = max(running)

    def served(index: int, c_uid: int) -> bool:
        # By a server of its UID that was running when it came or started after it
        # (a queued client is served when the daemon switches to its UID).
        return any(
            s_uid == c_uid and (exited is None or exited > index)
            for s_uid, _, exited in servers.values()
        )

    # A client of another UID that no server of its UID served waits, however many
    # switches ago it queued: the daemon serves queued UIDs one after another.
    waiting = sorted({c_uid for index, c_uid in clients if not served(index, c_uid)})
    return UidWait(pid, uid, tuple(waiting)) if waiting else None


def describe_uid_wait(wait: UidWait) -> str:
    """The log line and status text: both UIDs and the fix."""
    uids = ", ".join(str(u) for u in wait.waiting_uids)
    return (
        f"legacy MPS serves one UID at a time: its server (pid {wait.server_pid}) runs as "
        f"UID {wait.server_uid}, and client(s) of UID {uids} wait until every client of UID "
        f"{wait.server_uid} has exited. Run the pods that share this GPU as one UID "
        "(securityContext.runAsUser), or use MPS v3 on a whole GPU (driver 615+, "
        "--mps-protocol=v3; a MIG instance's daemon is always legacy) or a MIG device"
    )


def legacy_client_env(daemon_uuid: str, memory_limit_bytes: int, pct: int) -> tuple[str, ...]:
    """Per-share caps for a legacy client (docs:appendix-environment-variables).

    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is ``<device>=<value>``, the device named
    by :func:`legacy_device_key`: a GPU by UUID, so that it does not depend on the
    container's ordinals (the appendix allows UUIDs; Dynamo verified
    ``GPU-<uuid>=2G``); a MIG instance by ordinal 0, the one device its daemon's
    clients see. gpu-unverified.
    """
    mem = memory_limit_value(memory_limit_bytes)
    return (
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={legacy_device_key(daemon_uuid)}={mem}",
        f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={pct}",
    )


# -- the daemon's /dev/shm -------------------------------------------------------------

UNSHARE_PRIVATE_MOUNT = ("unshare", "--mount", "--propagation", "private")
"""util-linux ``unshare``: a new mount namespace whose mounts do not propagate back."""

_BIND_SHM = 'mount --bind "$1" /dev/shm && shift && exec "$@"'


def in_private_shm(
    argv: Sequence[str], shm_dir: str, unshare: Sequence[str] = UNSHARE_PRIVATE_MOUNT
) -> list[str]:
    """``argv`` run in a private mount namespace with ``shm_dir`` bind-mounted on /dev/shm.

    Legacy MPS clients and servers are taken to share memory through ``/dev/shm``,
    which the MPS tools offer no way to relocate (unlike the pipe and log
    directories); a legacy share's containers get the GPU's shm directory at
    ``/dev/shm`` through CDI, so the daemon, and the servers it forks, must see that
    directory there too. ``unshare`` and ``sh``
    ``exec`` in turn, so the daemon keeps the PID the agent started. Needs
    CAP_SYS_ADMIN (``unshare`` adds ``--user --map-root-user`` in tests).
    """
    return [*unshare, "--", "sh", "-c", _BIND_SHM, "mps-shm", shm_dir, *argv]


# -- replies --------------------------------------------------------------------------


def reply_error(returncode: int, stdout: str, stderr: str) -> str | None:
    """The daemon's complaint, if the reply is one; None when the command worked.

    A non-zero exit status, or (legacy, where the interactive shell may exit 0) an
    answer line starting with "Error"/"Invalid"/"Unknown". The real tool's exact
    error texts are docs-unverified and gpu-unverified.
    """
    lines = [ln.strip() for ln in (stdout + "\n" + stderr).splitlines() if ln.strip()]
    bad = [ln for ln in lines if re.match(r"^(error|invalid|unknown|failed)", ln, re.I)]
    if returncode != 0:
        return "; ".join(bad or lines) or f"exit status {returncode}"
    return "; ".join(bad) or None


# -- containers -----------------------------------------------------------------------


def v3_namespace_dir(pipe_dir: str, namespace: str, server: str = SERVER_NAME) -> str:
    """The namespace's socket directory (docs:mpsv3-namespaces "Namespace Routing").

    Raises :class:`.layout.SocketPathTooLong` when the ``control`` socket the
    server binds there would not fit in a unix socket address.
    """
    directory = f"{pipe_dir.rstrip('/')}/{server}/{namespace}"
    check_socket_path(f"{directory}/{SOCKET_NAME}")
    return directory


@dataclass(frozen=True)
class MpsMount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rw", "nosuid", "nodev", "bind")


@dataclass(frozen=True)
class MpsContainerEdits:
    """What a container of the share needs, as plain data (the plugin maps it to CDI)."""

    env: tuple[str, ...]
    mounts: tuple[MpsMount, ...]


def share_cdi_edits(share: ShareInfo) -> MpsContainerEdits:
    """Env and mounts for a share's containers.

    Both protocols: the share's pipe directory mounted at its own host path, with
    ``CUDA_MPS_PIPE_DIRECTORY`` set to that path, as NVIDIA's Dynamo guide "Per-GPU
    Compute and Memory Limits with MPS" mounts it (any path the daemon or server
    names to a client then means the same inside the container). v3: the pipe
    directory is the share's namespace directory, so the limits are the daemon's
    and the container cannot reach another namespace; the container keeps its own
    ``/dev/shm``, as the guide's verified v3 container does (only the namespace
    directory is mounted there), so no claim's container sees another's POSIX shared
    memory (docs/nvidia-interfaces.md ``cdi-mps-mounts``: unverified on a GPU until
    ``dra-driver gpu-check`` runs a client so). Legacy: the GPU's whole pipe
    directory and the GPU's shm directory at ``/dev/shm`` (as NVIDIA's device plugin
    and DRA driver give legacy clients their daemon's shm), plus the share's caps in
    the environment (cooperative). A client has one ``CUDA_MPS_PIPE_DIRECTORY``
    (docs:appendix-environment-variables), so it reaches one daemon: one GPU's
    shares (the plugin refuses a request whose MPS shares are on two;
    :func:`dra_driver.core.prepare.mps_daemon_conflicts`).
    """
    env = [f"CUDA_MPS_PIPE_DIRECTORY={share.pipe_dir}"]
    mounts = [MpsMount(share.pipe_dir, share.pipe_dir)]
    if share.protocol == "legacy":
        env += legacy_client_env(
            share.gpu_uuid, share.memory_limit_bytes, share.active_thread_percentage
        )
        mounts.append(MpsMount(share.shm_dir, CONTAINER_SHM_DIR))
    return MpsContainerEdits(env=tuple(env), mounts=tuple(mounts))
