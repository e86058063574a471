"""What the container image removes is never imported by the driver.

``deploy/container/Dockerfile`` installs the wheel with its dependencies, then
uninstalls the packages in its ``UNUSED`` argument and deletes
``kubernetes/aio`` and ``cel/cli.py``. The build itself imports every module and
runs the demo; this test catches a new import of a removed package earlier,
without a Docker engine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
REMOVED_MODULES = ("kubernetes.aio", "cel.cli")


def unused_distributions() -> list[str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    match = re.search(r'^ARG UNUSED="([^"]*)"', text, re.MULTILINE)
    assert match, "no ARG UNUSED in the Dockerfile"
    return match.group(1).split()


def removed_imports() -> set[str]:
    """Top-level import names of the removed distributions (as installed here)."""
    by_dist: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    names: set[str] = set()
    for dist in unused_distributions():
        assert dist in by_dist, f"{dist}: not installed here; is it still a dependency?"
        names |= by_dist[dist]
    return names


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_the_driver_imports_nothing_the_image_removes() -> None:
    removed = removed_imports()
    assert {"typer", "rich", "pygments", "aiohttp_retry"} <= removed
    assert "aiohttp" not in removed  # the API transport (k8s/transport.py)
    offending = []
    for path in sorted((ROOT / "dra_driver").rglob("*.py")):
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in removed or any(
                name == m or name.startswith(m + ".") for m in REMOVED_MODULES
            ):
                offending.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offending, "the image removes these: " + ", ".join(offending)


def test_removed_packages_are_not_our_own_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = set()
    for dependency in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9_.-]+", dependency)
        assert match, dependency
        ours.add(match.group().lower())
    assert not ours & set(unused_distributions())


def _dockerfile_python() -> str:
    match = re.search(r"^ARG PYTHON_VERSION=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "no ARG PYTHON_VERSION in the Dockerfile"
    return match.group(1)


def test_the_image_runs_the_python_the_tests_run_on() -> None:
    """The image's base (``python:<version>-slim``) is the version CI sets up and mypy
    checks for, so no behaviour of another interpreter reaches the pods untested."""
    image = _dockerfile_python()
    workflows = [ROOT / ".github" / "workflows" / n for n in ("ci.yaml", "e2e.yaml")]
    for workflow in workflows:
        versions = re.findall(r'python-version:\s*"([^"]+)"', workflow.read_text())
        assert versions, f"{workflow.name}: no python-version"
        assert set(versions) == {image}, f"{workflow.name} tests on {versions}, image: {image}"
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["python_version"] == image
    assert "FROM python:${PYTHON_VERSION}-slim" in DOCKERFILE.read_text()
