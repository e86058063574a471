"""settle_heap: what a daemon holds after start-up is left out of later collections."""

from __future__ import annotations

import ast
import gc
import importlib
import pkgutil
from pathlib import Path

from dra_driver.app.heap import settle_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_settle_heap_freezes_what_is_alive_and_leaves_new_garbage_collectable() -> None:
    kept = [_Node() for _ in range(100)]
    try:
        settle_heap()
        assert gc.get_freeze_count() >= len(kept)
        # A cycle made after start-up is still found by the collector.
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


ENTRY_POINTS = {
    # module: the functions that may pass settle=True (each is what a process's main runs)
    "dra_driver/app/controller.py": {"run"},
    "dra_driver/app/agent.py": {"run_mps_agent"},
    "dra_driver/app/plugin_daemon.py": {"run_with_startup_checks"},
}
"""Where the heap is settled: each process's main, never on import, by library code
or by a test's in-process controller/plugin/agent (their ``settle`` defaults False)."""
GC_CHANGERS = {"freeze", "set_threshold", "disable"}


def _calls_in(path: Path) -> list[tuple[str, ast.Call]]:
    """(enclosing function or '<module>', call) for every call in ``path``."""
    found: list[tuple[str, ast.Call]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = (
                child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else where
            )
            if isinstance(child, ast.Call):
                found.append((where, child))
            visit(child, inner)

    visit(ast.parse(path.read_text()), "<module>")
    return found


def test_the_gc_is_changed_only_by_the_entry_points() -> None:
    root = Path(__file__).resolve().parents[2]
    changers, settlers = [], []
    for path in sorted((root / "dra_driver").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for where, call in _calls_in(path):
            func = call.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "gc"
                and func.attr in GC_CHANGERS
            ):
                changers.append((rel, where, func.attr))
            for keyword in call.keywords:
                if keyword.arg == "settle" and not (
                    isinstance(keyword.value, ast.Constant) and keyword.value.value is False
                ):
                    settlers.append((rel, where))
    assert sorted(changers) == [
        ("dra_driver/app/controller.py", "_settle_when_synced", "set_threshold"),
        ("dra_driver/app/heap.py", "settle_heap", "freeze"),
    ]
    defaults = _settle_defaults(root / "dra_driver")
    assert defaults and all(d is False for d in defaults.values()), defaults
    assert settlers, "no entry point settles the heap"
    for rel, where in settlers:
        assert where in ENTRY_POINTS.get(rel, set()), f"{rel}: {where} passes settle"


def test_importing_every_module_leaves_the_gc_as_it_was() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    import dra_driver

    for module in pkgutil.walk_packages(dra_driver.__path__, "dra_driver."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    assert gc.get_threshold() == threshold
    assert gc.get_freeze_count() == frozen


def _settle_defaults(package: Path) -> dict[str, object]:
    """Each function's default for a ``settle`` parameter: False, so that only a caller
    that asks (an entry point) settles the heap."""
    found: dict[str, object] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            args = node.args
            pairs: list[tuple[ast.arg, ast.expr | None]] = list(
                zip(args.args[::-1], args.defaults[::-1], strict=False)
            )
            pairs += zip(args.kwonlyargs, args.kw_defaults, strict=True)
            for arg, default in pairs:
                if arg.arg == "settle":
                    value = default.value if isinstance(default, ast.Constant) else default
                    found[f"{path.name}:{node.name}"] = value
    return found
