#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Create the kind cluster for one Kubernetes release (no-op if it exists).
#
# Usage:       hack/kind/create-cluster.sh
#                e.g. K8S_VERSION=1.34 hack/kind/create-cluster.sh
# Required:    kind, kubectl, and docker or podman for kind's nodes.
# Environment: K8S_VERSION, KIND_CLUSTER_NAME, KIND_NODE_IMAGE, KIND_CLUSTER_CONFIG,
#              KIND_KUBECONFIG (see hack/kind/common.sh).
set -o errexit -o nounset -o pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common.sh"
require "${KIND}" "${KUBECTL}"

if "${KIND}" get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER_NAME}"; then
  echo "kind cluster ${KIND_CLUSTER_NAME} exists; writing its kubeconfig to ${KIND_KUBECONFIG}"
  "${KIND}" export kubeconfig --name "${KIND_CLUSTER_NAME}" --kubeconfig "${KIND_KUBECONFIG}"
else
  mkdir -p "$(dirname "${KIND_KUBECONFIG}")"
  "${KIND}" create cluster \
    --name "${KIND_CLUSTER_NAME}" \
    --image "${KIND_NODE_IMAGE}" \
    --config "${KIND_CLUSTER_CONFIG}" \
    --kubeconfig "${KIND_KUBECONFIG}" \
    --wait 180s
fi

kube version
kube get nodes -o wide
cat <<MSG

Cluster ${KIND_CLUSTER_NAME} (Kubernetes ${K8S_VERSION}) is up.
  export KUBECONFIG=${KIND_KUBECONFIG}
Next: hack/build-image.sh, hack/kind/load-image.sh, hack/kind/install-driver.sh.
MSG
