"""``dra-driver gpu-check`` end to end on the fakes: the fake NVML under the real
NVML backend, the packaged fake ``nvidia-cuda-mps-control`` as a real process,
a fake CUDA client (``tests/support/fake_cuda_client.py``) and, for the compute
mode on a GPU in MIG mode, a small fake ``nvidia-smi`` written by the test.

The fake control tool finds no daemon through a namespace's directory (it keeps
its state beside the daemon's own ``control`` socket), so on it the ``tenant``
step finds a tenant that can do nothing; a wrapper that sends a tenant's
commands to the daemon's directory stands in for a daemon that lets tenants do
everything, which the step must report as a security finding."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

from dra_driver.app.gpu_check import (
    CHECK_SHARE_ID,
    CheckConfig,
    Outcome,
    Ran,
    Transcript,
    judge_client,
    pick_mig,
    run_check,
    run_command,
)
from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.gpu.nvml import NvmlGpuBackend
from dra_driver.mpsagent.layout import namespace_name
from tests.support import fake_cuda_client
from tests.support.fake_pynvml import FakeNvml, default_gpus

GIB = 1 << 30
NAMESPACE = namespace_name(CHECK_SHARE_ID)


@pytest.fixture
def tmp_path() -> Iterator[pathlib.Path]:
    """A short directory in place of pytest's: the fake MPS daemon binds real unix
    sockets there, as the real one does, and pytest's path is too long for them."""
    root = tempfile.mkdtemp(prefix="gc-", dir="/tmp")
    yield pathlib.Path(root)
    shutil.rmtree(root, ignore_errors=True)


USER_UNSHARE = ("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private")


def private_mount() -> tuple[str, ...]:
    """``unshare`` as a user without privileges can run it (a user namespace); where
    the kernel allows none, a stand-in that runs the client as it is (the mount of
    a fresh /dev/shm is then not tried: never on the test machine's own)."""
    probe = subprocess.run([*USER_UNSHARE, "--", "true"], capture_output=True, check=False)
    if probe.returncode == 0:
        return USER_UNSHARE
    skip_mount = "import os,sys; a=sys.argv[sys.argv.index('--')+5:]; os.execvp(a[0], a)"
    return (sys.executable, "-c", skip_mount)


def fake_smi(tmp_path: pathlib.Path) -> str:
    """An ``nvidia-smi`` for compute modes: a GPU's ``-c EXCLUSIVE_PROCESS`` is
    refused as NVIDIA/DCGM#82 shows it on a GPU in MIG mode (exit 0, "Not
    Supported"); a MIG device's is kept (NVML: with MIG on, compute mode is a MIG
    device's). Modes are files in the script's directory."""
    smi = tmp_path / "smi" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"""#!{sys.executable}
import pathlib, sys
args = sys.argv[1:]
uuid = args[args.index("-i") + 1]
state = pathlib.Path(__file__).with_name(uuid)
if "-c" in args:
    mode = args[args.index("-c") + 1]
    if uuid.startswith("GPU-") and mode == "EXCLUSIVE_PROCESS":
        print("Setting compute mode to EXCLUSIVE_PROCESS is not supported on a MIG-enabled device.")
        print("Unable to set the compute mode for GPU 00000000:31:00.0: Not Supported")
        print("Treating as warning and moving on.")
        print("All done.")
        sys.exit(0)
    state.write_text(mode)
    print("Compute mode set to " + mode + " for GPU " + uuid + ".")
else:
    print(state.read_text().title() if state.exists() else "Default")
""")
    smi.chmod(0o755)
    return str(smi)


def config(tmp_path: pathlib.Path, client: str = fake_cuda_client.__file__) -> CheckConfig:
    env = {**os.environ, "PYTHON": sys.executable, "FAKE_MPS_CONTROL": fake_control_path()}
    return CheckConfig(
        control=fake_control_path(),
        client=(sys.executable, client),
        memory_limit_bytes=GIB,
        step_timeout_s=20,
        work_dir=str(tmp_path),
        cgroup_root=str(tmp_path / "no-cgroup"),
        base_env=env,
        unshare=private_mount(),
    )


def checked(nvml: FakeNvml, cfg: CheckConfig) -> Transcript:
    async def go() -> Transcript:
        backend = NvmlGpuBackend(nvml, poll_ms=50)
        try:
            return await run_check(backend, cfg, Transcript(emit=lambda _line: None))
        finally:
            await backend.close()

    return asyncio.run(go())


def test_the_check_on_an_mps_v3_driver(tmp_path: pathlib.Path) -> None:
    nvml = FakeNvml(driver_version="615.71.09")
    work = tmp_path / "work"
    work.mkdir()
    cfg = dataclasses.replace(config(work), nvidia_smi=fake_smi(tmp_path))
    transcript = checked(nvml, cfg)
    text = "\n".join(transcript.lines)
    assert transcript.outcomes == {
        "discover": Outcome.PASS,
        "mig-compute-mode": Outcome.PASS,
        "mig": Outcome.PASS,
        "control-help": Outcome.PASS,
        "mps": Outcome.PASS,
        "client": Outcome.PASS,
        "client-own-shm": Outcome.PASS,
        "tenant": Outcome.PASS,
        "dmem": Outcome.SKIP,
    }, text
    assert not transcript.failed
    # Each command is in the transcript as it was run, with its output.
    control = fake_control_path()
    for shown in (
        f"$ {control} -f -p 3 -m",
        f"$ {control} server create shares",
        f"$ {control} namespace create {NAMESPACE} --server=shares",
        f"$ {control} namespace set {NAMESPACE} --server=shares --pinned-memory-limit=1024M "
        "--active-thread-percentage=50",
        f"$ {control} -q",
    ):
        assert shown in text
    assert "protocol v3 (driver 615.71.09)" in text
    assert "CUDA_MPS_PIPE_DIRECTORY=" in text and f"/pipe/shares/{NAMESPACE}" in text
    # MIG: the smallest profile at the first placement the existing 3g.40gb leaves free.
    assert "GPU-instance profile 19 (1g.10gb) at placement 4+1" in text
    assert "-- mig: PASS: created, listed, destroyed, gone" in text
    assert "-- dmem: SKIP" in text
    # The control tool's flags, before any daemon.
    assert f"$ {control} -h" in text and f"$ {control} -p 3 -h" in text
    # The client with a /dev/shm of its own, in a mount namespace of its own.
    assert "== client-own-shm" in text and "mount -t tmpfs" in text
    # The tenant: only its namespace's directory; the fake answers it nothing.
    assert f"as a tenant: CUDA_MPS_PIPE_DIRECTORY={work}/" in text
    assert f"/pipe/shares/{NAMESPACE} (only its namespace)" in text
    for action in ("list the daemon's servers", "set another namespace's limits",
                   "quit the daemon"):  # fmt: skip
        assert f"tenant cannot {action}" in text
    assert "SECURITY" not in text
    # Compute mode in MIG mode: the GPU refuses (exit 0 all the same), the MIG device
    # takes it and is put back.
    assert "the GPU in MIG mode: refused (mode DEFAULT -> DEFAULT" in text
    assert "its MIG device: accepted (mode DEFAULT -> EXCLUSIVE_PROCESS" in text
    mig_state = [p for p in (tmp_path / "smi").iterdir() if p.name.startswith("MIG-")]
    assert [p.read_text() for p in mig_state] == ["DEFAULT"]
    # Nothing is left behind: the MIG device is gone, the daemon's directory too.
    assert len(nvml.gpus[0].mig_devices) == len(default_gpus()[0].mig_devices)
    assert list(work.iterdir()) == []


def test_a_daemon_that_obeys_a_tenant_is_a_security_finding_and_still_undone(
    tmp_path: pathlib.Path,
) -> None:
    """A control tool that sends a namespace directory's commands to the daemon (as
    a daemon that let tenants do anything would): the tenant lists, sets the other
    namespace and quits the daemon; the check says so in a SECURITY banner, fails,
    starts the daemon again for its own stop, and leaves nothing behind."""
    leaky = tmp_path / "leaky-control"
    leaky.write_text(
        "#!/bin/sh\n"
        'case "$CUDA_MPS_PIPE_DIRECTORY" in */shares/s_*) '
        'CUDA_MPS_PIPE_DIRECTORY="${CUDA_MPS_PIPE_DIRECTORY%/shares/*}";; esac\n'
        f'exec {shlex.quote(fake_control_path())} "$@"\n'
    )
    leaky.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    cfg = dataclasses.replace(config(work), control=str(leaky), mig=False)
    transcript = checked(FakeNvml(driver_version="615.71.09"), cfg)
    text = "\n".join(transcript.lines)
    assert transcript.outcomes["tenant"] is Outcome.FAIL, text
    assert transcript.failed
    assert text.count("!! SECURITY: a process that has only its own namespace's directory") == 3
    for action in ("list the daemon's servers", "list the server's namespaces",
                   "set another namespace's limits", "quit the daemon"):  # fmt: skip
        assert f"tenant CAN {action}" in text
    assert "(1073741824, 10.0) -> (2147483648, 100.0)" in text
    # Started again in a fresh pipe directory, set up, and stopped by the check.
    assert transcript.outcomes["restart"] is Outcome.PASS, text
    assert "stop" not in transcript.outcomes  # the stop itself worked
    assert text.rstrip().count("daemon exited with 0") == 1
    assert list(work.iterdir()) == []


def test_the_check_on_a_legacy_driver(tmp_path: pathlib.Path) -> None:
    transcript = checked(FakeNvml(driver_version="580.65.06"), config(tmp_path))
    text = "\n".join(transcript.lines)
    assert transcript.outcomes["mps"] is Outcome.PASS, text
    assert transcript.outcomes["client"] is Outcome.PASS, text
    assert "protocol legacy" in text
    assert "echo 'set_default_device_pinned_mem_limit" in text
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-" in text
    assert transcript.outcomes["tenant"] is Outcome.SKIP
    assert transcript.outcomes["client-own-shm"] is Outcome.SKIP


def test_a_client_that_is_not_limited_fails_the_check(tmp_path: pathlib.Path) -> None:
    """A client that can allocate past the limit (no MPS reached it): FAIL, not PASS."""
    unlimited = tmp_path / "unlimited.py"
    unlimited.write_text(
        "import json\nprint(json.dumps({'set_device': 0, 'below': 0, 'above': 0}))\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    transcript = checked(FakeNvml(driver_version="615.71.09"), config(work, str(unlimited)))
    assert transcript.outcomes["client"] is Outcome.FAIL
    assert transcript.failed
    assert "allocating above the 1073741824-byte limit worked" in "\n".join(transcript.lines)
    assert list(work.iterdir()) == []  # the daemon is stopped and cleaned up all the same


def test_a_missing_control_binary_fails_the_mps_step(tmp_path: pathlib.Path) -> None:
    cfg = CheckConfig(**{**config(tmp_path).__dict__, "control": str(tmp_path / "none")})
    transcript = checked(FakeNvml(driver_version="615.71.09"), cfg)
    assert transcript.outcomes["mps"] is Outcome.FAIL
    for step in ("client", "client-own-shm", "tenant"):
        assert transcript.outcomes[step] is Outcome.SKIP


def test_no_mig_mode_skips_the_mig_step_without_toggling(tmp_path: pathlib.Path) -> None:
    gpus = [g for g in default_gpus() if g.mig_mode != (1, 1)]
    transcript = checked(FakeNvml(gpus, driver_version="615.71.09"), config(tmp_path))
    assert transcript.outcomes["mig"] is Outcome.SKIP
    assert "-- mig: SKIP: no GPU is in MIG mode (the check never toggles MIG mode)" in (
        transcript.lines
    )
    assert pick_mig([]) == "no GPU is in MIG mode (the check never toggles MIG mode)"


@pytest.mark.parametrize(
    ("stdout", "outcome", "words"),
    [
        ('{"set_device": 0, "below": 0, "above": 2, "sms": 66}', Outcome.PASS, "SMs 66"),
        ('{"set_device": 0, "below": 0, "above": 0}', Outcome.FAIL, "above"),
        ('{"set_device": 0, "below": 2, "above": 2}', Outcome.FAIL, "below"),
        ('{"set_device": 0, "below": 0, "above": 999}', Outcome.FAIL, "not cudaError"),
        ('{"set_device": 100}', Outcome.FAIL, "cudaSetDevice(0) returned 100"),
        ('{"error": "no libcudart"}', Outcome.FAIL, "no libcudart"),
        ("", Outcome.FAIL, "printed no result"),
    ],
)
def test_judging_the_client(stdout: str, outcome: Outcome, words: str) -> None:
    got, why = judge_client(stdout, GIB)
    assert got is outcome
    assert words in why


def test_a_command_past_its_timeout_is_reported() -> None:
    ran = run_command(["sleep", "5"], dict(os.environ), None, 0.2)
    assert ran == Ran(("sleep", "5"), 124, "", "timed out after 0.2 s")


def test_a_work_dir_too_long_for_the_mps_sockets_fails_the_step_and_says_why(
    tmp_path: pathlib.Path,
) -> None:
    long_dir = tmp_path / ("d" * 60)
    long_dir.mkdir()
    cfg = config(tmp_path)
    cfg = dataclasses.replace(cfg, work_dir=str(long_dir))
    transcript = checked(FakeNvml(driver_version="615.71.09"), cfg)
    assert transcript.outcomes["mps"] is Outcome.FAIL
    text = "\n".join(transcript.lines)
    assert "is too long" in text and "pass a shorter --work-dir" in text
    assert list(long_dir.iterdir()) == []  # nothing made
