#!/usr/bin/env bash
# Run every check CI runs: ruff (lint + format), mypy (strict), pytest.
#
# Usage:       hack/test.sh [PYTEST_ARGS...]
# Required:    python3 (3.11+) with venv; network access to PyPI on first run.
# Environment: VENV, PYTHON (see hack/common.sh).
# e2e tests run only when KUBECONFIG points at a cluster; they skip otherwise.
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
cd "${ROOT}"
ensure_venv test

echo "== ruff"
"${VENV}/bin/ruff" check dra_driver tests hack
"${VENV}/bin/ruff" format --check dra_driver tests hack
echo "== mypy"
"${VENV}/bin/mypy"
echo "== pytest"
"${VENV}/bin/pytest" "$@"
