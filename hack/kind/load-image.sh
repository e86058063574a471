#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Load the driver image (built by hack/build-image.sh) into the kind nodes, so
# the chart's pods start without a registry (pullPolicy IfNotPresent).
#
# Usage:       hack/kind/load-image.sh
# Required:    kind; docker or podman holding IMAGE_NAME:IMAGE_TAG.
# Environment: IMAGE_NAME, IMAGE_TAG, CONTAINER_TOOL, KIND_CLUSTER_NAME
#              (see hack/kind/common.sh).
set -o errexit -o nounset -o pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${SCRIPT_DIR}/common.sh"
require "${KIND}"

image="${IMAGE_NAME}:${IMAGE_TAG}"
if [[ -z "${CONTAINER_TOOL:-}" ]]; then
  if command -v docker >/dev/null 2>&1; then CONTAINER_TOOL=docker; else CONTAINER_TOOL=podman; fi
fi

case "${CONTAINER_TOOL}" in
  docker)
    "${KIND}" load docker-image "${image}" --name "${KIND_CLUSTER_NAME}"
    ;;
  podman)
    # kind cannot read podman's image store: go through an archive.
    archive="$(mktemp "${TMPDIR:-/tmp}/fractional-gpu-dra-image.XXXXXX.tar")"
    trap 'rm -f "${archive}"' EXIT
    podman save --output "${archive}" "${image}"
    "${KIND}" load image-archive "${archive}" --name "${KIND_CLUSTER_NAME}"
    ;;
  *)
    echo "load-image.sh: CONTAINER_TOOL must be docker or podman, not ${CONTAINER_TOOL}" >&2
    exit 2
    ;;
esac
echo "loaded ${image} into kind cluster ${KIND_CLUSTER_NAME}"
