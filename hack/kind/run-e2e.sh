#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Run the e2e tests (tests/e2e) against the kind cluster.
#
# The tests apply deploy/examples/<name>/<name>.yaml, wait for the pods and check
# the allocations; they pick the examples that fit the server's version. Here a
# cluster that does not answer fails the run (E2E_REQUIRE_CLUSTER=1) instead of
# skipping it. The run is hack/e2e.sh in chart mode, the command that runs them
# against any other cluster:
#   KUBECONFIG=~/.kube/config hack/e2e.sh chart
#
# Usage:       hack/kind/run-e2e.sh [PYTEST_ARGS...]
#                e.g. hack/kind/run-e2e.sh -k vram_share
# Required:    python3 3.11+ (the venv is created on first use); the cluster with
#              the driver installed (install-driver.sh).
# Environment: KIND_KUBECONFIG, DRIVER_NAME, DRIVER_NAMESPACE, ARTIFACTS_DIR,
#              CONTROLLER_ENABLED, CONTROLLER_GPU, ALLOCATOR (see hack/kind/common.sh:
#              the controller-path tests run when install-driver.sh gave the controller
#              GPUs, E2E_CONTROLLER_PATH=1);
#              E2E_TIMEOUT  seconds to wait for the pods of one example (default: 180)
#              E2E_IMAGE    image for the example pods, never pulled (default: as
#                           written in the examples; kind nodes pull them)
set -o errexit -o nounset -o pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common.sh"
cd "${ROOT}"

export KUBECONFIG="${KIND_KUBECONFIG}"
export DRIVER_NAME DRIVER_NAMESPACE
if [[ "${CONTROLLER_ENABLED}" == "true" && ( -n "${CONTROLLER_GPU}" || "${ALLOCATOR}" == "controller" ) ]]; then
  export E2E_CONTROLLER_PATH=1
fi
export E2E_ARTIFACTS_DIR="${ARTIFACTS_DIR}/e2e"
mkdir -p "${E2E_ARTIFACTS_DIR}"

exec "${ROOT}/hack/e2e.sh" chart "$@"
