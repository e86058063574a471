#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Install (or upgrade) the driver's Helm chart into the kind cluster with the
# fake GPU backend: fake GPUs (FAKE_GPUS) on the opted-in nodes, harmless
# stand-ins for the GPU device nodes in the CDI specs and the packaged fake
# nvidia-cuda-mps-control in the mps-agent, so claims are prepared and the pods
# that use them really start. Then waits until the driver's ResourceSlices are
# published.
#
# This is the one place that spells out the chart install for e2e: adjust the
# values here (or pass more with arguments / HELM_EXTRA_ARGS). The liveness probe
# runs every 5 s instead of 30 s: the health e2e sees a GPU reset after two probes.
# With the controller on (CONTROLLER_ENABLED), GPU CONTROLLER_GPU of every opted-in
# node is allocated by the controller, the others by the scheduler, so the e2e
# tests cover both paths; the MIG instances of GPU MPS_MIG_GPU (MIG-enabled) are
# MPS-shared, for the mig-mps-shares example. Both are per-GPU entries of each
# node in nodeSettings.perNode. helm --wait waits for the kubelet plugins to be
# ready: registered with the kubelet and their ResourceSlices published.
#
# Usage:       hack/kind/install-driver.sh [EXTRA_HELM_ARGS...]
#                e.g. hack/kind/install-driver.sh --set kubeletPlugin.logLevel=DEBUG
# Required:    helm, kubectl; the cluster (create-cluster.sh) with the image
#              loaded (load-image.sh).
# Environment: IMAGE_NAME, IMAGE_TAG, DRIVER_NAME, DRIVER_NAMESPACE, HELM_RELEASE,
#              CHART_DIR, FAKE_GPUS, NODE_LABEL_KEY, NODE_LABEL_VALUE,
#              GPU_NODE_SELECTOR, ALLOCATOR, CONTROLLER_ENABLED, CONTROLLER_GPU,
#              MPS_MIG_GPU, KIND_KUBECONFIG
#              (see hack/kind/common.sh);
#              HELM_EXTRA_ARGS  more helm arguments, split on blanks (default: none)
#              INSTALL_TIMEOUT  helm --wait timeout (default: 5m)
#              SLICES_TIMEOUT   seconds to wait for the first ResourceSlice (default: 120)
set -o errexit -o nounset -o pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common.sh"
require "${HELM}" "${KUBECTL}"
: "${HELM_EXTRA_ARGS:=}"
: "${INSTALL_TIMEOUT:=5m}"
: "${SLICES_TIMEOUT:=120}"

# Opt the GPU nodes in (the chart's DaemonSets select the label).
kube label nodes --overwrite --selector "${GPU_NODE_SELECTOR}" \
  "${NODE_LABEL_KEY}=${NODE_LABEL_VALUE}"

extra=()
if [[ -n "${HELM_EXTRA_ARGS}" ]]; then
  read -r -a extra <<<"${HELM_EXTRA_ARGS}"
fi

# The per-GPU entries of every opted-in node: CONTROLLER_GPU for the controller (with
# the controller on), MPS_MIG_GPU with MPS-shared MIG instances (one entry for a GPU
# that is both). An instance's MPS daemon is legacy MPS, which cannot keep tenants
# apart, and the kube-scheduler cannot keep an instance to one namespace: its shares
# are published only with the opt-in tenancy: cooperative.
controller_gpu=""
if [[ "${CONTROLLER_ENABLED}" == "true" ]]; then
  controller_gpu="${CONTROLLER_GPU}"
fi
gpu_entries=""
if [[ -n "${controller_gpu}" && "${controller_gpu}" == "${MPS_MIG_GPU}" ]]; then
  gpu_entries="\"${controller_gpu}\": {allocator: controller, sharing: mps, tenancy: cooperative}"
else
  if [[ -n "${controller_gpu}" ]]; then
    gpu_entries="\"${controller_gpu}\": {allocator: controller}"
  fi
  if [[ -n "${MPS_MIG_GPU}" ]]; then
    gpu_entries="${gpu_entries:+${gpu_entries}, }\"${MPS_MIG_GPU}\": {sharing: mps, tenancy: cooperative}"
  fi
fi

# A values file, since node names are map keys (helm --set would split them on dots).
per_node="$(mktemp)"
trap 'rm -f "${per_node}"' EXIT
echo "nodeSettings: {perNode: {}}" >"${per_node}"
if [[ -n "${gpu_entries}" ]]; then
  {
    echo "nodeSettings:"
    echo "  perNode:"
    for node in $(kube get nodes --selector "${GPU_NODE_SELECTOR}" \
      -o jsonpath='{.items[*].metadata.name}'); do
      echo "    \"${node}\": {gpus: {${gpu_entries}}}"
    done
  } >"${per_node}"
  cat "${per_node}"
fi

"${HELM}" upgrade --install "${HELM_RELEASE}" "${CHART_DIR}" \
  --kubeconfig "${KIND_KUBECONFIG}" \
  --namespace "${DRIVER_NAMESPACE}" --create-namespace \
  --set-string image.repository="${IMAGE_NAME}" \
  --set-string image.tag="${IMAGE_TAG}" \
  --set-string image.pullPolicy=IfNotPresent \
  --set-string driverName="${DRIVER_NAME}" \
  --set-string backend=fake \
  --set-string fakeGpus="${FAKE_GPUS//,/\\,}" \
  --set-string nodeSelection.labelKey="${NODE_LABEL_KEY}" \
  --set-string nodeSelection.labelValue="${NODE_LABEL_VALUE}" \
  --set-string nodeSettings.defaults.allocator="${ALLOCATOR}" \
  --set-string mpsAgent.mpsProtocol="${MPS_PROTOCOL}" \
  --set controller.enabled="${CONTROLLER_ENABLED}" \
  --set-string kubeletPlugin.cdiHookPath="" \
  --set kubeletPlugin.health.probeInterval=5 \
  --values "${per_node}" \
  --wait --timeout "${INSTALL_TIMEOUT}" \
  ${extra[@]+"${extra[@]}"} "$@"

kube get pods --namespace "${DRIVER_NAMESPACE}" -o wide

echo "waiting up to ${SLICES_TIMEOUT}s for ResourceSlices of ${DRIVER_NAME}"
deadline=$((SECONDS + SLICES_TIMEOUT))
until [[ -n "$(kube get resourceslices --field-selector "spec.driver=${DRIVER_NAME}" -o name)" ]]; do
  if ((SECONDS >= deadline)); then
    echo "install-driver.sh: no ResourceSlice of ${DRIVER_NAME} after ${SLICES_TIMEOUT}s;" \
      "see hack/kind/collect-diagnostics.sh" >&2
    exit 1
  fi
  sleep 2
done
kube get resourceslices --field-selector "spec.driver=${DRIVER_NAME}"
kube get deviceclasses
