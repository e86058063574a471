"""``dra-driver gpu-check``: what this driver asks of NVIDIA, tried once on a real GPU.

Nothing of this project has run on a GPU, so every NVIDIA-facing action rests on
the docs (docs/nvidia-interfaces.md). This check makes each of those calls once,
with the real NVML and MPS binaries, and prints a transcript (each command, its
output, PASS/FAIL/SKIP) that can go into that document:

1. ``discover``: the NVML inventory the plugin publishes (GPUs, MIG mode, profiles);
2. ``mig``: where a GPU is already in MIG mode (it never toggles MIG mode), one MIG
   device of its smallest profile created at a free placement, seen in a new
   inventory, destroyed, and seen gone;
3. ``mps``: on a GPU without MIG, an MPS control daemon as the mps-agent starts it
   (v3 where the driver is 615 or newer, else legacy) in a temporary pipe
   directory, and one share's limits (a namespace with a memory and SM limit in
   v3; the daemon defaults and client caps in legacy), sent as the agent sends
   them (:mod:`dra_driver.mpsagent.commands`);
4. ``client``: a tiny CUDA client (:mod:`dra_driver.gpu.cuda_client`) in that
   share allocates below and above the memory limit: below must work, above fail;
5. ``dmem``: where the kernel has the dmem controller and a region for the GPU
   and the root cgroup already delegates ``+dmem``, a child cgroup with a hard
   limit (``nvidia-smi memory-limits`` where offered) and the client inside it.

It changes nothing it does not undo: the daemon is stopped and its directory
removed, the MIG device destroyed, the cgroup's limits reset and the cgroup
removed, whatever failed. Each command has a timeout (``step_timeout_s``).

What each step sends is in docs/nvidia-interfaces.md (rows ``nvml-*``,
``mps-*``, ``dmem-set-nvidia-smi``, ``cuda-client``, ``check-dmem-cgroup``), with
how to run the check and where its transcripts go.

The steps' decisions are pure (:func:`pick_mig`, :func:`pick_mps_gpu`,
:func:`client_sizes`, :func:`judge_client`); :func:`run_check` does the I/O
through an injected backend and command runner, so tests drive it with the
fake NVML, the packaged fake ``nvidia-cuda-mps-control`` and a fake client.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dra_driver.base.ids import GpuUUID
from dra_driver.core.model import GpuInfo, Inventory, MigPlacement, MigProfile
from dra_driver.core.ports import GpuBackend
from dra_driver.gpu.dmem import detect_dmem
from dra_driver.gpu.nvml import NvmlGpuBackend
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

GIB = 1 << 30
MIB = 1 << 20
CHECK_SHARE_ID = "gpucheck"
CUDA_SUCCESS = 0
CUDA_ERROR_MEMORY_ALLOCATION = 2


class Outcome(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Ran:
    """One command's result; ``returncode`` 124 when it ran past its timeout."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    stdin: str | None = None

    def shown(self) -> str:
        line = shlex.join(self.argv)
        return f"echo {shlex.quote(self.stdin.strip())} | {line}" if self.stdin else line


Runner = Callable[[Sequence[str], Mapping[str, str], "str | None", float], Ran]
"""``(argv, env, stdin, timeout_s) -> Ran``: the check's one way to run a command."""


def run_command(
    argv: Sequence[str], env: Mapping[str, str], stdin: str | None, timeout_s: float
) -> Ran:
    try:
        done = subprocess.run(
            list(argv), input=stdin, env=dict(env), capture_output=True, text=True,
            timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        return Ran(tuple(argv), 124, _text(expired.stdout), f"timed out after {timeout_s} s", stdin)
    except OSError as err:
        return Ran(tuple(argv), 127, "", f"cannot run: {err}", stdin)
    return Ran(tuple(argv), done.returncode, done.stdout, done.stderr, stdin)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


@dataclass
class Transcript:
    """The steps as they ran; each line is also emitted at once (a timeout keeps them)."""

    emit: Callable[[str], None] = print
    lines: list[str] = field(default_factory=list)
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def say(self, text: str) -> None:
        for line in text.rstrip("\n").splitlines() or [""]:
            self.lines.append(line)
            self.emit(line)

    def step(self, name: str) -> None:
        self.say(f"== {name}")

    def command(self, ran: Ran) -> None:
        self.say(f"$ {ran.shown()}")
        for stream in (ran.stdout, ran.stderr):
            if stream.strip():
                self.say("  " + stream.strip().replace("\n", "\n  "))
        self.say(f"  (exit status {ran.returncode})")

    def outcome(self, name: str, outcome: Outcome, why: str) -> Outcome:
        self.outcomes[name] = outcome
        self.say(f"-- {name}: {outcome.value}: {why}")
        return outcome

    @property
    def failed(self) -> bool:
        return Outcome.FAIL in self.outcomes.values()


@dataclass(frozen=True)
class CheckConfig:
    control: str = "nvidia-cuda-mps-control"
    client: tuple[str, ...] = ("python3", "-m", "dra_driver.gpu.cuda_client")
    """The CUDA client's argv; ``--below N --above M`` are appended."""
    protocol: str = "auto"
    memory_limit_bytes: int = GIB
    active_thread_percentage: int = 50
    step_timeout_s: float = 30.0
    work_dir: str = "/tmp"
    """Where the temporary pipe and log directories go (short: socket paths)."""
    cgroup_root: str = "/sys/fs/cgroup"
    nvidia_smi: str = "nvidia-smi"
    mig: bool = True
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


# -- pure decisions -------------------------------------------------------------------


@dataclass(frozen=True)
class MigChoice:
    gpu: GpuInfo
    profile: MigProfile
    placement: MigPlacement


def pick_mig(gpus: Sequence[GpuInfo]) -> MigChoice | str:
    """The first GPU in MIG mode, its smallest profile at a free placement; else why not."""
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return "no GPU is in MIG mode (the check never toggles MIG mode)"
    for gpu in enabled:
        taken = [d.placement for d in gpu.mig_devices]
        profiles = sorted(
            (p for p in gpu.mig_profiles if "+" not in p.name and p.placements),
            key=lambda p: (p.memory_slices, p.compute_slices, p.id),
        )
        for profile in profiles:
            for placement in profile.placements:
                if not any(placement.overlaps(t) for t in taken):
                    return MigChoice(gpu, profile, placement)
    return "every GPU in MIG mode is full: no free placement for any profile"


def pick_mps_gpu(gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """A GPU not in MIG mode (v3 namespaces are documented for such GPUs only)."""
    return next((g for g in gpus if not g.mig_enabled), None)


def client_sizes(limit_bytes: int) -> tuple[int, int]:
    """Below: half the limit (room for the client's own context); above: 1.5 times."""
    return limit_bytes // 2, limit_bytes + limit_bytes // 2


def judge_client(stdout: str, limit_bytes: int) -> tuple[Outcome, str]:
    """The client's JSON line: the allocation below must work, the one above fail."""
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else {"error": "it printed no result"}
    except ValueError:
        result = {"error": f"its result is not JSON: {lines[-1]!r}"}
    below, above = result.get("below"), result.get("above")
    checks = (
        ("error" in result, f"the client could not run: {result.get('error')}"),
        (
            result.get("set_device") != CUDA_SUCCESS,
            f"cudaSetDevice(0) returned {result.get('set_device')}",
        ),
        (
            below != CUDA_SUCCESS,
            f"allocating below the {limit_bytes}-byte limit failed ({below})",
        ),
        (
            above == CUDA_SUCCESS,
            f"allocating above the {limit_bytes}-byte limit worked",
        ),
        (
            above != CUDA_ERROR_MEMORY_ALLOCATION,
            f"above the limit: {above}, not cudaErrorMemoryAllocation (2)",
        ),
    )
    problem = next((why for wrong, why in checks if wrong), None)
    if problem is not None:
        return Outcome.FAIL, problem
    seen = f"SMs {result.get('sms')}, cudaMemGetInfo total {result.get('total')}"
    return Outcome.PASS, f"below worked, above failed with cudaErrorMemoryAllocation; {seen}"


def gpu_line(gpu: GpuInfo) -> str:
    mig = "MIG on" if gpu.mig_enabled else ("MIG capable, off" if gpu.mig_capable else "no MIG")
    return (
        f"GPU {gpu.index} {gpu.uuid} {gpu.product_name}, {gpu.memory_bytes // MIB} MiB, "
        f"PCI {gpu.pci_bus_id}, driver {gpu.driver_version}, CUDA {gpu.cuda_driver_version}, "
        f"{mig}, {len(gpu.mig_devices)} MIG device(s)"
    )


# -- the steps (I/O) ------------------------------------------------------------------


async def run_check(
    backend: GpuBackend,
    config: CheckConfig,
    transcript: Transcript,
    run: Runner = run_command,
    start: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
) -> Transcript:
    """Every step in turn; returns the transcript (``failed`` says whether one failed)."""
    transcript.step("discover")
    try:
        inventory = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
    except Exception as err:  # the check reports every failure, whatever its kind
        transcript.outcome("discover", Outcome.FAIL, f"NVML inventory failed: {err}")
        return transcript
    for gpu in inventory.gpus:
        transcript.say(gpu_line(gpu))
    if not inventory.gpus:
        transcript.outcome("discover", Outcome.FAIL, "NVML lists no GPU")
        return transcript
    transcript.outcome("discover", Outcome.PASS, f"{len(inventory.gpus)} GPU(s)")
    if config.mig:
        await _mig_step(backend, config, transcript)
    mps_gpu = pick_mps_gpu(inventory.gpus)
    if mps_gpu is None:
        for name in ("mps", "client", "dmem"):
            transcript.outcome(name, Outcome.SKIP, "every GPU is in MIG mode")
        return transcript
    _mps_steps(mps_gpu, config, transcript, run, start)
    _dmem_step(mps_gpu, config, transcript, run)
    return transcript


async def _mig_step(backend: GpuBackend, config: CheckConfig, transcript: Transcript) -> None:
    transcript.step("mig")
    before = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
    choice = pick_mig(before.gpus)
    if isinstance(choice, str):
        transcript.outcome("mig", Outcome.SKIP, choice)
        return
    gpu, profile = choice.gpu, choice.profile
    where = f"{choice.placement.start}+{choice.placement.size}"
    transcript.say(
        f"create: GPU {gpu.uuid}, GPU-instance profile {profile.id} ({profile.name}) at "
        f"placement {where}, compute instance over all of it"
    )
    try:
        made = await asyncio.wait_for(
            backend.create_mig_device(gpu.uuid, profile.id, choice.placement),
            config.step_timeout_s,
        )
    except Exception as err:  # reported, never raised: the check goes on
        transcript.outcome("mig", Outcome.FAIL, f"creating the MIG device failed: {err}")
        return
    transcript.say(f"made {made.uuid} (GI {made.gi_id}, CI {made.ci_id}, {made.memory_mib} MiB)")
    outcome, why = Outcome.PASS, "created, listed, destroyed, gone"
    try:
        listed = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
        if made.uuid not in _mig_uuids(listed, gpu.uuid):
            outcome, why = Outcome.FAIL, f"{made.uuid} is not in the next inventory"
    finally:
        try:
            await asyncio.wait_for(
                backend.destroy_mig_device(gpu.uuid, made.gi_id), config.step_timeout_s
            )
            transcript.say(f"destroyed GPU instance {made.gi_id}")
            after = await asyncio.wait_for(backend.inventory(), config.step_timeout_s)
            if made.uuid in _mig_uuids(after, gpu.uuid):
                outcome, why = Outcome.FAIL, f"{made.uuid} is still listed after destroy"
        except Exception as err:  # reported: the operator must clean up by hand
            outcome, why = Outcome.FAIL, f"destroying GPU instance {made.gi_id} failed: {err}"
    transcript.outcome("mig", outcome, why)


def _mig_uuids(inventory: Inventory, gpu_uuid: GpuUUID) -> set[str]:
    return {d.uuid for g in inventory.gpus if g.uuid == gpu_uuid for d in g.mig_devices}


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
        env = _client_env(self.config.base_env, self.gpu)
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


def _mps_steps(
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


def _client_env(base: Mapping[str, str], gpu: GpuInfo) -> dict[str, str]:
    """The client's environment: no MPS settings of ours leaking in, only its GPU."""
    env = {k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")}
    env["CUDA_VISIBLE_DEVICES"] = gpu.uuid
    return env


def _show_log(path: str, transcript: Transcript) -> None:
    with contextlib.suppress(OSError), open(path) as f:
        transcript.say(f"{path}:")
        transcript.say("  " + f.read().strip().replace("\n", "\n  "))


# docs/nvidia-interfaces.md: check-dmem-cgroup, dmem-set-nvidia-smi
def _dmem_step(gpu: GpuInfo, config: CheckConfig, transcript: Transcript, run: Runner) -> None:
    transcript.step("dmem")
    found = detect_dmem([gpu], config.cgroup_root)
    for note in found.notes:
        transcript.say(note)
    regions = found.regions.get(gpu.uuid)
    if not regions:
        transcript.outcome("dmem", Outcome.SKIP, "no dmem region for this GPU")
        return
    subtree = os.path.join(config.cgroup_root, "cgroup.subtree_control")
    try:
        with open(subtree) as f:
            delegated = "dmem" in f.read().split()
    except OSError as err:
        transcript.outcome("dmem", Outcome.SKIP, f"cannot read {subtree}: {err}")
        return
    if not delegated:
        transcript.outcome(
            "dmem", Outcome.SKIP, f"{subtree} has no dmem (the check does not change it)"
        )
        return
    cgroup = os.path.join(config.cgroup_root, f"fgd-gpu-check-{os.getpid()}")
    os.mkdir(cgroup)
    limit_mib = config.memory_limit_bytes // MIB
    smi = (config.nvidia_smi, "memory-limits", "-i", gpu.uuid, "-n", cgroup)
    try:
        ran = run((*smi, "--soft-limit", "0", "--hard-limit", str(limit_mib)), config.base_env,
                  None, config.step_timeout_s)  # fmt: skip
        transcript.command(ran)
        if ran.returncode != 0:
            transcript.outcome("dmem", Outcome.FAIL, "nvidia-smi memory-limits refused")
            return
        env = _client_env(config.base_env, gpu)
        below, above = client_sizes(config.memory_limit_bytes)
        into = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
        argv = ("sh", "-c", into, cgroup, *config.client, "--below", str(below),
                "--above", str(above))  # fmt: skip
        ran = run(argv, env, None, config.step_timeout_s)
        transcript.command(ran)
        outcome, why = judge_client(ran.stdout, config.memory_limit_bytes)
        transcript.outcome("dmem", outcome, why)
    finally:
        reset = run((*smi, "--soft-limit", "0", "--hard-limit", "max"), config.base_env, None,
                    config.step_timeout_s)  # fmt: skip
        transcript.command(reset)
        try:
            os.rmdir(cgroup)
        except OSError as err:
            transcript.say(f"could not remove {cgroup}: {err}; remove it by hand")


def check_gpus(config: CheckConfig) -> int:
    """The check on this node's GPUs through NVML; 1 when a step failed, else 0."""

    async def checked() -> Transcript:
        backend = NvmlGpuBackend()
        try:
            return await run_check(backend, config, Transcript())
        finally:
            await backend.close()

    transcript = asyncio.run(checked())
    failed = [name for name, o in transcript.outcomes.items() if o is Outcome.FAIL]
    transcript.say(f"== result: {'FAIL: ' + ', '.join(failed) if failed else 'PASS'}")
    return 1 if failed else 0
