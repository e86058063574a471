"""The architecture's layering, checked on the import statements themselves.

The pure core must not reach I/O: no gRPC, no Kubernetes client, no NVML, no
``os``; only the adapter packages may import their library.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "dra_driver"

# (library prefix, folders or files under dra_driver/ allowed to import it)
OWNERS = {
    "kubernetes": ("k8s/",),
    # Only the backend imports it; the other gpu/nvml/ modules get it (or the tests' fake) from it.
    "pynvml": ("gpu/nvml/backend.py",),
    "grpc": ("kubeletplugin/", "testing/kubelet.py", "_gen/"),
    "prometheus_client": ("observability/", "controller/metrics.py", "mpsagent/metrics.py"),
}
CORE_FORBIDDEN = (
    "os", "socket", "subprocess", "fcntl", "grpc", "kubernetes", "pynvml", "yaml",
    "dra_driver.k8s", "dra_driver.gpu", "dra_driver.state", "dra_driver.kubeletplugin",
    "dra_driver.plugin", "dra_driver.testing", "dra_driver._gen",
)  # fmt: skip


def imports_of(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize(
    "path",
    [p for p in modules() if p.parent.name in ("core", "base")],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_core_is_pure(path: pathlib.Path) -> None:
    bad = sorted(n for n in imports_of(path) for f in CORE_FORBIDDEN if _matches(n, f))
    where = path.relative_to(PACKAGE).as_posix()
    assert not bad, f"dra_driver/{where} imports {bad}; the core must stay pure"


@pytest.mark.parametrize("library", sorted(OWNERS))
def test_libraries_only_in_their_adapter(library: str) -> None:
    offenders = []
    for path in modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if any(rel.startswith(owner) for owner in OWNERS[library]):
            continue
        if any(_matches(name, library) for name in imports_of(path)):
            offenders.append(rel)
    assert not offenders, f"{library} imported outside {OWNERS[library]}: {offenders}"


def test_the_checks_see_imports() -> None:
    # Guard against a checker that silently finds nothing.
    assert "grpc" in imports_of(PACKAGE / "kubeletplugin" / "server.py")
    assert any(
        _matches(n, "kubernetes") for f in (PACKAGE / "k8s").glob("*.py") for n in imports_of(f)
    )


def test_protocol_plumbing_does_not_know_the_daemon() -> None:
    """kubeletplugin/ is the Python twin of the Go kubeletplugin helper: no driver logic."""
    offenders = [
        path.name
        for path in (PACKAGE / "kubeletplugin").glob("*.py")
        if any(_matches(n, "dra_driver.plugin") for n in imports_of(path))
    ]
    assert not offenders, f"kubeletplugin modules import dra_driver.plugin: {offenders}"
