"""The package imports one way, in the order docs/architecture.md documents.

Every import counts: lazy ones inside functions, ``from . import name`` and
imports of the package root.  A module may import modules of its own
subpackage (without a cycle) and modules of the layers below its own, never
above or beside; only the command line (``tools``) and the PyTorch adapter sit
on the public API (the package root).  The module map of docs/architecture.md
names every module exactly once, and its layer line is this test's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "daskzarr_batches"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: bottom to top; the units of one layer do not import each other
LAYERS: list[set[str]] = [
    {"errors"},
    {"plan"},
    {"store"},
    {"execute", "fingerprints"},
    {"read"},
    {"streams"},
    {"loader", "mapreduce", "writes", "_torch_tensors", "_device_feed"},
    {"torch", "jax", "cupy", "tools", "readers"},
]
ON_THE_PUBLIC_API = {"tools"}  # may import the package root (``from .. import X``)
PURE_PLANNING = {"__future__", "numpy", "collections", "dataclasses", "functools", "math",
                 "itertools", "typing"}  # fmt: skip


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (``plan.windows``; the root is ``""``)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _package_of(name: str, path: Path) -> list[str]:
    parts = name.split(".") if name else []
    return parts if path.name == "__init__.py" else parts[:-1]


def imports_of(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(package modules, third-party top-level names) that ``name`` imports anywhere."""
    ours, theirs = set(), set()
    here = _package_of(name, path)
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[: len(here) - (node.level - 1)]
            target = ".".join(base + (node.module.split(".") if node.module else []))
            if node.module:
                ours.add(target)
            else:  # from . import x: a module of that package, or a name of its __init__
                for alias in node.names:
                    child = ".".join([*base, alias.name])
                    ours.add(child if child in known else target)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("daskzarr_batches"):
                ours.add(node.module.removeprefix("daskzarr_batches").lstrip("."))
            else:
                theirs.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            theirs |= {alias.name.split(".")[0] for alias in node.names}
    return ours, theirs


def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node, function bodies included, but not under ``if TYPE_CHECKING:`` (never run)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING"
        ):
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known)[0] - {name} for name, path in found.items()}


def unit(name: str) -> str:
    return name.split(".")[0]


def layer(name: str) -> int:
    (index,) = [i for i, units in enumerate(LAYERS) if unit(name) in units]
    return index


def test_every_module_is_in_a_layer() -> None:
    units = {unit(name) for name in modules() if name}
    assert units == set().union(*LAYERS), units ^ set().union(*LAYERS)


def test_no_import_cycle() -> None:
    edges = graph()
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in path, " -> ".join([*path, name])
        path.append(name)
        for target in sorted(edges.get(name, ())):
            if target in edges:
                visit(target)
        path.pop()
        done.add(name)

    for name in sorted(edges):
        if name:  # the root imports everything: it is the public surface
            visit(name)


def test_imports_point_down_the_documented_layers() -> None:
    wrong = []
    for name, targets in graph().items():
        if not name:
            continue
        for target in targets:
            if target == "":
                if unit(name) not in ON_THE_PUBLIC_API:
                    wrong.append(f"{name} imports the package root")
            elif unit(target) == unit(name):
                continue  # its own subpackage (cycles: test_no_import_cycle)
            elif layer(target) >= layer(name):
                wrong.append(f"{name} (layer {layer(name)}) imports {target} ({layer(target)})")
    assert wrong == [], "\n".join(sorted(wrong))


def test_planning_is_pure_numpy() -> None:
    known = set(modules())
    for name, path in modules().items():
        if unit(name) == "plan":
            _, theirs = imports_of(name, path, known)
            assert theirs <= PURE_PLANNING, (name, theirs - PURE_PLANNING)


def test_architecture_documents_this_order_and_every_module() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    (line,) = re.findall(r"^Layer order: (.+)$", text, re.M)
    documented = [{u.strip(" `") for u in group.split(",")} for group in line.split("->")]
    assert documented == LAYERS, line
    listed = re.findall(r"^\| `([a-z_/]+\.py)` \|", text, re.M)
    files = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name != "__main__.py" and not (p.name == "__init__.py" and p.parent != PACKAGE)
    )
    assert sorted(listed) == files, set(listed) ^ set(files)


#: the most lines a module of the package may have (issue 30)
MOST_LINES = 600


def test_no_module_over_600_lines() -> None:
    """A module past 600 lines is split by what its parts know (issue 30)."""
    too_long = [
        f"{path.relative_to(PACKAGE)}: {n} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES
    ]
    assert too_long == [], "split by what its parts know:\n" + "\n".join(too_long)


#: the most lines a function of the package may have, its docstring not counted (issue 38)
MOST_FUNCTION_LINES = 100


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from ``def`` to its last, less its docstring's."""
    lines = (node.end_lineno or node.lineno) - node.lineno + 1
    first = node.body[0]
    doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if doc and isinstance(first.value.value, str):  # type: ignore[attr-defined]
        lines -= (first.end_lineno or first.lineno) - first.lineno + 1
    return lines


def test_no_function_over_100_lines() -> None:
    """A function past 100 lines (its docstring aside) is split into named steps (issue 38)."""
    too_long = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {n} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := _function_lines(node)) > MOST_FUNCTION_LINES
    ]
    assert too_long == [], "split into named steps:\n" + "\n".join(too_long)
