#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Delete the kind cluster (no-op if it does not exist) and its kubeconfig.
#
# Usage:       hack/kind/delete-cluster.sh
# Required:    kind.
# Environment: K8S_VERSION, KIND_CLUSTER_NAME, KIND_KUBECONFIG (see hack/kind/common.sh).
set -o errexit -o nounset -o pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common.sh"
require "${KIND}"

"${KIND}" delete cluster --name "${KIND_CLUSTER_NAME}" --kubeconfig "${KIND_KUBECONFIG}"
rm -f "${KIND_KUBECONFIG}"
