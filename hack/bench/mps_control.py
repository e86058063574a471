#!/usr/bin/env python3
"""What one command of the fake ``nvidia-cuda-mps-control`` costs, against a native process.

The mps-agent runs one control process per MPS command (three per v3 share:
``namespace create`` and ``namespace set`` at prepare, ``namespace delete`` at
unprepare), as NVIDIA documents the binary, so a command's cost is on every
prepare's path. This starts a fake control daemon (v3, multiuser, as the agent
starts it) through the packaged launcher and times, in one run, interleaved in
blocks:

* ``/bin/true``: a native process start, the floor;
* ``native client``: the C client over the daemon's FIFO slots
  (``fakes/native/fifo_client.c``, built by ``hack/build-fake-mps-client.sh``; what
  ``fake_control_path()`` returns where it is built), running the agent's three
  commands in turn; left out where it is not built;
* ``sh client``: the POSIX sh launcher ``fakes/bin/nvidia-cuda-mps-control`` over the
  same slots (what serves where no compiler built the native one), the same commands;
* ``python client``: the same commands through the Python client over the control
  socket (``python -S -m dra_driver.fakes.mps_control``, what the launcher ran
  before), for the record.

Each command is spawned and waited for as the agent does (one at a time here).
Printed per variant: wall time per command (p50, p99), the command process's CPU
(its rusage), the daemon's CPU over the variant's commands (the scheduler's
count for each of its threads, /proc/<pid>/task/*/schedstat) per command, and
their sum against ``/bin/true``'s CPU; the
target is the sum of the client ``fake_control_path()`` picks (native where built)
within 2x of ``/bin/true``'s.

The daemon's directories are on a tmpfs (``--dir``), as the chart keeps the
agent's state (on a disk, each state change's rename costs the daemon more).

Usage: .venv/bin/python hack/bench/mps_control.py [--commands 3000] [--python-commands 150]
       [--dir /dev/shm] [--native PATH]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from dra_driver.fakes.mps_control import (  # noqa: E402
    fake_control_path,
    native_control_path,
    shell_control_path,
)

BLOCK = 50
"""Commands per block; the variants take turns block by block, so a change in the
host's speed during the run touches them alike."""


@dataclass
class Variant:
    name: str
    argv_prefix: list[str]
    commands: int
    takes_commands: bool = True
    """Runs the agent's commands (False: ``/bin/true``, run bare)."""
    walls: list[float] = field(default_factory=list)
    own_cpu: float = 0.0
    daemon_cpu: float = 0.0
    done: int = 0


def daemon_cpu_s(pid: int) -> float:
    """The daemon's CPU so far, every thread, in ns as the scheduler counts it
    (``/proc/<pid>/stat`` counts in 10 ms ticks, too coarse for a command)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total / 1e9


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def agent_commands(variant: str, i: int) -> list[str]:
    """The agent's three commands of a v3 share, in turn (a name per share and variant:
    a block may end between a share's commands, while another variant's block runs)."""
    name = f"{variant.split(maxsplit=1)[0]}_{i // 3}"
    return [
        ["namespace", "create", name, "--server=shares"],
        ["namespace", "set", name, "--server=shares", "--pinned-memory-limit=4G",
         "--active-thread-percentage=25"],
        ["namespace", "delete", name, "--server=shares"],
    ][i % 3]  # fmt: skip


def run_block(variant: Variant, daemon: int, env: dict[str, str], count: int) -> None:
    cpu0, daemon0 = children_cpu_s(), daemon_cpu_s(daemon)
    for _ in range(count):
        argv = variant.argv_prefix
        if variant.takes_commands:
            argv = [*argv, *agent_commands(variant.name, variant.done)]
        start = time.perf_counter()
        pid = os.posix_spawn(argv[0], argv, env)
        _, status = os.waitpid(pid, 0)
        variant.walls.append(time.perf_counter() - start)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{variant.name}: {argv} exited {status}")
        variant.done += 1
    variant.own_cpu += children_cpu_s() - cpu0
    variant.daemon_cpu += daemon_cpu_s(daemon) - daemon0


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=3000,
                        help="commands of /bin/true and of each FIFO client")  # fmt: skip
    parser.add_argument("--python-commands", type=int, default=150,
                        help="commands of the Python client (0: skip it)")  # fmt: skip
    parser.add_argument("--dir", default="/dev/shm",
                        help="where the pipe and log directories go (default: a tmpfs, as the "
                        "chart keeps the agent's state)")  # fmt: skip
    parser.add_argument("--native", default=native_control_path(),
                        help="the native client to time (default: the build "
                        "fake_control_path() would pick; none: left out)")  # fmt: skip
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="mpsb-", dir=args.dir)
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": REPO,
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log"),
    }
    env.pop("FAKE_MPS_COMMAND_DELAY_S", None)
    # As an install runs it: with the bytecode pip compiled (the Python client
    # would compile its modules on every start without it).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    control = fake_control_path()
    daemon = subprocess.Popen(
        [control, "-f", "-p", "3", "-m"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while subprocess.run([control, "server", "create", "shares"], env=env,
                             capture_output=True, check=False).returncode != 0:  # fmt: skip
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the fake daemon did not start")
            time.sleep(0.05)
        python = [sys.executable, "-S", "-m", "dra_driver.fakes.mps_control"]
        variants = [
            Variant("/bin/true", ["/bin/true"], args.commands, takes_commands=False),
            *([Variant("native client", [args.native], args.commands)] if args.native else []),
            Variant("sh client", [shell_control_path()], args.commands),
            Variant("python client", python, args.python_commands),
        ]
        for variant in variants:  # warm the page cache and the daemon's threads
            run_block(variant, daemon.pid, env, min(30, variant.commands))
            variant.walls.clear()
            variant.own_cpu = variant.daemon_cpu = 0.0
            variant.done = variant.done + (-variant.done % 3)  # start at a create
        counts = {v.name: 0 for v in variants}
        while any(counts[v.name] < v.commands for v in variants):
            for variant in variants:
                left = variant.commands - counts[variant.name]
                count = min(BLOCK if variant.name != "python client" else max(3, BLOCK // 10),
                            left)  # fmt: skip
                if count > 0:
                    run_block(variant, daemon.pid, env, count)
                    counts[variant.name] += count
        report(variants)
    finally:
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    return 0


def report(variants: list[Variant]) -> None:
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; commands run one "
          "at a time; ms per command")  # fmt: skip
    print(f"{'':14} {'n':>5} {'wall p50':>9} {'wall p99':>9} {'own CPU':>8} "
          f"{'daemon CPU':>11} {'sum':>7} {'vs true':>8}")  # fmt: skip
    floor = None
    for v in variants:
        if not v.walls:
            continue
        n = len(v.walls)
        own, daemon = v.own_cpu / n * 1e3, v.daemon_cpu / n * 1e3
        total = own + daemon
        floor = total if floor is None else floor
        print(f"{v.name:14} {n:5d} {percentile(v.walls, 50) * 1e3:9.3f} "
              f"{percentile(v.walls, 99) * 1e3:9.3f} {own:8.3f} {daemon:11.3f} {total:7.3f} "
              f"{total / floor:7.2f}x")  # fmt: skip
    true = variants[0]
    for client in (v for v in variants if v.name in ("native client", "sh client")):
        ratio = (client.own_cpu + client.daemon_cpu) / len(client.walls)
        ratio /= true.own_cpu / len(true.walls)
        wall = percentile(client.walls, 50) / percentile(true.walls, 50)
        verdict = "met" if ratio <= 2 else "MISSED"
        print(f"target: the {client.name}'s CPU per command (own + daemon) within 2x of "
              f"/bin/true's: {ratio:.2f}x, {verdict}; wall p50 {wall:.2f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
