#!/usr/bin/env python3
"""Draw the layers of ``dra_driver/`` in docs/architecture.md from the import contracts.

The import contracts in ``pyproject.toml`` (``[tool.importlinter]``) are what
``lint-imports`` enforces; this script renders them (the layer diagrams, the
independence and forbidden-import contracts) and each module's one-line purpose,
taken from its docstring, into the block of docs/architecture.md between the
``BEGIN layers`` and ``END layers`` markers. So the page cannot drift from the
contracts: ``tests/unit/test_architecture_doc.py`` fails when the block differs
from a fresh rendering.

Usage:  hack/docs_layers.py            print the block
        hack/docs_layers.py --check    exit 1 (with a diff) when the page is stale
        hack/docs_layers.py --write    rewrite the block in the page
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
PAGE = ROOT / "docs" / "architecture.md"
BEGIN = (
    "<!-- BEGIN layers: drawn by hack/docs_layers.py from pyproject.toml's import "
    "contracts and the modules' docstrings; edit those, then run `hack/docs_layers.py --write` -->"
)
END = "<!-- END layers -->"


class DocsLayersError(Exception):
    """The contracts, a module or the page cannot be drawn; the message says which and why."""


@dataclass(frozen=True)
class Layer:
    """One line of a layers contract: its modules and whether they are independent."""

    modules: tuple[str, ...]
    independent: bool  # "|" in the contract: siblings may not import each other; ":" they may


def parse_layer(spec: str) -> Layer:
    """A layer as import-linter writes it: ``a | b`` (independent) or ``a : b``."""
    if "|" in spec and ":" in spec:
        raise DocsLayersError(f"layer {spec!r} mixes '|' and ':'; import-linter takes one kind")
    separator = ":" if ":" in spec else "|"
    modules = tuple(part.strip() for part in spec.split(separator))
    if not all(modules):
        raise DocsLayersError(f"layer {spec!r} has an empty module name")
    return Layer(modules=modules, independent=separator == "|")


def contracts(pyproject_text: str) -> list[dict[str, Any]]:
    """The import-linter contracts of a pyproject.toml's text, in their order."""
    config = tomllib.loads(pyproject_text).get("tool", {}).get("importlinter", {})
    found = config.get("contracts")
    if not isinstance(found, list) or not found:
        raise DocsLayersError("pyproject.toml has no [[tool.importlinter.contracts]]")
    return found


def short(module: str) -> str:
    """A module's name without the root package, as the page writes it."""
    return module.removeprefix("dra_driver.")


def module_path(module: str, root: Path) -> Path:
    """The file that holds ``module``'s docstring: ``x/y.py`` or ``x/y/__init__.py``."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise DocsLayersError(f"{module} is named in an import contract but no {base}.py or package")


_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")


def purpose(module: str, root: Path) -> str:
    """The first paragraph of a module's docstring, on one line, in Markdown."""
    path = module_path(module, root)
    doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)))
    if not doc:
        raise DocsLayersError(f"{path} has no docstring: say in one line what {module} holds")
    first = " ".join(doc.split("\n\n", 1)[0].split())

    def role(match: re.Match[str]) -> str:
        target = match.group(2)
        return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"

    return _ROLE.sub(role, first).replace("``", "`").replace("|", "\\|")


def display_path(module: str, root: Path) -> str:
    """How the table names a module: ``plugin/`` for a package, ``demo.py`` for a module."""
    path = module_path(module, root).relative_to(root / "dra_driver")
    if path.name == "__init__.py":
        return f"{path.parent.as_posix()}/"
    return path.as_posix()


def draw_layers(contract: dict[str, Any], root: Path) -> list[str]:
    containers: list[str] = contract.get("containers", [])
    if len(containers) > 1:
        raise DocsLayersError(f"contract {contract['name']!r}: one container at most is drawn")
    prefix = f"{containers[0]}." if containers else ""
    layers = [parse_layer(spec) for spec in contract["layers"]]
    where = f" (inside `{short(containers[0])}`)" if containers else ""
    lines = [f"{title(contract)}{where}, top layer first:", "", "```"]
    for layer in layers:
        joiner = " | " if layer.independent else " : "
        lines.append(joiner.join(short(prefix + name) for name in layer.modules))
    lines += ["```", "", "| layer | module | what it holds |", "| --- | --- | --- |"]
    for number, layer in enumerate(layers, start=1):
        for position, name in enumerate(layer.modules):
            module = prefix + name
            cell = str(number) if position == 0 else ""
            text = purpose(module, root)
            lines.append(f"| {cell} | `{display_path(module, root)}` | {text} |")
    return lines


def title(contract: dict[str, Any]) -> str:
    """A contract's name in bold, its underscores escaped (``__init__`` is no emphasis)."""
    return "**" + str(contract["name"]).replace("_", "\\_") + "**"


def names(modules: Sequence[str]) -> str:
    return ", ".join(f"`{short(m)}`" for m in modules)


def draw_independence(contract: dict[str, Any]) -> list[str]:
    return [f"{title(contract)}: {names(contract['modules'])} import none of each other."]


def draw_forbidden(contract: dict[str, Any]) -> list[str]:
    sources = contract["source_modules"]
    forbidden = contract["forbidden_modules"]
    subject = "the driver" if sources == ["dra_driver"] else names(sources)
    line = f"{title(contract)}: no module of {subject} imports {names(forbidden)}"
    # import-linter forbids indirect imports too unless the contract allows them.
    line += (
        " directly" if contract.get("allow_indirect_imports") else ", directly or through another"
    )
    exceptions = [rule.split("->")[0].strip() for rule in contract.get("ignore_imports", [])]
    if exceptions:
        line += f", except {names(exceptions)}"
    return [line + "."]


def render(pyproject_text: str, root: Path) -> str:
    """The page's block: every contract drawn, in the order pyproject.toml lists them."""
    parts: list[list[str]] = []
    for contract in contracts(pyproject_text):
        kind = contract.get("type")
        if kind == "layers":
            parts.append(draw_layers(contract, root))
        elif kind == "independence":
            parts.append(draw_independence(contract))
        elif kind == "forbidden":
            parts.append(draw_forbidden(contract))
        else:
            raise DocsLayersError(
                f"contract {contract.get('name')!r} has type {kind!r}, which this script does "
                "not draw: teach hack/docs_layers.py to draw it"
            )
    body = "\n\n".join("\n".join(part) for part in parts)
    return f"{BEGIN}\n\n{body}\n\n{END}"


def current_block(page_text: str) -> tuple[int, int]:
    """Where the drawn block starts and ends in the page (END marker included)."""
    start = page_text.find(BEGIN)
    end = page_text.find(END)
    if start < 0 or end < start:
        raise DocsLayersError(
            f"{PAGE.relative_to(ROOT)} has no block between {BEGIN!r} and {END!r}: "
            "put the two markers where the layers are to be drawn"
        )
    return start, end + len(END)


def stale(page_text: str, drawn: str) -> list[str]:
    """A unified diff from the page's block to the drawn one; empty when they agree."""
    start, end = current_block(page_text)
    return list(
        difflib.unified_diff(
            page_text[start:end].splitlines(),
            drawn.splitlines(),
            "docs/architecture.md",
            "drawn from pyproject.toml",
            lineterm="",
        )
    )


def replace_block(page_text: str, drawn: str) -> str:
    start, end = current_block(page_text)
    return page_text[:start] + drawn + page_text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the block in the page")
    args = parser.parse_args(argv)
    try:
        drawn = render(PYPROJECT.read_text(), ROOT)
        if args.check:
            diff = stale(PAGE.read_text(), drawn)
            if diff:
                print("\n".join(diff))
                print(
                    "docs/architecture.md is stale: run hack/docs_layers.py --write",
                    file=sys.stderr,
                )
                return 1
        elif args.write:
            PAGE.write_text(replace_block(PAGE.read_text(), drawn))
        else:
            print(drawn)
    except DocsLayersError as err:
        print(f"hack/docs_layers.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
