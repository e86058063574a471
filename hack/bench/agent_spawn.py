#!/usr/bin/env python3
"""What the mps-agent's own process spends to run one control command, by spawn path.

The agent runs one control process per MPS command (three per v3 share), through
``dra_driver.mpsagent.command_process.run_command``. This runs a command through
its paths on one event loop, interleaved in blocks, and reports the
agent's side only:

* ``pidfd``: ``os.posix_spawn``, stdout and stderr into two memfds read at the
  exit, only the exit watched (through a pidfd): what the agent runs on Linux 5.3+;
* ``asyncio``: ``asyncio.create_subprocess_exec`` with pipe transports and, on
  Python 3.11, a child-watcher thread per child (the fallback, and the agent's
  path before);
* with ``--against CHECKOUT``, ``against``: ``run_command`` of another checkout's
  ``command_process.py`` (a commit before, say), on the same loop in the same turns.

The command is ``/bin/true`` by default (``--command`` sets another), with no
input (as a v3 command) and, with ``--stdin``, a line on stdin (as a legacy one);
the environment is the agent's size (this process's, as ``daemon_env`` builds it).
Printed per path: wall time per command (p50, p99) and this process's CPU per
command (``time.process_time``: every thread of it, the watcher threads too),
with the pidfd path's against the asyncio path's.

Usage: .venv/bin/python hack/bench/agent_spawn.py [--commands 2000] [--command /bin/true]
       [--stdin] [--against CHECKOUT]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import shlex
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from dra_driver.mpsagent import command_process  # noqa: E402
from dra_driver.mpsagent.command_process import Env, Finished, encode_env  # noqa: E402

BLOCK = 50
"""Commands per block; the paths take turns block by block, so a change in the
host's load during the run touches them alike."""

Runner = Callable[[list[str], Env, bytes | None, float], Awaitable[Finished]]


@dataclass
class Path:
    name: str
    run: Runner
    walls: list[float] = field(default_factory=list)
    cpu: float = 0.0
    most_threads: int = 0


async def run_block(path: Path, argv: list[str], env: Env, stdin: bytes | None) -> None:
    cpu0 = time.process_time()
    for _ in range(BLOCK):
        start = time.perf_counter()
        done = await path.run(argv, env, stdin, 10.0)
        path.walls.append(time.perf_counter() - start)
        path.most_threads = max(path.most_threads, threading.active_count())
        if done.returncode != 0:
            raise SystemExit(f"{path.name}: {argv} exited {done.returncode}: {done.stderr!r}")
    path.cpu += time.process_time() - cpu0


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


async def measure(paths: list[Path], argv: list[str], commands: int, stdin: bytes | None) -> None:
    env = encode_env({**os.environ, "CUDA_VISIBLE_DEVICES": "GPU-0"})
    for path in paths:  # warm up: imports, the first watcher, page cache
        await path.run(argv, env, stdin, 10.0)
    for _ in range(max(1, commands // BLOCK)):
        for path in paths:
            await run_block(path, argv, env, stdin)


def run_command_of(checkout: str) -> Runner:
    """``run_command`` of ``checkout``'s ``command_process.py``, loaded under a name of
    its own (beside ours, not instead)."""
    file = os.path.join(checkout, "dra_driver", "mpsagent", "command_process.py")
    spec = importlib.util.spec_from_file_location("against_command_process", file)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runner: Runner = module.run_command
    return runner


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", type=int, default=2000, help="commands per path")
    parser.add_argument("--command", default="/bin/true", help="the command (shell words)")
    parser.add_argument("--stdin", action="store_true", help="give it a line on stdin")
    parser.add_argument("--against", metavar="CHECKOUT", help="also another checkout's path")
    args = parser.parse_args()
    if not (command_process.pidfd_supported() and command_process.memfd_supported()):
        raise SystemExit("no pidfd or no memfd here: only the asyncio path would run")
    argv = shlex.split(args.command)
    paths = [
        Path("pidfd", command_process.run_command),
        Path("asyncio", command_process.run_command_asyncio),
    ]
    if args.against:
        paths.append(Path("against", run_command_of(args.against)))
    stdin = b"get_server_list\n" if args.stdin else None
    asyncio.run(measure(paths, argv, args.commands, stdin))
    load = os.getloadavg()[0]
    print(
        f"{args.command!r}{' with a line on stdin' if args.stdin else ''}, Python "
        f"{sys.version.split()[0]}, {len(os.environ) + 1} environment variables, "
        f"load average {load:.1f}"
    )
    print(f"{'path':<10}{'n':>6}{'wall p50 / p99 (ms)':>22}{'CPU/command (ms)':>18}{'threads':>9}")
    for p in paths:
        n = len(p.walls)
        wall = f"{percentile(p.walls, 50) * 1e3:.2f} / {percentile(p.walls, 99) * 1e3:.2f}"
        print(f"{p.name:<10}{n:>6}{wall:>22}{p.cpu / n * 1e3:>18.3f}{p.most_threads:>9}")
    lean, old = paths[0].cpu / len(paths[0].walls), paths[1].cpu / len(paths[1].walls)
    print(f"pidfd path's CPU per command: {lean / old:.2f}x the asyncio path's")
    if args.against:
        other = paths[2].cpu / len(paths[2].walls)
        print(f"pidfd path's CPU per command: {lean / other:.2f}x {args.against}'s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
