#!/usr/bin/env bash
# Run the e2e suite (tests/e2e) against the cluster KUBECONFIG names, in one mode.
#
# Modes (tests/e2e/conftest.py):
#   chart          the driver installed with the chart (hack/kind/install-driver.sh);
#                  the examples of deploy/examples run as a user applies them
#   host-process   the plugin, mps-agent and controller run here, as processes, each
#                  with its ServiceAccount's token, beside this host's real kubelet
#                  (the chart must not serve this node meanwhile); run as root
#   control-plane  a cluster without kubelets: a Node object of the test's, the
#                  plugin here, the test plays the kubelet
# A cluster that does not answer fails the run (E2E_REQUIRE_CLUSTER=1). A wait that
# times out fails its test with what it waited for: the pods, the namespace's latest
# events, the claims' status and the driver's last log lines (written under
# E2E_ARTIFACTS_DIR too). The tests of the other modes are deselected.
#
# Usage:       hack/e2e.sh [MODE] [PYTEST_ARGS...]     (MODE default: chart)
#                e.g. hack/e2e.sh host-process -k vram_share
# Required:    KUBECONFIG; python3 3.11+ (the venv is made on first use); helm and
#              kubectl in hack/bin (installed here when missing).
# Environment (the tests read them; defaults in tests/e2e/conftest.py and
# tests/support/e2e_local_modes.py):
#   E2E_IMAGE            image of the example pods, never pulled (no registry)
#   E2E_CONTROLLER_PATH  1: run the controller-path tests too (the chart's controller
#                        and a GPU published for it; the local modes run their own)
#   E2E_FAKE_GPUS        the local modes' fake GPUs (default: the kind install's)
#   E2E_NODE_NAME        the node under test (host-process: this host's node)
#   E2E_TIMEOUT          seconds to wait for one example's pods (default 180)
#   E2E_ARTIFACTS_DIR    where failed tests' diagnostics go (default: none)
#   DRIVER_NAME, DRIVER_NAMESPACE   the installed driver's name and namespace
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
cd "${ROOT}"

mode=chart
case "${1:-}" in
  chart | host-process | control-plane) mode="$1"; shift ;;
  -h | --help) sed -n '2,/^set -o/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
esac
if [[ -z "${KUBECONFIG:-}" ]]; then
  echo "hack/e2e.sh: KUBECONFIG is not set: the ${mode} e2e mode runs against a cluster" >&2
  exit 2
fi

ensure_venv test
PYTHON="${VENV}/bin/python" "${ROOT}/hack/install-helm.sh" >/dev/null

export E2E_MODE="${mode}" E2E_REQUIRE_CLUSTER=1
[[ -n "${E2E_ARTIFACTS_DIR:-}" ]] && mkdir -p "${E2E_ARTIFACTS_DIR}"
echo "e2e: mode ${mode}, cluster $("${ROOT}/hack/bin/kubectl" config current-context 2>/dev/null || echo '?')" \
  "at ${KUBECONFIG}"
exec "${VENV}/bin/pytest" tests/e2e -v -rs "$@"
