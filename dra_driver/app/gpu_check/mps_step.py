"""gpu-check's ``control-help``, ``mps``, ``client``, ``client-own-shm`` and ``stop``
steps (I/O): the control tool's help, an MPS control daemon as the mps-agent starts
it, in a temporary pipe directory, one share's limits sent as the agent sends them
(:mod:`dra_driver.mpsagent.commands`), the CUDA client in that share (v3: also with
a /dev/shm of its own), the ``tenant`` step (:mod:`.tenant_step`), and the
daemon's stop."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dra_driver.app.gpu_check.config import CheckConfig
from dra_driver.app.gpu_check.decide import (
    CHECK_SHARE_ID,
    Outcome,
    client_env,
    client_sizes,
    judge_client,
)
from dra_driver.app.gpu_check.tenant_step import tenant_step
from dra_driver.app.gpu_check.transcript import Ran, Runner, Transcript
from dra_driver.core.model import GpuInfo
from dra_driver.mpsagent.commands import (
    ControlCall,
    ShareLimits,
    choose_protocol,
    daemon_args,
    daemon_env,
    legacy_client_env,
    probe_call,
    quit_call,
    render_legacy_apply,
    reply_error,
    v3_namespace_create,
    v3_namespace_dir,
    v3_namespace_list,
    v3_namespace_set,
    v3_server_create,
)
from dra_driver.mpsagent.layout import UNIX_PATH_MAX
from dra_driver.mpsagent.protocol import MpsProtocol

MOUNT_FRESH_SHM = 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"'
"""A new tmpfs on /dev/shm (in the mount namespace ``unshare`` made), then the client."""


@dataclass
class MpsRun:
    """One daemon's part of the check: its setup, the client in its share, its stop."""

    protocol: MpsProtocol
    gpu: GpuInfo
    limits: ShareLimits
    pipe: str
    env: Mapping[str, str]
    config: CheckConfig
    transcript: Transcript
    run: Runner
    start: Callable[..., subprocess.Popen[bytes]]
    logs: str
    daemon: subprocess.Popen[bytes] | None = None

    def start_daemon(self) -> str | None:
        """Start the daemon in the background; why not, if it cannot be started."""
        argv = (self.config.control, *daemon_args(self.protocol))
        self.transcript.say(
            f"$ {shlex.join(argv)}   (CUDA_VISIBLE_DEVICES={self.gpu.uuid}, "
            f"CUDA_MPS_PIPE_DIRECTORY={self.pipe}, in the background)"
        )
        try:
            with open(os.path.join(self.logs, "check-daemon.out"), "ab") as out:
                self.daemon = self.start(list(argv), env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)  # fmt: skip
        except OSError as err:
            return f"cannot start {self.config.control}: {err}"
        return None

    def control(self, call: ControlCall) -> Ran:
        argv = (self.config.control, *call.args)
        ran = self.run(argv, self.env, call.stdin, self.config.step_timeout_s)
        return ran

    def setup(self, step: str = "mps") -> bool:
        probe = probe_call(self.protocol)
        deadline = time.monotonic() + self.config.step_timeout_s
        ran = self.control(probe)
        while reply_error(ran.returncode, ran.stdout, ran.stderr) is not None:
            if time.monotonic() > deadline:
                self.transcript.command(ran)
                self.transcript.outcome(step, Outcome.FAIL, "the daemon did not answer")
                return False
            time.sleep(0.2)
            ran = self.control(probe)
        self.transcript.command(ran)
        if self.protocol == "v3":
            calls = [v3_server_create(), v3_namespace_create(self.limits.namespace),
                     v3_namespace_set(self.limits), v3_namespace_list()]  # fmt: skip
        else:
            calls = render_legacy_apply(self.gpu.uuid, [self.limits], server_pids=[])
        for call in calls:
            ran = self.control(call)
            self.transcript.command(ran)
            complaint = reply_error(ran.returncode, ran.stdout, ran.stderr)
            if complaint is not None:
                self.transcript.outcome(step, Outcome.FAIL, f"{call} refused: {complaint}")
                return False
        self.transcript.outcome(
            step, Outcome.PASS, f"daemon up, share limits set ({self.protocol})"
        )
        return True

    def client_env(self) -> dict[str, str]:
        """The environment a container of the share gets (``share_cdi_edits``)."""
        env = client_env(self.config.base_env, self.gpu)
        limits = self.limits
        if self.protocol == "v3":
            env["CUDA_MPS_PIPE_DIRECTORY"] = v3_namespace_dir(self.pipe, limits.namespace)
        else:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe
            caps = legacy_client_env(
                self.gpu.uuid, limits.memory_limit_bytes, limits.active_thread_percentage
            )
            for pair in caps:  # NAME=value, as a container gets them
                name, _, value = pair.partition("=")
                env[name] = value
        return env

    def client(self, step: str = "client", prefix: tuple[str, ...] = ()) -> None:
        """The CUDA client in the share; ``prefix``: what it runs under."""
        self.transcript.step(step)
        env = self.client_env()
        shown = {k: v for k, v in env.items() if k.startswith(("CUDA_MPS_", "CUDA_VISIBLE"))}
        self.transcript.say("env: " + " ".join(f"{k}={v}" for k, v in sorted(shown.items())))
        limit = self.limits.memory_limit_bytes
        below, above = client_sizes(limit)
        argv = (*prefix, *self.config.client, "--below", str(below), "--above", str(above))
        ran = self.run(argv, env, None, self.config.step_timeout_s)
        self.transcript.command(ran)
        self.transcript.outcome(step, *judge_client(ran.stdout, limit))

    # docs/nvidia-interfaces.md: check-own-shm, mps-daemon-shm
    def client_own_shm(self) -> None:
        """v3: the client with a fresh tmpfs on /dev/shm, not the daemon's: does a v3
        client need the daemon's shared memory? (docs/nvidia-interfaces.md
        ``cdi-mps-mounts``, ``mps-daemon-shm``: the Dynamo guide's verified v3
        container keeps its own /dev/shm.)"""
        shm = (*self.config.unshare, "--", "sh", "-c", MOUNT_FRESH_SHM, "own-shm")
        self.client("client-own-shm", shm)

    def stop(self) -> None:
        self.transcript.step("stop")
        self.transcript.command(self.control(quit_call(self.protocol)))
        daemon = self.daemon
        if daemon is None:
            return
        try:
            code = daemon.wait(timeout=self.config.step_timeout_s)
            self.transcript.say(f"daemon exited with {code}")
        except subprocess.TimeoutExpired:
            daemon.kill()  # our own child: its pid cannot have been reused
            daemon.wait()
            self.transcript.outcome("stop", Outcome.FAIL, "the daemon did not quit; killed")


def mps_steps(
    gpu: GpuInfo,
    config: CheckConfig,
    transcript: Transcript,
    run: Runner,
    start: Callable[..., subprocess.Popen[bytes]],
) -> None:
    transcript.step("mps")
    protocol = choose_protocol(config.protocol, gpu.driver_version)
    limits = ShareLimits(CHECK_SHARE_ID, config.memory_limit_bytes, config.active_thread_percentage)
    deepest = os.path.join(
        config.work_dir, "fgd-check-XXXXXXXX", "pipe", "shares", limits.namespace, "control"
    )
    if len(deepest.encode()) > UNIX_PATH_MAX:
        transcript.outcome(
            "mps",
            Outcome.FAIL,
            f"--work-dir {config.work_dir!r} is too long: the MPS server would bind {deepest!r} "
            f"({len(deepest.encode())} bytes; a unix socket path has at most {UNIX_PATH_MAX}); "
            "pass a shorter --work-dir",
        )
        return
    base = tempfile.mkdtemp(prefix="fgd-check-", dir=config.work_dir)
    pipe, logs = os.path.join(base, "pipe"), os.path.join(base, "log")
    os.makedirs(pipe)
    os.makedirs(logs)
    env = daemon_env(config.base_env, gpu.uuid, pipe, logs, protocol)
    mps = MpsRun(protocol, gpu, limits, pipe, env, config, transcript, run, start, logs)
    transcript.say(f"protocol {protocol} (driver {gpu.driver_version}); pipe directory {pipe}")
    control_help(mps)
    transcript.step("mps: the daemon")
    why = mps.start_daemon()
    if why is not None:
        transcript.outcome("mps", Outcome.FAIL, why)
        for name in ("client", "client-own-shm", "tenant"):
            transcript.outcome(name, Outcome.SKIP, "no MPS daemon")
        shutil.rmtree(base, ignore_errors=True)
        return
    try:
        if not mps.setup():
            for name in ("client", "client-own-shm", "tenant"):
                transcript.outcome(name, Outcome.SKIP, "the MPS setup failed")
        elif protocol == "v3":
            mps.client()
            mps.client_own_shm()
            tenant_step(mps, base)
        else:
            mps.client()
            legacy = "legacy MPS: a share's containers get the daemon's pipe directory and shm"
            transcript.outcome("client-own-shm", Outcome.SKIP, legacy)
            transcript.outcome("tenant", Outcome.SKIP, legacy)
    finally:
        mps.stop()
        _show_log(os.path.join(logs, "control.log"), transcript)
        shutil.rmtree(base, ignore_errors=True)


# docs/nvidia-interfaces.md: check-control-help, mps-legacy-multiuser
def control_help(mps: MpsRun) -> None:
    """``-h`` and ``-p 3 -h`` before any daemon runs: the flags this tool takes (the
    help is captured for the transcript; nothing is judged from it)."""
    mps.transcript.step("control-help")
    env = {k: v for k, v in mps.env.items() if k != "CUDA_MPS_PROTOCOL_VERSION"}
    printed = 0
    for args in (("-h",), ("-p", "3", "-h")):
        ran = mps.run((mps.config.control, *args), env, None, mps.config.step_timeout_s)
        mps.transcript.command(ran)
        printed += bool((ran.stdout + ran.stderr).strip())
    if printed:
        mps.transcript.outcome(
            "control-help", Outcome.PASS, f"{printed} of 2 printed something (above)"
        )
    else:
        mps.transcript.outcome("control-help", Outcome.SKIP, "neither printed anything")


def _show_log(path: str, transcript: Transcript) -> None:
    with contextlib.suppress(OSError), open(path) as f:
        transcript.say(f"{path}:")
        transcript.say("  " + f.read().strip().replace("\n", "\n  "))
