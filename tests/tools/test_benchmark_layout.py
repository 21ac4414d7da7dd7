"""``benchmarks/`` is one suite: every module imports, none edits ``sys.path``, no circles,
private library modules only in ``benchmarks/internals.py``, one command line for all."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

from benchmarks import command

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(BENCHMARKS.rglob("*.py"))}


def imported(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, at its top or inside functions, made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def edges() -> dict[str, set[str]]:
    """The import graph of ``benchmarks/`` (only edges between its own modules)."""
    return {
        name: {other for other in imported(name, path) if other in MODULES and other != name}
        for name, path in MODULES.items()
    }


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_benchmarks_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_no_import_circle_in_benchmarks() -> None:
    graph = edges()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise AssertionError(f"import circle: {cycle}")
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
    # the circle this test was written for: the targets know the store cases, not back
    assert "benchmarks.suite.targets" not in graph["benchmarks.suite.stores_cases"]


def test_no_benchmarks_file_edits_sys_path() -> None:
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


#: the public namespaces besides the top level (the plan's inspection types, the adapters)
PUBLIC_MODULES = {"daskzarr_batches.plan", "daskzarr_batches.torch", "daskzarr_batches.jax"}


def _public(module: str) -> bool:
    """A public namespace, or a name imported from one (``from daskzarr_batches.plan import X``)."""
    return any(module == m or module.rpartition(".")[0] == m for m in PUBLIC_MODULES) or (
        module.startswith(("daskzarr_batches.torch", "daskzarr_batches.jax"))
    )


def test_private_library_modules_only_in_the_internals_adapter() -> None:
    """Modules below the public surface move; only one file must follow them."""
    users = {
        name
        for name, path in MODULES.items()
        for other in imported(name, path)
        if other.startswith("daskzarr_batches.") and not _public(other)
    }
    assert users == {"benchmarks.internals"}


def test_tests_and_benchmarks_share_one_latency_store() -> None:
    classes = [
        f"{path.relative_to(ROOT)}:{node.name}"
        for path in [*MODULES.values(), *sorted((ROOT / "tests").rglob("*.py"))]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and ("Latency" in node.name or "Slow" in node.name)
    ]
    # tests/streams/test_stream_lifecycle.py's FirstReadSlowStore fails its first read:
    # not a latency
    assert [c for c in classes if "FirstRead" not in c] == [
        "benchmarks/latency_store.py:LatencyStore"
    ]


def test_every_benchmark_module_is_in_the_command() -> None:
    """Each benchmark's function exists, and every module of benchmarks/ has a role."""
    for benchmark in command.BENCHMARKS:
        assert callable(getattr(importlib.import_module(benchmark.module), benchmark.function))
    run_by_command = {benchmark.module for benchmark in command.BENCHMARKS}
    helpers = {
        "benchmarks", "benchmarks.__main__", "benchmarks.command", "benchmarks.internals",
        "benchmarks.latency_store", "benchmarks.s3_server", "benchmarks.suite",
        "benchmarks.suite.cache_cases", "benchmarks.suite.cases", "benchmarks.suite.dataset",
        "benchmarks.suite.measure", "benchmarks.suite.patch_cases",
        "benchmarks.suite.quality", "benchmarks.suite.report", "benchmarks.suite.stores_cases",
        "benchmarks.suite.targets", "benchmarks.suite.big_samples", "benchmarks.suite.collection",
        "benchmarks.suite.mixture", "benchmarks.suite.cpu", "benchmarks.suite.peers_s3",
        "benchmarks.suite.writes",
    }  # fmt: skip
    assert set(MODULES) == run_by_command | helpers


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    command.main(["--list"])
    listed = capsys.readouterr().out
    for benchmark in command.BENCHMARKS:
        assert f"\n{benchmark.name}" in f"\n{listed}"
    chosen, options = command.parse(["compare", "main", "--rounds", "3"])
    assert [b.name for b in chosen] == ["compare"] and options.old == "main"
    assert options.rounds == 3
    chosen, options = command.parse([])
    assert [b.name for b in chosen] == ["suite"] and options.rounds is None
    chosen, _ = command.parse(["--only", "latency,shards", "--latency", "0.1"])
    assert [b.name for b in chosen] == ["latency", "shards"]
    for argv, error in (
        (["--latency", "0.1"], "--latency: not an option of suite"),
        (["--only", "nope"], "no benchmark 'nope'"),
        (["--only", "compare"], "compare needs --old REF"),
        (["compare"], "compare needs the earlier commit"),
    ):
        with pytest.raises(SystemExit):
            command.parse(argv)
        assert error in capsys.readouterr().err


def test_the_benchmarks_page_lists_every_benchmark() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for benchmark in command.BENCHMARKS:
        assert f"\n| `{benchmark.name}`" in page, benchmark.name


def test_the_internals_adapter_still_reaches_what_it_wraps(tmp_path: Path) -> None:
    """Its imports are lazy: this is where a moved private module shows, in one place."""
    import numpy as np
    import zarr

    import daskzarr_batches as dzb
    from benchmarks import internals

    assert internals.exact_window_rows(1 << 20, 256) > 0
    z = zarr.create_array(tmp_path / "x.zarr", shape=(1024, 4), chunks=(256, 4), dtype="f4")
    z[:] = np.ones((1024, 4), dtype="f4")
    x = internals.zarr_behind(dzb.open_array(tmp_path / "x.zarr", codec_pipeline="zarr"))
    assert isinstance(x, zarr.Array) and internals.codec_pipeline_of(x) == "zarr"
    spent: dict[str, float] = {}
    with internals.time_batch_cutting(spent):
        stream = dzb.batch_stream(x, 100)
        assert sum(len(batch) for batch in stream) == 1024
    assert spent.get("cut", 0.0) > 0  # batches were cut through the wrapped function
    assert internals.peak_in_flight(stream) == 0  # known on a cluster only


def test_the_internals_adapter_reads_a_cluster_streams_windows_in_flight(
    tmp_path: Path, client: Any
) -> None:
    import numpy as np
    import zarr

    import daskzarr_batches as dzb
    from benchmarks import internals

    x = zarr.create_array(tmp_path / "x.zarr", shape=(1024, 4), chunks=(256, 4), dtype="f4")
    x[:] = np.ones((1024, 4), dtype="f4")
    stream = dzb.batch_stream(x, 100, client=client)
    assert sum(len(batch) for batch in stream) == 1024
    assert internals.peak_in_flight(stream) >= 1
