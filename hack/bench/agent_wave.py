#!/usr/bin/env python3
"""A wave of MPS v3 shares on one GPU, as the mps-agent serves it.

Starts ``dra-driver mps-agent --mps-control fake`` (its own process, its state on a
tmpfs, the packaged fake ``nvidia-cuda-mps-control``: a POSIX sh client per command,
the fake daemon in Python) and, over its unix socket, keeps one resident share per
GPU (its daemon up, as on a node serving MPS pods); then, each round, makes
``--wave`` concurrent ``ensure_share`` calls (each a share of its own claim) spread
over ``--gpus`` GPUs, then as many concurrent ``release_share`` calls. That is what
the kubelet's concurrent prepares of pods packed onto one GPU ask of the agent, with
the plugin left out (``prepare.py`` and ``kubelet_prepare.py`` measure it with the
plugin). A v3 share is three commands (namespace create and set at the ensure,
delete at the release); the agent sends them as before, so what changes the figures
is what runs at once.

``--gap`` leaves that many seconds before each wave, as ``prepare.py`` does (0.2 s):
the agent makes its spare namespaces and its deferred deletes in them, so a wave's
ensures take spares as a node's prepares do.

Printed: the ensure's and release's call-to-answer p50/p99 (ms), the wave's wall
time (median, from the first call to the last answer), the agent's CPU per share,
its own and its reaped children's (the fake's command processes), and its own
inside the ensure waves and inside the release waves.

Usage:   .venv/bin/python hack/bench/agent_wave.py [--rounds 20] [--wave 10] [--gpus 1,10]
         [--gap 0.2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, ROOT)

from dra_driver.mpsagent.client import MpsAgentClient  # noqa: E402

GIB = 1 << 30
TICK = os.sysconf("SC_CLK_TCK")


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-2222-3333-444444444444"


def start_agent(root: str, state: str) -> tuple[subprocess.Popen[bytes], str]:
    socket = os.path.join(root, "mps-agent.sock")
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: with its bytecode
    with open(os.path.join(root, "mps-agent.log"), "ab") as log:
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "dra_driver", "mps-agent", "--mps-control", "fake"),
                *("--mps-protocol", "v3", "--socket", socket, "--state-dir", state),
                *("--log-level", "INFO"),
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 30
    while not os.path.exists(socket):
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the agent did not come up; see {root}/mps-agent.log")
        time.sleep(0.02)
    return agent, socket


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own CPU, its reaped children's), in seconds: its own from the
    scheduler's count for each of its threads (nanoseconds; a wave's CPU is a few
    clock ticks), its children's from /proc/<pid>/stat."""
    own = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        path = f"/proc/{pid}/task/{task}/schedstat"
        # A thread that ended meanwhile is not found.
        with contextlib.suppress(FileNotFoundError), open(path) as f:
            own += int(f.read().split()[0])
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cutime, cstime = (int(x) for x in fields[13:15])
    return own / 1e9, (cutime + cstime) / TICK


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(call: Awaitable[object]) -> float:
    started = time.perf_counter()
    await call
    return (time.perf_counter() - started) * 1000


def ensure(client: MpsAgentClient, gpu: str, share: str) -> Awaitable[object]:
    return client.ensure_share(
        gpu, share, claim_uid=share, memory_limit_bytes=4 * GIB, active_thread_percentage=25
    )


async def measure(
    socket: str, pid: int, rounds: int, wave: int, gpus: int, *, gap: float
) -> dict[str, float]:
    client = MpsAgentClient(socket, keep_connections=16)
    for g in range(gpus):  # every GPU's daemon up before the first reading
        await client.ensure_share(gpu_uuid(g), f"resident-{g}", claim_uid=f"resident-{g}",
                                  memory_limit_bytes=GIB, active_thread_percentage=10)  # fmt: skip
    ensures: list[float] = []
    releases: list[float] = []
    walls: list[float] = []
    in_waves = [0.0, 0.0]  # the agent's own CPU in the ensure waves, in the release waves
    cpu_before = cpu_seconds(pid)
    for r in range(rounds):
        shares = [(gpu_uuid(i % gpus), f"w{gpus}-r{r}-{i}") for i in range(wave)]
        await asyncio.sleep(gap)
        wave_cpu = cpu_seconds(pid)[0]
        started = time.perf_counter()
        ensures += await asyncio.gather(*(timed(ensure(client, g, s)) for g, s in shares))
        walls.append((time.perf_counter() - started) * 1000)
        in_waves[0] += cpu_seconds(pid)[0] - wave_cpu
        await asyncio.sleep(gap)
        wave_cpu = cpu_seconds(pid)[0]
        releases += await asyncio.gather(
            *(timed(client.release_share(gpu, share)) for gpu, share in shares)
        )
        in_waves[1] += cpu_seconds(pid)[0] - wave_cpu
    own, children = (b - a for a, b in zip(cpu_before, cpu_seconds(pid), strict=True))
    for g in range(gpus):
        await client.release_share(gpu_uuid(g), f"resident-{g}")
    await client.close()
    shares_made = rounds * wave
    return {
        "ensure_p50": pct(ensures, 0.5),
        "ensure_p99": pct(ensures, 0.99),
        "release_p50": pct(releases, 0.5),
        "release_p99": pct(releases, 0.99),
        "wave_ms": statistics.median(walls),
        "agent_cpu": own * 1000 / shares_made,
        "commands_cpu": children * 1000 / shares_made,
        "ensure_wave_cpu": in_waves[0] * 1000 / shares_made,
        "release_wave_cpu": in_waves[1] * 1000 / shares_made,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--wave", type=int, default=10, help="concurrent ensures per round")
    parser.add_argument("--gpus", default="1,10", help="GPUs a wave spreads over, each a row")
    parser.add_argument(
        "--gap",
        type=float,
        default=0.0,
        help="seconds before each wave, as prepare.py leaves them (0.2 there): the "
        "agent's deferred namespace deletes and spare namespaces are made in them; 0: "
        "back to back (they then come when a wait passes its longest)",
    )
    args = parser.parse_args()
    print(
        f"mps-agent, a wave of {args.wave} concurrent v3 shares, {args.rounds} rounds "
        f"{args.gap:g} s apart (load average {os.getloadavg()[0]:.1f})"
    )
    print(
        "GPUs  ensure p50 / p99 (ms)  release p50 / p99 (ms)  wave wall p50 (ms)  "
        "CPU per share: agent / its commands (ms)  agent's in the ensure / release waves"
    )
    for gpus in (int(g) for g in args.gpus.split(",")):
        root = tempfile.mkdtemp(prefix="fgd-wave-", dir="/tmp")
        state = tempfile.mkdtemp(
            prefix="fgd-wave-", dir="/dev/shm" if os.path.isdir("/dev/shm") else root
        )
        agent, socket = start_agent(root, state)
        try:
            got = asyncio.run(
                measure(socket, agent.pid, args.rounds, args.wave, gpus, gap=args.gap)
            )
        finally:
            agent.terminate()
            agent.wait(30)
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
        print(
            f"{gpus:>4}  {got['ensure_p50']:8.1f} / {got['ensure_p99']:7.1f}"
            f"  {got['release_p50']:9.1f} / {got['release_p99']:7.1f}"
            f"  {got['wave_ms']:18.1f}  {got['agent_cpu']:10.2f} / {got['commands_cpu']:.2f}"
            f"  {got['ensure_wave_cpu']:24.2f} / {got['release_wave_cpu']:.2f}"
        )


if __name__ == "__main__":
    main()
