#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Collect what explains a failed e2e run: nodes, every pod, the driver's pods
# described and their logs (current and previous), ResourceSlices, ResourceClaims,
# DeviceClasses, events, and kind's node logs (kubelet, containerd). Each step
# that fails is noted and skipped: gather as much as possible.
#
# Usage:       hack/kind/collect-diagnostics.sh [OUTPUT_DIR]
# Required:    kubectl; kind for the node logs.
# Environment: ARTIFACTS_DIR (default output: <ARTIFACTS_DIR>/diagnostics),
#              DRIVER_NAMESPACE, KIND_CLUSTER_NAME, KIND_KUBECONFIG
#              (see hack/kind/common.sh).
set -o errexit -o nounset -o pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common.sh"
out="${1:-${ARTIFACTS_DIR}/diagnostics}"
mkdir -p "${out}"

# save FILE CMD...: CMD's output to out/FILE; a failure is written there too.
save() {
  local file="${out}/$1"
  shift
  if ! "$@" >"${file}" 2>&1; then
    echo "(command failed: $*)" >>"${file}"
  fi
}

save nodes.txt kube get nodes -o wide --show-labels
save pods.txt kube get pods --all-namespaces -o wide
save driver-pods.txt kube describe pods --namespace "${DRIVER_NAMESPACE}"
save daemonsets.txt kube get daemonsets,deployments --all-namespaces -o wide
save resourceslices.yaml kube get resourceslices -o yaml
save resourceclaims.yaml kube get resourceclaims --all-namespaces -o yaml
save resourceclaimtemplates.yaml kube get resourceclaimtemplates --all-namespaces -o yaml
save deviceclasses.yaml kube get deviceclasses -o yaml
save events.txt kube get events --all-namespaces --sort-by=.lastTimestamp
for ns in $(kube get namespaces -o name 2>/dev/null | sed -n 's|^namespace/\(fgd-.*\)|\1|p'); do
  save "pods-${ns}.txt" kube describe pods --namespace "${ns}"
done
for pod in $(kube get pods --namespace "${DRIVER_NAMESPACE}" -o name 2>/dev/null); do
  name="${pod#pod/}"
  save "logs-${name}.txt" kube logs --namespace "${DRIVER_NAMESPACE}" "${pod}" \
    --all-containers --prefix --timestamps
  save "logs-${name}-previous.txt" kube logs --namespace "${DRIVER_NAMESPACE}" "${pod}" \
    --all-containers --prefix --timestamps --previous
done
if command -v "${KIND}" >/dev/null 2>&1; then
  save kind-export.txt "${KIND}" export logs "${out}/kind" --name "${KIND_CLUSTER_NAME}"
fi
echo "diagnostics in ${out}"
