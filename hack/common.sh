#!/usr/bin/env bash
# Shared settings for the hack/ scripts; source it, don't run it.
#
# Environment:
#   VENV    virtual environment to create/use (default: <repo>/.venv)
#   PYTHON  interpreter that creates the venv (default: python3; needs 3.11+)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${VENV:=${ROOT}/.venv}"
: "${PYTHON:=python3}"

# ensure_venv EXTRAS: create the venv if missing and install the project
# (editable) with the given extras, e.g. "test"; quiet unless it fails. Then
# build the fake MPS control's native client where a C compiler exists (one
# line on stderr where not: the sh client serves).
ensure_venv() {
  local extras="${1:-}"
  if [[ ! -x "${VENV}/bin/python" ]]; then
    "${PYTHON}" -m venv "${VENV}"
    "${VENV}/bin/python" -m pip install --quiet --upgrade pip
  fi
  local target="${ROOT}"
  [[ -n "${extras}" ]] && target="${ROOT}[${extras}]"
  "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check -e "${target}"
  "${ROOT}/hack/build-fake-mps-client.sh"
}
