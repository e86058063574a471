"""``dmem-hook.sh`` run by ``sh`` against fake cgroup and proc trees, fed an OCI state.

The script is what a container runtime runs on the host as a createContainer
hook; these tests give it what a runtime would (argv, the state JSON on stdin)
and point it at a fake ``/sys/fs/cgroup`` and ``/proc`` through its
``DMEM_HOOK_CGROUP_ROOT`` / ``DMEM_HOOK_PROC_ROOT`` overrides.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from dra_driver.base.ids import PoolName
from dra_driver.core.allocation import claim_from_dict
from dra_driver.core.cdi import render_spec
from dra_driver.core.prepare import DmemHookSettings, NodeContext, plan_prepare
from dra_driver.core.settings import GpuSettings, NodeSettings, Sharing
from dra_driver.dmemhook import HOOK_FILE
from dra_driver.fakes.gpu import build_inventory, load_spec
from dra_driver.fakes.objects import resource_claim, share
from tests.support import fake_nvidia_smi

SCRIPT = pathlib.Path(__file__).parents[2] / "dra_driver" / "dmemhook" / HOOK_FILE
SH = shutil.which("sh")
pytestmark = pytest.mark.skipif(SH is None, reason="no sh on this machine")

REGION = "nvidia/0000:3b:00.0/vidmem"
OTHER_GPU = "nvidia/0000:86:00.0/vidmem"
PID = 4242
CGROUP = (
    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice"
    "/cri-containerd-abc.scope"
)
GIB = 1 << 30


@dataclass
class Host:
    root: pathlib.Path

    @property
    def cgroup(self) -> pathlib.Path:
        return self.root / "cgroup"

    @property
    def proc(self) -> pathlib.Path:
        return self.root / "proc"

    def container(self, path: str = CGROUP) -> pathlib.Path:
        return self.cgroup / path.lstrip("/")

    @property
    def bin(self) -> pathlib.Path:
        """Where a test puts an ``nvidia-smi``; first on the hook's PATH."""
        return self.root / "bin"

    def run(
        self, *args: str, state: dict[str, object] | None = None, path: bool = True
    ) -> subprocess.CompletedProcess[str]:
        assert SH is not None
        doc = {"ociVersion": "1.2.0", "id": "abc", "status": "creating", "pid": PID,
               "bundle": str(self.root / "bundle")} if state is None else state  # fmt: skip
        search = f"{self.bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        return subprocess.run(
            [SH, str(SCRIPT), *args],
            input=json.dumps(doc, indent=2),  # a runtime may print it on several lines
            capture_output=True,
            text=True,
            timeout=30,
            env={
                **({"PATH": search} if path else {}),
                "DMEM_HOOK_CGROUP_ROOT": str(self.cgroup),
                "DMEM_HOOK_PROC_ROOT": str(self.proc),
            },
            check=False,
        )


@pytest.fixture
def host(tmp_path: pathlib.Path) -> Host:
    """A cgroup v2 host with dmem, one NVIDIA region per GPU, and the container's cgroup."""
    made = Host(tmp_path)
    made.cgroup.mkdir()
    (made.cgroup / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids dmem\n")
    (made.cgroup / "dmem.capacity").write_text(f"{REGION} 150323855360\n{OTHER_GPU} 1024\n")
    container = made.container()
    container.mkdir(parents=True)
    for name in ("dmem.max", "dmem.min", "dmem.low"):
        (container / name).write_text("")
    (made.proc / str(PID)).mkdir(parents=True)
    (made.proc / str(PID) / "cgroup").write_text(f"0::{CGROUP}\n")
    return made


def test_sets_the_hard_limit(host: Host) -> None:
    done = host.run("--max", str(10 * GIB), "--", REGION)
    assert done.returncode == 0, done.stderr
    assert (host.container() / "dmem.max").read_text() == f"{REGION} {10 * GIB}\n"
    assert (host.container() / "dmem.min").read_text() == ""  # no soft limit asked
    # Without --gpu (a spec of an older plugin) the file write is the fallback, and says so.
    assert done.stderr.splitlines() == [
        "dmem-hook: container abc: not using nvidia-smi memory-limits, as NVIDIA's docs "
        "advise (the hook was given no --gpu): writing dmem.max directly, which raises "
        "no ancestor's dmem.min"
    ]


# -- nvidia-smi memory-limits, NVIDIA's documented way ---------------------------------

GPU_UUID = "GPU-5b3f2a6e-0000-4000-8000-00000000000a"


def with_ancestors(host: Host, reserved: dict[str, str]) -> list[pathlib.Path]:
    """dmem files on every ancestor of the container's cgroup below the root."""
    ancestors = list(host.container().relative_to(host.cgroup).parents)[:-1]
    made = []
    for relative in ancestors:
        directory = host.cgroup / relative
        (directory / "dmem.min").write_text("".join(f"{k} {v}\n" for k, v in reserved.items()))
        (directory / "dmem.max").write_text("")
        made.append(directory)
    return made


def test_sets_the_limits_through_nvidia_smi_where_it_offers_them(host: Host) -> None:
    """NVIDIA: set limits with nvidia-smi or NVML, never by writing dmem.* files."""
    fake_nvidia_smi.install(host.bin, {GPU_UUID: REGION})
    ancestors = with_ancestors(host, {REGION: str(2 * GIB)})
    done = host.run("--strict", "--gpu", GPU_UUID, "--max", str(10 * GIB),
                    "--min", str(6 * GIB), REGION)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert fake_nvidia_smi.calls(host.bin) == [
        ["memory-limits", "--help"],
        ["memory-limits", "-i", GPU_UUID, "-n", str(host.container()),
         "--soft-limit", str(6 * 1024), "--hard-limit", str(10 * 1024)],
    ]  # fmt: skip
    assert (host.container() / "dmem.max").read_text() == f"{REGION} {10 * GIB}\n"
    assert (host.container() / "dmem.min").read_text() == f"{REGION} {6 * GIB}\n"
    # The driver's propagation (the fake's): every ancestor reserves the leaf's share too.
    assert all((a / "dmem.min").read_text() == f"{REGION} {8 * GIB}\n" for a in ancestors)
    assert "not using nvidia-smi" not in done.stderr
    assert "where it stays after the container's cgroup is removed" in done.stderr


def test_nvidia_smi_gets_whole_mib_rounded_down_and_soft_zero_when_none_asked(host: Host) -> None:
    fake_nvidia_smi.install(host.bin, {GPU_UUID: REGION})
    done = host.run("--gpu", GPU_UUID, "--max", str(10**10), REGION)  # 10G: 9536.74 MiB
    assert done.returncode == 0, done.stderr
    assert fake_nvidia_smi.calls(host.bin)[-1][-4:] == ["--soft-limit", "0", "--hard-limit", "9536"]
    assert done.stderr == ""


def test_an_nvidia_smi_without_memory_limits_falls_back_to_the_files(host: Host) -> None:
    """A driver before 615: nvidia-smi does not know the subcommand."""
    host.bin.mkdir()
    old = host.bin / "nvidia-smi"
    old.write_text("#!/bin/sh\necho \"Option $1 is not recognized. Please run 'nvidia-smi -h'.\"\n"
                   "exit 2\n")  # fmt: skip
    old.chmod(0o755)
    log = host.root / "dmem-hook.log"
    done = host.run("--log", str(log), "--gpu", GPU_UUID, "--max", str(GIB), REGION)
    assert done.returncode == 0, done.stderr
    assert (host.container() / "dmem.max").read_text() == f"{REGION} {GIB}\n"
    assert "this nvidia-smi has no memory-limits subcommand" in done.stderr
    assert "Option memory-limits is not recognized" in done.stderr
    assert "writing dmem.max directly" in log.read_text()  # the fallback is logged


def test_a_failing_nvidia_smi_falls_back_and_names_the_command(host: Host) -> None:
    fake_nvidia_smi.install(host.bin, {"GPU-another": REGION})  # it does not know this GPU
    done = host.run("--strict", "--gpu", GPU_UUID, "--max", str(GIB), REGION)
    assert done.returncode == 0, done.stderr  # the fallback set the limit
    assert (host.container() / "dmem.max").read_text() == f"{REGION} {GIB}\n"
    assert f"nvidia-smi memory-limits -i {GPU_UUID} -n {host.container()}" in done.stderr
    assert f"failed: No GPU matches -i {GPU_UUID}" in done.stderr


def test_a_direct_dmem_min_write_warns_where_an_ancestor_reserves_less(host: Host) -> None:
    """The kernel honours a leaf's dmem.min only where every ancestor reserves as much."""
    with_ancestors(host, {REGION: str(8 * GIB)})
    (host.cgroup / "kubepods.slice" / "dmem.min").write_text(f"{REGION} {GIB}\n")
    done = host.run("--strict", "--max", str(10 * GIB), "--min", str(6 * GIB), REGION)
    assert done.returncode == 0, done.stderr  # a warning, not a failure
    assert (host.container() / "dmem.min").read_text() == f"{REGION} {6 * GIB}\n"
    assert (
        f"warning: dmem.min of {REGION} is {6 * GIB} bytes on {CGROUP}, but its ancestor "
        f"/kubepods.slice (dmem.min {GIB} bytes): the kernel honours" in done.stderr
    )


def test_a_direct_dmem_min_write_warns_at_a_gap_in_the_chain(host: Host) -> None:
    done = host.run("--max", str(10 * GIB), "--min", str(6 * GIB), REGION)  # no ancestor files
    assert done.returncode == 0, done.stderr
    parent = CGROUP.rsplit("/", 1)[0]
    assert f"but its ancestor {parent} (no dmem.min" in done.stderr


def test_no_warning_where_every_ancestor_reserves_enough(host: Host) -> None:
    with_ancestors(host, {REGION: str(8 * GIB)})
    (host.cgroup / "kubepods.slice" / "dmem.min").write_text(f"{REGION} max\n")
    done = host.run("--max", str(10 * GIB), "--min", str(6 * GIB), REGION)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["-i", "0", "memory-limits", "-n", "/x"], "Option memory-limits is not recognized"),
        (
            ["memory-limits", "-i", "0", "-n", "{cg}", "--soft-limit", "40G", "--hard-limit", "1"],
            "--soft-limit must be a non-negative MebiByte value",
        ),
        (
            ["memory-limits", "-i", "0", "-n", "{cg}", "--soft-limit=1", "--hard-limit", "1"],
            "Option --soft-limit=1 is not recognized",
        ),
        (["memory-limits", "-i", "0", "-n", "{cg}", "--hard-limit", "1"], "--soft-limit"),
        (
            ["memory-limits", "-i", "0", "-n", "{root}", "--soft-limit", "0", "--hard-limit", "1"],
            "Not Found",
        ),  # a cgroup without dmem files
        (
            ["memory-limits", "-i", "7", "-n", "{cg}", "--soft-limit", "0", "--hard-limit", "1"],
            "No GPU matches",
        ),
    ],
    ids=["subcommand-not-first", "unit-suffix", "equals-form", "one-limit", "no-dmem", "gpu"],
)
def test_the_fake_nvidia_smi_refuses_undocumented_forms(
    host: Host, argv: list[str], refusal: str
) -> None:
    launcher = fake_nvidia_smi.install(host.bin, {GPU_UUID: REGION})
    filled = [a.format(cg=host.container(), root=host.cgroup) for a in argv]
    done = subprocess.run([str(launcher), *filled], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    assert refusal in done.stderr
    ok = [str(launcher), "memory-limits", "--set", "--namespace", str(host.container()),
          "--soft-limit", "0", "--hard-limit", "max", "-i", "0"]  # fmt: skip
    assert subprocess.run(ok, capture_output=True, check=False).returncode == 0
    assert (host.container() / "dmem.max").read_text() == f"{REGION} max\n"


def test_runs_without_a_path_in_its_environment(host: Host) -> None:
    """runc gives a hook only the env the hook names; the CDI hook names none."""
    done = host.run("--strict", "--max", "7", REGION, path=False)
    assert done.returncode == 0, done.stderr
    assert (host.container() / "dmem.max").read_text() == f"{REGION} 7\n"


def test_sets_the_soft_limit_in_dmem_min(host: Host) -> None:
    done = host.run("--max", str(10 * GIB), "--min", str(6 * GIB), REGION)
    assert done.returncode == 0, done.stderr
    assert (host.container() / "dmem.max").read_text() == f"{REGION} {10 * GIB}\n"
    assert (host.container() / "dmem.min").read_text() == f"{REGION} {6 * GIB}\n"
    assert (host.container() / "dmem.low").read_text() == ""


def test_a_planned_spec_with_a_soft_limit_sets_dmem_min(host: Host) -> None:
    """The hook exactly as the plan writes it into the claim's CDI spec, run by sh."""
    inventory = build_inventory(load_spec("h100-80gb:1"), "node-a")
    (gpu,) = inventory.gpus
    mps = {"memoryLimit": "8Gi", "memorySoftLimit": "6Gi"}
    raw = resource_claim(
        "ns", "c", node="node-a", devices=[share("gpu-0", memory="10Gi")],
        configs=[{"apiVersion": "gpu.fractional.dev/v1alpha1", "kind": "GpuConfig", "mps": mps}],
    )  # fmt: skip
    context = NodeContext(
        driver_name="gpu.fractional.dev",
        node_name="node-a",
        pool_name=PoolName("node-a"),
        cdi_kind="k8s.gpu.fractional.dev/claim",
        settings=NodeSettings(default=GpuSettings(sharing=Sharing.MPS)),
        dmem=DmemHookSettings(hook_path=str(SCRIPT), regions={gpu.uuid: (REGION,)}),
    )
    spec = render_spec(plan_prepare(claim_from_dict(raw), inventory, context).cdi_spec)
    ((hook,),) = [d["containerEdits"]["hooks"] for d in spec["devices"]]
    assert hook["path"] == str(SCRIPT)
    argv0, *args = hook["args"]  # what the runtime passes: argv[0], then the arguments
    assert argv0 == HOOK_FILE
    done = host.run(*args)
    assert done.returncode == 0, done.stderr
    assert (host.container() / "dmem.max").read_text() == f"{REGION} {8 * GIB}\n"
    assert (host.container() / "dmem.min").read_text() == f"{REGION} {6 * GIB}\n"
    assert (host.container() / "dmem.low").read_text() == ""


def test_missing_region_is_named_with_what_the_node_has(host: Host) -> None:
    missing = "nvidia/0000:99:00.0/vidmem"
    done = host.run("--max", "1024", missing)
    assert done.returncode == 0  # not strict: the container starts
    assert f"dmem region {missing} is not registered" in done.stderr
    assert REGION in done.stderr  # what dmem.capacity does list
    assert "container abc" in done.stderr
    assert "starts without the kernel device-memory limit" in done.stderr
    assert (host.container() / "dmem.max").read_text() == ""

    strict = host.run("--strict", "--max", "1024", missing)
    assert strict.returncode == 1
    assert "not registered" in strict.stderr
    assert "starts without" not in strict.stderr


def test_a_missing_region_does_not_stop_the_others(host: Host) -> None:
    done = host.run("--strict", "--max", "2048", "nvidia/0000:99:00.0/vidmem", REGION)
    assert done.returncode == 1
    assert (host.container() / "dmem.max").read_text() == f"{REGION} 2048\n"


def test_cgroup_v1_host_is_told_plainly(host: Host) -> None:
    (host.cgroup / "cgroup.controllers").unlink()
    (host.proc / str(PID) / "cgroup").write_text(
        "12:memory:/kubepods/pod1/abc\n1:name=systemd:/kubepods/pod1/abc\n"
    )
    done = host.run("--strict", "--max", "1024", REGION)
    assert done.returncode == 1
    assert "not a cgroup v2 (unified) hierarchy" in done.stderr
    assert "cgroup v1" in done.stderr


def test_a_container_outside_the_unified_hierarchy_is_told_plainly(host: Host) -> None:
    (host.proc / str(PID) / "cgroup").write_text("12:memory:/kubepods/pod1/abc\n")
    done = host.run("--strict", "--max", "1024", REGION)
    assert done.returncode == 1
    assert "no cgroup v2 entry" in done.stderr


def test_a_kernel_without_dmem_is_told_plainly(host: Host) -> None:
    (host.cgroup / "cgroup.controllers").write_text("cpu io memory pids\n")
    done = host.run("--strict", "--max", "1024", REGION)
    assert done.returncode == 1
    assert "no dmem cgroup controller" in done.stderr and "6.14" in done.stderr


def test_dmem_not_enabled_for_the_container_names_the_fix(host: Host) -> None:
    (host.container() / "dmem.max").unlink()
    done = host.run("--strict", "--max", "1024", REGION)
    assert done.returncode == 1
    assert "not enabled for" in done.stderr and "cgroup.subtree_control" in done.stderr


def test_a_missing_container_cgroup_is_an_error(host: Host) -> None:
    shutil.rmtree(host.container())
    done = host.run("--strict", "--max", "1024", REGION)
    assert done.returncode == 1
    assert "does not exist" in done.stderr


@pytest.mark.parametrize(
    ("cgroups_path", "expected"),
    [
        # systemd driver: slice:prefix:name
        ("kubepods-burstable-pod1_2.slice:cri-containerd:abc", CGROUP),
        # cgroupfs driver: a path
        ("/kubepods/burstable/pod1-2/abc", "/kubepods/burstable/pod1-2/abc"),
    ],
)
def test_private_cgroup_namespace_falls_back_to_the_bundle(
    host: Host, cgroups_path: str, expected: str
) -> None:
    """A createContainer hook runs in the container's cgroup namespace: /proc says '/'."""
    (host.proc / str(PID) / "cgroup").write_text("0::/\n")
    target = host.container(expected)
    target.mkdir(parents=True, exist_ok=True)
    (target / "dmem.max").write_text("")
    bundle = host.root / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(
        json.dumps({"ociVersion": "1.2.0", "linux": {"cgroupsPath": cgroups_path}})
    )
    done = host.run("--strict", "--max", "4096", REGION)
    assert done.returncode == 0, done.stderr
    assert (target / "dmem.max").read_text() == f"{REGION} 4096\n"


def test_private_cgroup_namespace_without_a_bundle_path_is_an_error(host: Host) -> None:
    (host.proc / str(PID) / "cgroup").write_text("0::/\n")
    done = host.run("--strict", "--max", "4096", REGION)
    assert done.returncode == 1
    assert "private cgroup namespace" in done.stderr


def test_state_without_a_pid_is_an_error(host: Host) -> None:
    done = host.run("--strict", "--max", "1", REGION, state={"id": "abc", "status": "creating"})
    assert done.returncode == 1
    assert 'no "pid"' in done.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((REGION,), "--max must be a byte count"),
        (("--max", "10G", REGION), "--max must be a byte count, got '10G'"),
        (("--max", "1", "--min", "x", REGION), "--min must be a byte count"),
        (("--max", "1"), "no dmem region given"),
        (("--bogus", "--max", "1", REGION), "unknown option --bogus"),
    ],
)
def test_bad_arguments_are_named(host: Host, args: tuple[str, ...], words: str) -> None:
    done = host.run("--strict", *args)
    assert done.returncode == 1
    assert words in done.stderr


def test_failures_go_to_the_log_file_which_stays_bounded(host: Host) -> None:
    log = host.root / "hooks" / "dmem-hook.log"
    log.parent.mkdir()
    log.write_text("x" * (1024 * 1024 + 1))  # over 1 MiB: rotated before the next line
    done = host.run("--log", str(log), "--max", "1", "nvidia/0000:99:00.0/vidmem")
    assert done.returncode == 0
    assert (host.root / "hooks" / "dmem-hook.log.1").stat().st_size == 1024 * 1024 + 1
    lines = log.read_text().splitlines()
    assert len(lines) == 3
    assert "container abc: not using nvidia-smi memory-limits" in lines[0]  # the fallback
    assert "container abc: error: dmem region nvidia/0000:99:00.0/vidmem" in lines[1]
    assert "starts without" in lines[2]


def test_success_writes_no_log(host: Host) -> None:
    fake_nvidia_smi.install(host.bin, {GPU_UUID: REGION})
    log = host.root / "dmem-hook.log"
    done = host.run("--log", str(log), "--gpu", GPU_UUID, "--max", str(GIB), REGION)
    assert done.returncode == 0
    assert not log.exists()


def test_the_script_is_posix_sh() -> None:
    """Parsed by ``sh -n`` (and dash, when there); no bash-only constructs."""
    assert SH is not None
    for shell in {SH, shutil.which("dash")} - {None}:
        assert shell is not None
        subprocess.run([shell, "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/sh\n")
    for bashism in (r"\[\[ ", r"\$\(<", r"^\s*function ", r"\blocal ", r" == ", r"<<<"):
        assert not re.search(bashism, text, re.MULTILINE), bashism
