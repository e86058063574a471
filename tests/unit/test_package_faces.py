"""The rule CONTRIBUTING.md states for a package's ``__init__.py`` ("Packages and their faces").

* every package of ``dra_driver/`` (``_gen/`` aside) says in its ``__init__`` docstring
  what it holds;
* an ``__init__`` is either plain (its docstring alone; the root adds ``__version__``)
  or a face: it sets ``__all__``, and every name listed there is bound in it; an
  ``__init__`` that binds public names without ``__all__`` is neither;
* the packages in ``ENTERED_BY_FACE`` are entered by the rest of the driver only
  through their face: no module outside one of them imports its modules.

The files are read with :mod:`ast`, never imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dra_driver"

# Faces that are the only way in for the rest of the driver (tests and hack/ scripts
# test and measure modules, so they may reach inside). A package joins when nothing
# outside it imports its modules any more; CONTRIBUTING.md names the same list.
ENTERED_BY_FACE = (
    "dra_driver.cli",
    "dra_driver.core.cdi",
    "dra_driver.core.health",
    "dra_driver.core.slices",
    "dra_driver.dmemhook",
    "dra_driver.gpu.nvml",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def packages() -> list[Path]:
    return sorted(
        init for init in PACKAGE.rglob("__init__.py") if "_gen" not in init.relative_to(ROOT).parts
    )


def public_bindings(tree: ast.Module) -> set[str]:
    """Public names an ``__init__`` binds: definitions, assignments, ``from`` imports."""
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            bound |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            bound.add(node.target.id)
    return {name for name in bound if not name.startswith("_")}


def dunder_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list | tuple), "__all__ must be a literal list"
            return [str(name) for name in value]
    return None


@pytest.mark.parametrize("init", packages(), ids=module_name)
def test_every_package_says_what_it_holds(init: Path) -> None:
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and doc.strip(), f"{init.relative_to(ROOT)}: give the package a docstring"


@pytest.mark.parametrize("init", packages(), ids=module_name)
def test_an_init_is_plain_or_a_face(init: Path) -> None:
    tree = ast.parse(init.read_text())
    listed = dunder_all(tree)
    bound = public_bindings(tree)
    where = init.relative_to(ROOT)
    if listed is None:
        assert not bound, f"{where} binds {sorted(bound)} without __all__: list its face there"
    else:
        missing = sorted(set(listed) - bound - {"__version__"})
        assert not missing, f"{where}: __all__ lists {missing}, which the __init__ does not bind"
        assert len(set(listed)) == len(listed), f"{where}: __all__ lists a name twice"


def imported_modules(tree: ast.Module, importer: str, is_package: bool) -> Iterator[str]:
    """Each module an import may name: ``a.b`` and ``a.b.c`` for ``from a.b import c``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importer's package
                parts = importer.split(".")
                anchor = parts[: len(parts) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def driver_sources() -> Iterator[tuple[str, bool, str]]:
    """(module, whether it is a package's __init__, source) for each module of the driver."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "_gen" not in path.relative_to(ROOT).parts:
            yield module_name(path), path.name == "__init__.py", path.read_text()


def reach_ins(face: str, sources: Iterable[tuple[str, bool, str]]) -> set[tuple[str, str]]:
    """(importer, module of ``face``) for each module outside ``face`` that reaches in."""
    found: set[tuple[str, str]] = set()
    for importer, is_package, source in sources:
        if importer == face or importer.startswith(face + "."):
            continue
        for name in imported_modules(ast.parse(source), importer, is_package):
            if name.startswith(face + ".") and is_module(name):
                found.add((importer, name))
    return found


@pytest.mark.parametrize("face", ENTERED_BY_FACE)
def test_the_rest_of_the_driver_enters_these_packages_by_their_face(face: str) -> None:
    assert (PACKAGE.parent / Path(*face.split(".")) / "__init__.py").is_file()
    found = sorted(reach_ins(face, driver_sources()))
    assert not found, f"{found}: import these names from {face} itself"


def test_a_reach_in_is_found_however_it_is_spelled() -> None:
    sources = [
        ("dra_driver.plugin.x", False, "from dra_driver.core.cdi.spec import CdiSpec\n"),
        ("dra_driver.plugin.y", False, "from dra_driver.core.cdi import spec\n"),
        ("dra_driver.plugin.z", False, "def f():\n    import dra_driver.core.cdi.rules\n"),
        ("dra_driver.core.slices", True, "from ..cdi import spec\n"),
        ("dra_driver.plugin.face", False, "from dra_driver.core.cdi import CdiSpec\n"),
        ("dra_driver.core.cdi.spec", False, "from dra_driver.core.cdi.rules import x\n"),
    ]
    assert reach_ins("dra_driver.core.cdi", sources) == {
        ("dra_driver.plugin.x", "dra_driver.core.cdi.spec"),
        ("dra_driver.plugin.y", "dra_driver.core.cdi.spec"),
        ("dra_driver.plugin.z", "dra_driver.core.cdi.rules"),
        ("dra_driver.core.slices", "dra_driver.core.cdi.spec"),
    }


def test_a_public_name_without_all_is_refused() -> None:
    tree = ast.parse('"""Doc."""\nfrom x import y\nLIMIT = 3\nimport os\n')
    assert public_bindings(tree) == {"y", "LIMIT"}
    assert dunder_all(tree) is None
