"""``hack/test.sh`` (what CI runs) fails when a tool it needs cannot be installed.

Without helm the chart tests would skip and the run would look green; so a failed
``hack/install-helm.sh`` ends the run, before any check, with a message naming it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_test_script_fails_when_helm_cannot_be_installed(tmp_path: Path) -> None:
    env = {
        **os.environ,
        # An empty bin dir (no helm there yet) and a layer that pip cannot find.
        "BIN_DIR": str(tmp_path / "bin"),
        "LAYER_PACKAGE": str(tmp_path / "no-such-layer.whl"),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "test.sh"), "--co", "-q", "tests/unit/test_cli.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "hack/install-helm.sh failed" in done.stderr
    assert "the chart tests need helm" in done.stderr
    assert "== pytest" not in done.stdout and "== ruff" not in done.stdout
