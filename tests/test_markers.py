"""The markers of tests/conftest.py stay true: registered, and naming tests that exist."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_marker_is_registered() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    registered = {line.split(":", 1)[0] for line in markers}
    assert {"slow", "cluster", "s3", "torch", "jax"} | set(conftest.STARTS) <= registered


def test_the_slow_tests_exist() -> None:
    """A renamed or removed test must leave the list (or it would silently run in -m 'not slow')."""
    names, modules = set(), set()
    for path in TESTS.rglob("test_*.py"):
        modules.add(path.name)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert names >= conftest.SLOW, sorted(conftest.SLOW - names)
    assert modules >= conftest.SLOW_MODULES, sorted(conftest.SLOW_MODULES - modules)
