#!/usr/bin/env bash
# Build the driver's container image from deploy/container/Dockerfile.
#
# One image serves every component (kubelet plugin, mps-agent, controller); the
# chart picks the subcommand. The build context is the repository root, cut
# down to pyproject.toml, README.md and dra_driver/ by
# deploy/container/Dockerfile.dockerignore (needs BuildKit, the default in
# Docker 23+ and in Podman/Buildah).
#
# Usage:       hack/build-image.sh [EXTRA_BUILD_ARGS...]
#                e.g. hack/build-image.sh --platform linux/amd64 --push
# Required:    docker (with BuildKit) or podman, per CONTAINER_TOOL.
# Environment:
#   CONTAINER_TOOL  docker | podman (default: docker if found, else podman)
#   IMAGE_NAME      image repository (default: fractional-gpu-dra)
#   IMAGE_TAG       image tag (default: v<version in pyproject.toml>)
#   PYTHON_VERSION  the python:<version>-slim base (default: the Dockerfile's, 3.11, the
#                   Python CI tests on)
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
cd "${ROOT}"

if [[ -z "${CONTAINER_TOOL:-}" ]]; then
  if command -v docker >/dev/null 2>&1; then
    CONTAINER_TOOL=docker
  elif command -v podman >/dev/null 2>&1; then
    CONTAINER_TOOL=podman
  else
    echo "build-image.sh: neither docker nor podman found; install one or set CONTAINER_TOOL" >&2
    exit 1
  fi
fi

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)"
if [[ -z "${version}" ]]; then
  echo "build-image.sh: no version = \"...\" line in pyproject.toml" >&2
  exit 1
fi
: "${IMAGE_NAME:=fractional-gpu-dra}"
: "${IMAGE_TAG:=v${version}}"

build_args=(--build-arg "VERSION=${version}")
[[ -n "${PYTHON_VERSION:-}" ]] && build_args+=(--build-arg "PYTHON_VERSION=${PYTHON_VERSION}")

export DOCKER_BUILDKIT=1
set -o xtrace
"${CONTAINER_TOOL}" build \
  --file deploy/container/Dockerfile \
  --tag "${IMAGE_NAME}:${IMAGE_TAG}" \
  "${build_args[@]}" \
  "$@" \
  .
