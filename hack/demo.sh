#!/usr/bin/env bash
# Run `dra-driver demo`: the node flow on fake GPUs, no cluster, no GPU.
#
# Usage:       hack/demo.sh [DEMO_FLAGS...]   (e.g. --fake-gpus a100-80gb:4)
# Required:    python3 (3.11+) with venv; network access to PyPI on first run.
# Environment: VENV, PYTHON (see hack/common.sh).
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
ensure_venv
exec "${VENV}/bin/dra-driver" demo "$@"
