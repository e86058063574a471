"""A stand-in for ``dra_driver.gpu.cuda_client`` on a machine without a GPU.

It answers as a CUDA client would under the limit its environment puts it in:
under MPS v3, the pinned memory limit the (fake) daemon holds for the namespace
whose directory ``CUDA_MPS_PIPE_DIRECTORY`` names (asked with the documented
``namespace list``, through the control binary in ``FAKE_MPS_CONTROL``); under
legacy MPS, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. An allocation up to the limit
returns 0, one above it 2 (``cudaErrorMemoryAllocation``); without a limit every
allocation works, as on a GPU with no MPS. Output: the real client's JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from dra_driver.mpsagent.listing import parse_memory_limit, parse_v3_namespace_list

SMS = 132


def namespace_limit(pipe: str) -> int | None:
    root, server, namespace = pipe.rsplit("/", 2)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": root}
    listed = subprocess.run(
        [os.environ["FAKE_MPS_CONTROL"], "namespace", "list", f"--server={server}",
         "--format=csv,noheader"],
        env=env, capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    for row in parse_v3_namespace_list(listed.stdout).rows:
        if row.name == namespace:
            return row.pinned_memory_limit
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--below", type=int, required=True)
    parser.add_argument("--above", type=int, required=True)
    args = parser.parse_args()
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    caps = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    if caps:
        limit: int | None = parse_memory_limit(caps.rsplit("=", 1)[1])
    elif pipe.count("/") >= 2 and os.environ.get("FAKE_MPS_CONTROL"):
        limit = namespace_limit(pipe)
    else:
        limit = None

    def code(size: int) -> int:
        return 0 if limit is None or size <= limit else 2

    result = {"set_device": 0, "sms": SMS, "free": limit or 0, "total": 80 << 30,
              "below": code(args.below), "above": code(args.above)}  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
