#!/usr/bin/env python3
"""The kubelet plugin's own CPU for the steps an MPS share adds to a claim, one by one.

``prepare.py`` measures a whole wave, and its CPU per claim moves by a millisecond
from run to run on a shared 2-core machine. That is more than any one of these
steps costs, so this script times each step alone, by the CPU time of the thread
that runs it (``time.thread_time``, best of ``--repeat``):

* ``agent request``: one ``MpsAgentClient.ensure_share`` on a kept connection, 10 at a
  time, against a server in a child process that answers every line at once with
  a share (the plugin's side of the round trip: request, answer, parse);
* ``parse_whole``: one share's ``consumedCapacity`` quantity, as its plan reads it;
* ``checkpoint encode``: a write's encoding of 18 claims (a wave and the resident
  shares) with one claim changed;
* ``mps_namespaces``: one claim's namespaces, for one share.

``--root`` picks the checkout whose code is timed, so one copy of this script
compares two commits (a base from ``git archive`` and the branch).

Usage:   .venv/bin/python hack/bench/plugin_steps.py [--root DIR] [--requests 5000] [--repeat 5]
"""

# ruff: noqa: PLC0415 - the driver's modules are imported once --root has chosen
# the checkout they come from.
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

SHARE = {
    "gpu_uuid": "GPU-0",
    "share_id": "s",
    "claim_uid": "c",
    "memory_limit_bytes": 4 << 30,
    "active_thread_percentage": 100,
    "uid": None,
    "protocol": "v3",
    "namespace": "n",
    "pipe_dir": "/p",
    "shm_dir": "/s",
}


def serve(path: str) -> None:
    """The child: answer every request line with one share, until killed."""
    from dra_driver.mpsagent import protocol as wire

    answer = wire.encode_result({"share": SHARE})

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            writer.write(answer)
        writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(one, path=path)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def best_us(step: Callable[[], object], number: int, repeat: int) -> float:
    runs = timeit.repeat(step, number=number, repeat=repeat, timer=time.thread_time)
    return min(runs) / number * 1e6


def agent_request_us(requests: int, repeat: int, root: str) -> float:
    from dra_driver.mpsagent.client import MpsAgentClient

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "agent.sock")
        child = subprocess.Popen(
            [sys.executable, __file__, "--root", root, "--serve", path],
            env={**os.environ, "PYTHONPATH": root},
        )
        try:
            while not os.path.exists(path):
                time.sleep(0.01)

            async def waves() -> float:
                client = MpsAgentClient(path, keep_connections=16)

                async def one() -> None:
                    await client.ensure_share(
                        "GPU-0", "s", claim_uid="c", memory_limit_bytes=4 << 30,
                        active_thread_percentage=100,
                    )  # fmt: skip

                try:
                    for _ in range(20):  # connections opened, caches warm
                        await asyncio.gather(*(one() for _ in range(10)))
                    best = float("inf")
                    for _ in range(repeat):
                        started = time.thread_time()
                        for _ in range(requests // 10):
                            await asyncio.gather(*(one() for _ in range(10)))
                        best = min(best, time.thread_time() - started)
                    return best / (requests // 10 * 10) * 1e6
                finally:
                    await client.close()

            return asyncio.run(waves())
        finally:
            child.terminate()
            child.wait()


def checkpoint_encode_us(repeat: int) -> float:
    from dra_driver.base.ids import ClaimRef, ClaimUID
    from dra_driver.state.checkpoint import (
        Checkpoint,
        CheckpointClaim,
        ClaimState,
        Fragments,
        encode,
    )
    from tests.support.planned import mps_share

    spec = {"cdiVersion": "0.6.0", "kind": "k8s.x/claim", "devices": [{"name": "d"}]}
    claims = {}
    for i in range(18):
        uid = ClaimUID(f"{i:08d}-1111-2222-3333-444455556666")
        claims[uid] = CheckpointClaim(
            ClaimRef("ns", f"c{i}", uid),
            ClaimState.PREPARE_COMPLETED,
            (mps_share("gpu-0", share_id=f"s{i}"),),
            f"/var/run/cdi/c{i}.json",
            spec,
        )
    checkpoint = Checkpoint("boot", claims)
    kept = Fragments()  # a checkout's own kind (a dict before KeptEncodings)
    encode(checkpoint, kept)
    first = next(iter(claims))
    started = dataclasses.replace(claims[first], state=ClaimState.PREPARE_STARTED)

    def write() -> None:
        encode(dataclasses.replace(checkpoint, claims={**claims, first: started}), kept)

    return best_us(write, 2000, repeat)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=ROOT, help="the checkout whose code is timed")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.root))
    if args.serve:
        serve(args.serve)
        return 0
    from dra_driver.base.quantity import parse_whole
    from dra_driver.core.prepare import mps_namespaces
    from tests.support.planned import mps_share

    devices = (mps_share("gpu-0", share_id="s1"),)
    figures = {
        "agent request": agent_request_us(args.requests, args.repeat, os.path.abspath(args.root)),
        "parse_whole": best_us(lambda: parse_whole("4Gi"), 20000, args.repeat),
        "checkpoint encode": checkpoint_encode_us(args.repeat),
        "mps_namespaces": best_us(lambda: mps_namespaces(devices), 20000, args.repeat),
    }
    print(
        f"the plugin's CPU per step, µs (thread time, best of {args.repeat}), code of {args.root}"
    )
    for name, micros in figures.items():
        print(f"{name:20s} {micros:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
