"""A tiny CUDA client for ``dra-driver gpu-check``: allocates below and above a limit.

Run as ``python -m dra_driver.gpu.cuda_client --below BYTES --above BYTES
[--cudart PATH]`` in the environment of the client under test (an MPS namespace's
``CUDA_MPS_PIPE_DIRECTORY``, a cgroup with a dmem limit). It loads the CUDA runtime
with ctypes, from ``--cudart`` or from the PyPI wheel ``nvidia-cuda-runtime-cu12``
(``nvidia/cuda_runtime/lib/libcudart.so.12``), so the check needs no CUDA toolkit,
and prints one JSON line: the runtime's return codes of ``cudaSetDevice(0)`` and of
``cudaMalloc`` of each size (0 success, 2 ``cudaErrorMemoryAllocation``), the SMs it
sees (``cudaDevAttrMultiProcessorCount``, 16) and ``cudaMemGetInfo``. Signatures:
the CUDA Runtime API reference ("Device Management", "Memory Management").
docs/nvidia-interfaces.md: cuda-client. Never run on a GPU by this project yet.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import importlib.util
import json
import os
import sys
from collections.abc import Sequence

CUDA_SUCCESS = 0
CUDA_ERROR_MEMORY_ALLOCATION = 2
"""``cudaErrorMemoryAllocation``: what an allocation past a limit returns."""
DEV_ATTR_MULTIPROCESSOR_COUNT = 16


def wheel_cudart() -> str | None:
    """``libcudart.so.*`` of the installed ``nvidia-cuda-runtime-cu12`` wheel, if any."""
    spec = importlib.util.find_spec("nvidia")
    roots = (spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        found = sorted(glob.glob(os.path.join(root, "cuda_runtime", "lib", "libcudart.so*")))
        if found:
            return found[-1]
    return None


def allocate(lib: ctypes.CDLL, size: int) -> int:
    """``cudaMalloc`` of ``size`` bytes, freed at once; the runtime's return code."""
    pointer = ctypes.c_void_p()
    code = int(lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)))
    if code == CUDA_SUCCESS:
        lib.cudaFree(pointer)
    return code


def measure(lib: ctypes.CDLL, below: int, above: int) -> dict[str, int]:
    out = {"set_device": int(lib.cudaSetDevice(0))}
    if out["set_device"] != CUDA_SUCCESS:
        return out
    sms = ctypes.c_int()
    lib.cudaDeviceGetAttribute(ctypes.byref(sms), DEV_ATTR_MULTIPROCESSOR_COUNT, 0)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    out |= {"sms": sms.value, "free": free.value, "total": total.value}
    out["below"] = allocate(lib, below)
    out["above"] = allocate(lib, above)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cuda_client", description=__doc__)
    parser.add_argument("--below", type=int, required=True)
    parser.add_argument("--above", type=int, required=True)
    parser.add_argument("--cudart", help="libcudart.so path; default: the PyPI wheel's")
    args = parser.parse_args(argv)
    path = args.cudart or wheel_cudart()
    if path is None:
        print(
            json.dumps({"error": "no libcudart: pip install nvidia-cuda-runtime-cu12, or --cudart"})
        )
        return 1
    try:
        lib = ctypes.CDLL(path)
    except OSError as err:
        print(json.dumps({"error": f"cannot load {path}: {err}"}))
        return 1
    print(json.dumps(measure(lib, args.below, args.above)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
