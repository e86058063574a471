#!/usr/bin/env bash
# Build the fake nvidia-cuda-mps-control's native client
# (dra_driver/fakes/native/fifo_client.c) where a C compiler exists. Without
# one, or when the build fails, it says so in one line on stderr and exits 0:
# the POSIX sh client (dra_driver/fakes/bin/nvidia-cuda-mps-control) serves.
# fake_control_path() picks the build only when it is not older than the source.
#
# Usage:       hack/build-fake-mps-client.sh [OUTPUT]
#              OUTPUT: the executable to write (default:
#              dra_driver/fakes/native/build/nvidia-cuda-mps-control, gitignored).
#              It must be named nvidia-cuda-mps-control and, for the client to find
#              the sh client it hands over to, sit at <package>/fakes/native/build/
#              (the tests build elsewhere with that layout).
# Required:    nothing (a C99 compiler to build anything).
# Environment: CC (default: cc), CFLAGS (default: -O2 -Wall -Wextra).
set -o errexit -o nounset -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SOURCE="${ROOT}/dra_driver/fakes/native/fifo_client.c"
OUTPUT="${1:-${ROOT}/dra_driver/fakes/native/build/nvidia-cuda-mps-control}"
: "${CC:=cc}"
: "${CFLAGS:=-O2 -Wall -Wextra}"

# Current already (the rule fake_control_path() applies): nothing to do at each set-up.
if [[ -x "${OUTPUT}" && ! "${SOURCE}" -nt "${OUTPUT}" ]]; then
  exit 0
fi
if ! command -v "${CC}" >/dev/null 2>&1; then
  echo "build-fake-mps-client: no C compiler (${CC}); the sh client serves" >&2
  exit 0
fi
mkdir -p "$(dirname "${OUTPUT}")"
# Built beside its place and renamed: a concurrent build or a command starting
# meanwhile never sees half a file.
tmp="$(mktemp "${OUTPUT}.XXXXXX")"
log="$(mktemp)"
trap 'rm -f "${tmp}" "${log}"' EXIT
# Static first: no dynamic loader at each start (most of a small program's start
# cost); dynamic where the C library has no static archive.
# shellcheck disable=SC2086 # CFLAGS is a list of flags
if "${CC}" -std=c99 ${CFLAGS} -static -o "${tmp}" "${SOURCE}" >"${log}" 2>&1 \
  || "${CC}" -std=c99 ${CFLAGS} -o "${tmp}" "${SOURCE}" >"${log}" 2>&1; then
  chmod 0755 "${tmp}"
  mv -f "${tmp}" "${OUTPUT}"
  exit 0
fi
echo "build-fake-mps-client: ${CC} failed ($(grep -m1 -i error "${log}" || head -n1 "${log}"));" \
  "the sh client serves" >&2
exit 0
