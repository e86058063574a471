"""The fake ``nvidia-cuda-mps-control``'s FIFO clients for tests: the sh launcher, and the
native client built for this test session (so the tests do not depend on an install step
having built it, and test the current source, never a stale build)."""

from __future__ import annotations

import os
import subprocess
from typing import NamedTuple

from dra_driver.fakes.mps_control import shell_control_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_SCRIPT = os.path.join(REPO, "hack", "build-fake-mps-client.sh")


class NativeBuild(NamedTuple):
    path: str | None
    """The built client; None where it could not be built."""
    why_not: str
    """What the build script said where it built nothing."""


def build_native_client(root: str) -> NativeBuild:
    """The native client built by ``hack/build-fake-mps-client.sh`` under ``root``, laid
    out as in the package (``fakes/native/build/``, beside a ``fakes/bin`` that is the
    package's: the client hands over to ``../../bin/nvidia-cuda-mps-control``)."""
    fakes = os.path.join(root, "fakes")
    os.makedirs(os.path.join(fakes, "native", "build"))
    os.symlink(os.path.dirname(shell_control_path()), os.path.join(fakes, "bin"))
    binary = os.path.join(fakes, "native", "build", "nvidia-cuda-mps-control")
    done = subprocess.run(
        [BUILD_SCRIPT, binary], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0 or not os.access(binary, os.X_OK):
        return NativeBuild(None, (done.stderr or done.stdout).strip() or "nothing built")
    return NativeBuild(binary, "")
