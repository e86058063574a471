"""gpu-check's ``mps``, ``client`` and ``stop`` steps (I/O): an MPS control daemon as
the mps-agent starts it, in a temporary pipe directory, one share's limits sent as
the agent sends them (:mod:`dra_driver.mpsagent.commands`), the CUDA client in
that share, and the daemon's stop."""

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


@dataclass
class _MpsRun:
    """One daemon's part of the check: its setup, the client in its share, its stop."""

    protocol: MpsProtocol
    gpu: GpuInfo
    limits: ShareLimits
    pipe: str
    env: Mapping[str, str]
    config: CheckConfig
    transcript: Transcript
    run: Runner

    def control(self, call: ControlCall) -> Ran:
        argv = (self.config.control, *call.args)
        ran = self.run(argv, self.env, call.stdin, self.config.step_timeout_s)
        return ran

    def setup(self) -> bool:
        probe = probe_call(self.protocol)
        deadline = time.monotonic() + self.config.step_timeout_s
        ran = self.control(probe)
        while reply_error(ran.returncode, ran.stdout, ran.stderr) is not None:
            if time.monotonic() > deadline:
                self.transcript.command(ran)
                self.transcript.outcome("mps", Outcome.FAIL, "the daemon did not answer")
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
                self.transcript.outcome("mps", Outcome.FAIL, f"{call} refused: {complaint}")
                return False
        self.transcript.outcome(
            "mps", Outcome.PASS, f"daemon up, share limits set ({self.protocol})"
        )
        return True

    def client(self) -> None:
        self.transcript.step("client")
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
        shown = {k: v for k, v in env.items() if k.startswith(("CUDA_MPS_", "CUDA_VISIBLE"))}
        self.transcript.say("env: " + " ".join(f"{k}={v}" for k, v in sorted(shown.items())))
        below, above = client_sizes(limits.memory_limit_bytes)
        argv = (*self.config.client, "--below", str(below), "--above", str(above))
        ran = self.run(argv, env, None, self.config.step_timeout_s)
        self.transcript.command(ran)
        self.transcript.outcome("client", *judge_client(ran.stdout, limits.memory_limit_bytes))

    def stop(self, daemon: subprocess.Popen[bytes]) -> None:
        self.transcript.step("stop")
        self.transcript.command(self.control(quit_call(self.protocol)))
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
    mps = _MpsRun(protocol, gpu, limits, pipe, env, config, transcript, run)
    transcript.say(f"protocol {protocol} (driver {gpu.driver_version}); pipe directory {pipe}")
    argv = (config.control, *daemon_args(protocol))
    transcript.say(f"$ {shlex.join(argv)}   (CUDA_VISIBLE_DEVICES={gpu.uuid}, in the background)")
    try:
        with open(os.path.join(logs, "check-daemon.out"), "wb") as out:
            daemon = start(list(argv), env=env, stdout=out, stderr=subprocess.STDOUT)
    except OSError as err:
        transcript.outcome("mps", Outcome.FAIL, f"cannot start {config.control}: {err}")
        transcript.outcome("client", Outcome.SKIP, "no MPS daemon")
        shutil.rmtree(base, ignore_errors=True)
        return
    try:
        if mps.setup():
            mps.client()
        else:
            transcript.outcome("client", Outcome.SKIP, "the MPS setup failed")
    finally:
        mps.stop(daemon)
        _show_log(os.path.join(logs, "control.log"), transcript)
        shutil.rmtree(base, ignore_errors=True)


def _show_log(path: str, transcript: Transcript) -> None:
    with contextlib.suppress(OSError), open(path) as f:
        transcript.say(f"{path}:")
        transcript.say("  " + f.read().strip().replace("\n", "\n  "))
