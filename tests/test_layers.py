"""The package's modules import one way: no cycle, lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "daskzarr_batches"


def imports_of(path: Path) -> tuple[set[str], set[str]]:
    """(package modules, third-party top-level names) imported anywhere in ``path``."""
    ours, theirs = set(), set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):  # function bodies too
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            ours |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            theirs.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            theirs |= {alias.name.split(".")[0] for alias in node.names}
    return ours, theirs


def module_graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__main__"}
    return {m: imports_of(p)[0] & (set(modules) - {"__init__", m}) for m, p in modules.items()}


def test_no_import_cycle_between_modules() -> None:
    graph = module_graph()
    order: list[str] = []
    visiting: list[str] = []

    def visit(module: str) -> None:
        if module in order:
            return
        assert module not in visiting, " -> ".join([*visiting, module])
        visiting.append(module)
        for dependency in sorted(graph[module]):
            visit(dependency)
        visiting.pop()
        order.append(module)

    for module in sorted(graph):
        visit(module)


def test_layers_point_down() -> None:
    graph = module_graph()
    # sources describe arrays; they know nothing of plans, tasks, runners or streams
    assert graph["_sources"] <= {"_errors"}
    assert graph["_batching"] == set()
    assert graph["_plan"] <= {"_batching"}
    assert "_spec" not in graph["_read"] | graph["_runners"]
    assert "_streams" not in graph["_read"] | graph["_runners"] | graph["_spec"]


def test_planning_is_pure_numpy() -> None:
    for module in ("_batching", "_plan"):
        _, theirs = imports_of(PACKAGE / f"{module}.py")
        assert theirs <= {"__future__", "numpy", "collections", "dataclasses", "functools", "math",
                          "itertools", "typing"}, (module, theirs)  # fmt: skip
