"""gpu-check's ``tenant`` step (I/O): what a v3 share's container can do through its
namespace's ``control`` socket, tried on the check's own daemon.

A v3 share's container sees only ``<pipe>/<server>/<namespace>`` as its pipe
directory (``commands.share_cdi_edits``). What a control command sent through
that directory can do is not documented (docs/nvidia-interfaces.md
``mps-v3-tenant-control``). With a second namespace made by the check (its own
limits), a process whose ``CUDA_MPS_PIPE_DIRECTORY`` is the first namespace's
directory runs ``server list``, ``namespace list``, ``namespace set`` of the other
namespace, and ``-q``. Each answer is judged from the daemon's side
(:mod:`.decide`: ``judge_tenant_*``): the other namespace's limits read back with
the daemon's own pipe directory, the daemon process still running or not. A
daemon the tenant made quit is started again in a fresh pipe directory and the
share set up again, so the ``stop`` step still stops what the check made.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

from dra_driver.app.gpu_check.decide import (
    OTHER_PERCENTAGE,
    OTHER_SHARE_ID,
    Outcome,
    TenantFinding,
    judge_tenant,
    judge_tenant_listing,
    judge_tenant_quit,
    judge_tenant_set,
    tenant_env,
)
from dra_driver.mpsagent.commands import (
    SERVER_NAME,
    ShareLimits,
    daemon_env,
    quit_call,
    reply_error,
    v3_namespace_create,
    v3_namespace_dir,
    v3_namespace_list,
    v3_namespace_set,
    v3_server_list,
)
from dra_driver.mpsagent.listing import parse_v3_namespace_list

if TYPE_CHECKING:
    from dra_driver.app.gpu_check.mps_step import MpsRun

QUIT_WAIT_S = 2.0
"""How long the daemon may take to exit after the tenant's ``-q``."""

Limits = tuple[int | None, float | None]


# docs/nvidia-interfaces.md: check-tenant, mps-control-socket
def tenant_step(mps: MpsRun, base: str) -> None:
    """The ``tenant`` step; ``base``: the check's temporary directory."""
    transcript = mps.transcript
    transcript.step("tenant")
    other = ShareLimits(OTHER_SHARE_ID, mps.limits.memory_limit_bytes, OTHER_PERCENTAGE)
    for call in (v3_namespace_create(other.namespace), v3_namespace_set(other)):
        ran = mps.control(call)
        transcript.command(ran)
        complaint = reply_error(ran.returncode, ran.stdout, ran.stderr)
        if complaint is not None:
            transcript.outcome("tenant", Outcome.FAIL, f"{call} refused: {complaint}")
            return
    own_dir = v3_namespace_dir(mps.pipe, mps.limits.namespace)
    logs = os.path.join(base, "tenant-log")
    os.makedirs(logs, exist_ok=True)
    env = tenant_env(mps.config.base_env, mps.gpu, own_dir, logs)
    transcript.say(f"as a tenant: CUDA_MPS_PIPE_DIRECTORY={own_dir} (only its namespace)")

    def as_tenant(args: tuple[str, ...]) -> tuple[int, str]:
        ran = mps.run((mps.config.control, *args), env, None, mps.config.step_timeout_s)
        transcript.command(ran)
        return ran.returncode, ran.stdout

    findings: list[TenantFinding] = []
    code, out = as_tenant(v3_server_list().args)
    findings.append(judge_tenant_listing("list the daemon's servers", code, out, SERVER_NAME))
    code, out = as_tenant(v3_namespace_list().args)
    findings.append(
        judge_tenant_listing("list the server's namespaces", code, out, other.namespace)
    )
    wanted = ShareLimits(OTHER_SHARE_ID, 2 * mps.limits.memory_limit_bytes, 100)
    before = _limits_of(mps, other.namespace)
    code, _ = as_tenant(v3_namespace_set(wanted).args)
    after = _limits_of(mps, other.namespace)
    mib = wanted.memory_limit_bytes // (1 << 20) << 20  # as memory_limit_value rounds
    findings.append(judge_tenant_set(before, after, (mib, 100.0), code))
    code, _ = as_tenant(quit_call("v3").args)
    findings.append(judge_tenant_quit(code, _exited(mps.daemon)))
    outcome, lines = judge_tenant(findings)
    for line in lines:
        transcript.say(line)
    cannot = "; ".join(f"cannot {f.action}" for f in findings)
    transcript.outcome("tenant", outcome, lines[0] if outcome is Outcome.FAIL else cannot)
    if findings[-1].could:
        _restart(mps, base)


def _limits_of(mps: MpsRun, namespace: str) -> Limits | None:
    """The namespace's (memory bytes, SM %) as the daemon lists them to its owner."""
    ran = mps.control(v3_namespace_list())
    mps.transcript.command(ran)
    rows = [r for r in parse_v3_namespace_list(ran.stdout).rows if r.name == namespace]
    return (rows[0].pinned_memory_limit, rows[0].active_thread_percentage) if rows else None


def _exited(daemon: subprocess.Popen[bytes] | None) -> bool:
    if daemon is None:
        return True
    try:
        daemon.wait(timeout=QUIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _restart(mps: MpsRun, base: str) -> None:
    """The tenant stopped the daemon: start it again in a fresh pipe directory (what
    the dead daemon left is not reused) and set the share up again, so ``stop``
    stops a daemon the check made. The step ``restart`` says whether that worked."""
    mps.transcript.step("restart")
    mps.pipe = os.path.join(base, "p2")
    os.makedirs(mps.pipe, exist_ok=True)
    mps.env = daemon_env(mps.config.base_env, mps.gpu.uuid, mps.pipe, mps.logs, mps.protocol)
    why = mps.start_daemon()
    if why is not None:
        mps.transcript.outcome("restart", Outcome.FAIL, why)
        return
    mps.setup("restart")
