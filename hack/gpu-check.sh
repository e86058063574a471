#!/usr/bin/env bash
# Try this driver's NVIDIA-facing calls once on this node's real GPUs:
# `dra-driver gpu-check` (dra_driver/app/gpu_check/) with a CUDA client from
# the PyPI wheel nvidia-cuda-runtime-cu12. It prints a transcript (each command,
# its output, PASS/FAIL/SKIP; docs/nvidia-interfaces.md says what to do with
# it), never toggles MIG mode, and undoes what it makes (the MPS daemon, a MIG
# device, a cgroup).
#
# Usage:       sudo hack/gpu-check.sh [dra-driver gpu-check flags...]
#              e.g. sudo hack/gpu-check.sh --mig off
# Required:    root, python3 (3.11+) with venv, the NVIDIA driver (libnvidia-ml,
#              nvidia-cuda-mps-control, nvidia-smi); PyPI on first run (the
#              project's venv, the CUDA runtime wheel).
# Environment: VENV, PYTHON (see hack/common.sh); GPU_CHECK_TIMEOUT (whole run,
#              seconds, default 300).
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
cd "${ROOT}"
ensure_venv
if ! "${VENV}/bin/python" -c 'import sys; from dra_driver.gpu.cuda_client import wheel_cudart
sys.exit(wheel_cudart() is None)'; then
  "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check \
    "nvidia-cuda-runtime-cu12==12.9.79"
fi
exec timeout --kill-after=10 "${GPU_CHECK_TIMEOUT:-300}" \
  "${VENV}/bin/dra-driver" gpu-check \
  --cuda-client "${VENV}/bin/python -m dra_driver.gpu.cuda_client" "$@"
