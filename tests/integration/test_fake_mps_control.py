"""The fake ``nvidia-cuda-mps-control`` as NVIDIA documents the real one: in v3 mode
exactly the documented ``<module> <verb>`` forms, one command per process, and list
output in the documented format (docs:mpsv3-interface; NVIDIA Dynamo, "Per-GPU
Compute and Memory Limits with MPS")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from dra_driver.fakes.mps_control import fake_control_path
from dra_driver.mpsagent import listing


@dataclass
class Fake:
    env: dict[str, str]

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [fake_control_path(), *args],
            env=self.env,
            input=stdin or "",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def ok(self, *args: str) -> str:
        done = self.run(*args)
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout


@pytest.fixture
def v3() -> Iterator[Fake]:
    root = tempfile.mkdtemp(prefix="fkmps-", dir="/tmp")
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log"),
    }
    daemon = subprocess.Popen(
        [fake_control_path(), "-f", "-p", "3", "-m"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fake = Fake(env)
    deadline = time.monotonic() + 20
    while fake.run("server", "list").returncode != 0:
        assert time.monotonic() < deadline and daemon.poll() is None, "the fake did not start"
        time.sleep(0.05)
    try:
        yield fake
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def test_v3_has_no_interactive_shell(v3: Fake) -> None:
    """MPS v3 "replaces the interactive shell of Legacy MPS v2" (docs:mpsv3-interface)."""
    for line in ("server list --format=csv,noheader\n", "get_server_list\n", "quit\n"):
        done = v3.run(stdin=line)
        assert done.returncode == 1, line
        assert "MPS v3" in done.stdout and "command line" in done.stdout, done.stdout
    assert v3.ok("server", "list") is not None  # the daemon is still there (no quit)


def test_namespace_list_prints_as_documented(v3: Fake) -> None:
    v3.ok("server", "create", "shares")
    v3.ok("server", "set", "shares", "--pinned-memory-limit=10G", "--active-thread-percentage=50")
    v3.ok("namespace", "create", "small", "--server=shares")
    # key=value without dashes is a documented form too.
    v3.ok("namespace", "set", "small", "server=shares", "pinned-memory-limit=20G",
          "--active-thread-percentage=30")  # fmt: skip
    table = v3.ok("namespace", "list", "--server=shares").splitlines()
    # The Dynamo guide's header and cells: "SERVER STATUS", "20G", "30.00".
    assert table[0].split()[:9] == [
        "NAME", "SERVER", "SERVER", "STATUS", "PINNED", "MEMORY", "LIMIT", "ACTIVE", "THREAD",
    ]  # fmt: skip
    assert table[2].split()[:5] == ["small", "shares", "Ready", "20G", "30.00"]
    assert table[1].split()[:5] == ["default", "shares", "Ready", "10G", "50.00"]
    csv = v3.ok("namespace", "list", "--server=shares", "--format=csv,noheader")
    assert csv.splitlines()[1].split(",")[:5] == ["small", "shares", "Ready", "20G", "30.00"]
    parsed = listing.parse_v3_namespace_list(csv)
    assert parsed.problems == () and [r.active_thread_percentage for r in parsed.rows] == [50, 30]
    assert v3.ok("namespace", "get", "small", "shares", "pinned-memory-limit") == "20G\n"
    assert v3.ok("server", "get", "shares", "status") == "Ready\n"


@pytest.mark.parametrize(
    "args",
    [
        ("namespace", "create", "a", "--server=shares", "--pinned-memory-limit=1G"),
        ("namespace", "delete", "a", "--server=shares", "--all"),
        ("namespace", "list", "--format=json"),
        ("namespace", "list", "a", "b"),
        ("namespace", "get", "default", "shares", "colour"),
        ("namespace", "set", "default", "--server=shares", "--client-priority=2"),
        ("server", "list", "--force"),
        ("server", "create", "shares", "--allowed-gpus=0"),
        ("server", "start", "shares"),
        ("namespace",),
        ("sm-partition", "list"),
        ("shares",),
    ],
    ids=" ".join,
)
def test_undocumented_v3_forms_are_refused(v3: Fake, args: tuple[str, ...]) -> None:
    v3.ok("server", "create", "shares")
    done = v3.run(*args)
    if args == ("namespace",):  # "<module> help" and a bare module print the usage
        assert done.returncode == 0 and "namespace create <name> --server=<s>" in done.stdout
        return
    assert done.returncode == 1, (args, done.stdout)
    assert done.stderr.startswith("Error:"), done.stderr


def test_the_documented_v3_forms_are_accepted(v3: Fake) -> None:
    v3.ok("server", "create", "shares", "--uid=0")
    v3.ok("server", "list", "shares", "--format=csv")
    v3.ok("namespace", "create", "a", "--server=shares")
    v3.ok("namespace", "set", "a", "--server=shares", "--client-priority=1")
    v3.ok("namespace", "list", "a", "--server=shares", "--format=table,noheader")
    v3.ok("client", "list", "--server=shares", "--all", "--format=csv,noheader")
    v3.ok("namespace", "delete", "a", "--server=shares", "--force")
    v3.ok("namespace", "help")
    v3.ok("server", "delete", "shares", "--force")
    v3.ok("-q")
