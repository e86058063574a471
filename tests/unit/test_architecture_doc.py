"""docs/architecture.md draws the layers as pyproject.toml's import contracts have them.

The drawing is made by ``hack/docs_layers.py``; these tests keep the page equal to
a fresh drawing, show that a changed contract or module makes it stale, and
check that every package of the driver is placed in a layer (so the page's table
describes all of them).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_docs_layers() -> ModuleType:
    path = ROOT / "hack" / "docs_layers.py"
    spec = importlib.util.spec_from_file_location("docs_layers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_layers", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


docs_layers = load_docs_layers()
PYPROJECT = (ROOT / "pyproject.toml").read_text()
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def test_the_page_draws_the_contracts_as_they_are() -> None:
    diff = docs_layers.stale(PAGE, docs_layers.render(PYPROJECT, ROOT))
    assert not diff, "docs/architecture.md is stale: run hack/docs_layers.py --write\n" + "\n".join(
        diff
    )


def test_a_module_moved_to_another_layer_makes_the_page_stale() -> None:
    moved = PYPROJECT.replace(
        '"dra_driver.mpsagent | dra_driver.allocator"', '"dra_driver.allocator"'
    )
    moved = moved.replace('"dra_driver.cli",', '"dra_driver.cli",\n  "dra_driver.mpsagent",')
    assert moved != PYPROJECT, "the contract this test edits has changed: edit the test"
    diff = docs_layers.stale(PAGE, docs_layers.render(moved, ROOT))
    assert any(line.startswith("+") and "mpsagent" in line for line in diff)


def test_a_new_library_rule_makes_the_page_stale() -> None:
    extra = PYPROJECT + (
        '\n[[tool.importlinter.contracts]]\nname = "YAML only in k8s"\ntype = "forbidden"\n'
        'source_modules = ["dra_driver"]\nforbidden_modules = ["yaml"]\n'
    )
    diff = docs_layers.stale(PAGE, docs_layers.render(extra, ROOT))
    assert (
        "+**YAML only in k8s**: no module of the driver imports `yaml`,"
        " directly or through another." in diff
    )


def test_a_changed_docstring_makes_the_page_stale(tmp_path: Path) -> None:
    pyproject = (
        '[[tool.importlinter.contracts]]\nname = "Layers"\ntype = "layers"\n'
        'layers = ["dra_driver.top", "dra_driver.bottom"]\n'
    )
    package = tmp_path / "dra_driver"
    (package / "top").mkdir(parents=True)
    (package / "top" / "__init__.py").write_text(
        '"""The top: uses :class:`~dra_driver.bottom.Thing`."""\n'
    )
    (package / "bottom.py").write_text('"""The bottom, with a ``Thing``.\n\nMore detail."""\n')
    before = docs_layers.render("[tool.importlinter]\n" + pyproject, tmp_path)
    assert "| 1 | `top/` | The top: uses `Thing`. |" in before
    assert "| 2 | `bottom.py` | The bottom, with a `Thing`. |" in before

    (package / "bottom.py").write_text('"""The bottom, renamed."""\n')
    after = docs_layers.render("[tool.importlinter]\n" + pyproject, tmp_path)
    assert docs_layers.stale(docs_layers.replace_block(PAGE, before), after)


def test_a_module_without_a_docstring_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "dra_driver").mkdir()
    (tmp_path / "dra_driver" / "silent.py").write_text("X = 1\n")
    pyproject = (
        '[[tool.importlinter.contracts]]\nname = "L"\ntype = "layers"\n'
        'layers = ["dra_driver.silent"]\n'
    )
    with pytest.raises(docs_layers.DocsLayersError, match=r"silent\.py has no docstring: say"):
        docs_layers.render(pyproject, tmp_path)


def test_a_page_without_the_markers_is_refused_with_the_fix() -> None:
    with pytest.raises(docs_layers.DocsLayersError, match="put the two markers"):
        docs_layers.stale("# no block here\n", docs_layers.render(PYPROJECT, ROOT))


def test_every_package_of_the_driver_is_in_a_layer() -> None:
    contract = docs_layers.contracts(PYPROJECT)[0]
    assert contract["type"] == "layers" and "containers" not in contract
    placed = {
        module for spec in contract["layers"] for module in docs_layers.parse_layer(spec).modules
    }
    package = ROOT / "dra_driver"
    expected = set()
    for entry in package.iterdir():
        if entry.name in {"__init__.py", "_gen", "__pycache__", "py.typed"}:
            continue
        if entry.name == "fakes":  # placed module by module
            expected |= {
                f"dra_driver.fakes.{m.stem}" for m in entry.glob("*.py") if m.stem != "__init__"
            }
        elif entry.suffix == ".py" or (entry / "__init__.py").is_file():
            expected.add(f"dra_driver.{entry.stem}")
    assert placed == expected, "a module of dra_driver/ is in no layer (or a layer names none)"
