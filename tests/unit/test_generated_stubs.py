"""The committed stubs under ``dra_driver/_gen`` are exactly what ``hack/gen-proto.sh`` makes.

grpcio-tools is pinned in the test extra, so a fresh generation from
``proto/`` must be byte-identical; a difference means someone edited a
``.proto`` (or a generated file) without regenerating.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GEN = ROOT / "dra_driver" / "_gen"
SCRIPT = ROOT / "hack" / "gen-proto.sh"
FIX = "run hack/gen-proto.sh and commit the result"


def _files(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpc_tools (grpcio-tools, test extra) is not installed; cannot regenerate the stubs",
)
def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    result = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"hack/gen-proto.sh failed:\n{result.stdout}{result.stderr}"

    fresh, committed = _files(out), _files(GEN)
    assert fresh, "hack/gen-proto.sh generated nothing"
    missing = sorted(set(fresh) - set(committed))
    extra = sorted(set(committed) - set(fresh))
    assert not missing, f"generated files not committed under dra_driver/_gen: {missing}; {FIX}"
    assert not extra, f"files under dra_driver/_gen that the script does not make: {extra}; {FIX}"
    stale = sorted(name for name in fresh if fresh[name] != committed[name])
    assert not stale, f"committed stubs differ from a fresh generation: {stale}; {FIX}"
