#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Shared settings for the hack/kind/ scripts; source it, don't run it.
#
# Every setting has a default that a variable in the environment overrides.
# Environment:
#   K8S_VERSION           Kubernetes minor release of the cluster: 1.34 (controller
#                         path; consumable capacity is off), 1.36 (native path) or
#                         1.37 (native path, the current release) (default: 1.36)
#   KIND_CLUSTER_NAME     kind cluster name (default: fractional-gpu-dra-<K8S_VERSION with ->)
#   KIND_NODE_IMAGE       node image (default per K8S_VERSION: kindest/node:v1.34.11,
#                         kindest/node:v1.36.4 or kindest/node:v1.37.0, the images of kind
#                         v0.33.0; pin a digest here from kind's release notes for
#                         reproducible runs)
#   KIND_CLUSTER_CONFIG   kind Cluster config (default: hack/kind/cluster-<K8S_VERSION>.yaml)
#   KIND_KUBECONFIG       kubeconfig the scripts write and use; never your own
#                         KUBECONFIG, so nothing lands on another cluster by accident
#                         (default: ~/.kube/kind-<KIND_CLUSTER_NAME>)
#   KIND, KUBECTL, HELM   the tools (default: from PATH, else hack/bin/ from
#                         hack/install-helm.sh)
#   CONTAINER_TOOL        docker | podman, for load-image.sh (default: docker if found)
#   IMAGE_NAME, IMAGE_TAG the driver image (default: fractional-gpu-dra:v<pyproject
#                         version>, as hack/build-image.sh tags it)
#   DRIVER_NAME           DRA driver name (default: gpu.fractional.dev)
#   DRIVER_NAMESPACE      namespace of the chart (default: fractional-gpu-dra)
#   HELM_RELEASE          release name (default: fractional-gpu-dra)
#   CHART_DIR             the chart (default: deploy/helm/fractional-gpu-dra)
#   FAKE_GPUS             fake GPUs on every opted-in node (default: three shared H100s
#                         and two with MIG on: h100-80gb:3,h100-80gb:2:mig; gpu-0 and
#                         gpu-1 for the scheduler, gpu-2 for the controller, gpu-3 MIG
#                         with exclusive instances, gpu-4 MIG with MPS-shared ones)
#   NODE_LABEL_KEY        the chart's opt-in node label (default: gpu.fractional.dev/enabled)
#   NODE_LABEL_VALUE      its value (default: true)
#   GPU_NODE_SELECTOR     label selector of the nodes to opt in
#                         (default: !node-role.kubernetes.io/control-plane, the workers)
#   ALLOCATOR             which allocator the nodes' GPUs are published for by default:
#                         scheduler | controller | auto (the chart's nodeSettings.defaults;
#                         default here: scheduler, so that only CONTROLLER_GPU is the
#                         controller's and the native tests keep their shareable GPUs)
#   MPS_PROTOCOL          the mps-agent's (and so the plugin's) MPS protocol for whole
#                         GPUs: v3 | legacy | auto (default: v3, as the fake speaks it;
#                         legacy daemons serve one namespace each, so the scheduler
#                         gets those GPUs whole: see tenancy in the chart's values)
#   CONTROLLER_ENABLED    run the controller Deployment (default: true)
#   CONTROLLER_GPU        index of the GPU that the controller allocates on each
#                         opted-in node (allocator: controller, a per-node setting), so
#                         both paths are tested on one cluster (default: 2; empty:
#                         none; ignored with CONTROLLER_ENABLED=false)
#   MPS_MIG_GPU           index of the MIG-enabled GPU whose MIG instances are MPS-shared
#                         on each opted-in node (sharing: mps and tenancy: cooperative
#                         in its own per-node entry;
#                         a node-wide sharing leaves MIG instances exclusive), for the
#                         mig-mps-shares example (default: 4; empty: none)
#   ARTIFACTS_DIR         where collect-diagnostics.sh and the e2e tests write
#                         (default: ${TMPDIR:-/tmp}/fractional-gpu-dra-e2e/<cluster>)
#   VENV, PYTHON          see hack/common.sh

KIND_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../common.sh
source "${KIND_DIR}/../common.sh"

: "${K8S_VERSION:=1.36}"
case "${K8S_VERSION}" in
  1.34) _default_node_image="kindest/node:v1.34.11" ;;
  1.36) _default_node_image="kindest/node:v1.36.4" ;;
  # kind v0.33.0's own default image (its release notes pin this digest).
  1.37) _default_node_image="kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5" ;;
  *)
    echo "hack/kind: K8S_VERSION=${K8S_VERSION} has no cluster config; use 1.34, 1.36 or 1.37" >&2
    return 1
    ;;
esac
: "${KIND_CLUSTER_NAME:=fractional-gpu-dra-${K8S_VERSION//./-}}"
: "${KIND_NODE_IMAGE:=${_default_node_image}}"
: "${KIND_CLUSTER_CONFIG:=${KIND_DIR}/cluster-${K8S_VERSION}.yaml}"
: "${KIND_KUBECONFIG:=${HOME}/.kube/kind-${KIND_CLUSTER_NAME}}"

# tool NAME: NAME from PATH, else hack/bin/NAME (hack/install-helm.sh), else NAME.
tool() {
  if command -v "$1" >/dev/null 2>&1; then
    echo "$1"
  elif [[ -x "${ROOT}/hack/bin/$1" ]]; then
    echo "${ROOT}/hack/bin/$1"
  else
    echo "$1"
  fi
}
: "${KIND:=$(tool kind)}"
: "${KUBECTL:=$(tool kubectl)}"
: "${HELM:=$(tool helm)}"

_version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "${ROOT}/pyproject.toml" | head -n 1)"
: "${IMAGE_NAME:=fractional-gpu-dra}"
: "${IMAGE_TAG:=v${_version}}"

: "${DRIVER_NAME:=gpu.fractional.dev}"
: "${DRIVER_NAMESPACE:=fractional-gpu-dra}"
: "${HELM_RELEASE:=fractional-gpu-dra}"
: "${CHART_DIR:=${ROOT}/deploy/helm/fractional-gpu-dra}"
: "${FAKE_GPUS:=h100-80gb:3,h100-80gb:2:mig}"
: "${NODE_LABEL_KEY:=gpu.fractional.dev/enabled}"
: "${NODE_LABEL_VALUE:=true}"
: "${GPU_NODE_SELECTOR:=!node-role.kubernetes.io/control-plane}"
: "${ALLOCATOR:=scheduler}"
: "${MPS_PROTOCOL:=v3}"
: "${CONTROLLER_ENABLED:=true}"
: "${CONTROLLER_GPU=2}"
: "${MPS_MIG_GPU=4}"
: "${ARTIFACTS_DIR:=${TMPDIR:-/tmp}/fractional-gpu-dra-e2e/${KIND_CLUSTER_NAME}}"

# require TOOL...: fail with a hint when a tool is missing.
require() {
  local missing=()
  local t
  for t in "$@"; do
    command -v "${t}" >/dev/null 2>&1 || missing+=("${t}")
  done
  if ((${#missing[@]} > 0)); then
    echo "missing tools: ${missing[*]} (kind: https://kind.sigs.k8s.io; helm and kubectl:" \
      "hack/install-helm.sh, or set KIND/KUBECTL/HELM)" >&2
    return 1
  fi
}

# kubectl with the kind cluster's kubeconfig.
kube() {
  "${KUBECTL}" --kubeconfig "${KIND_KUBECONFIG}" "$@"
}
