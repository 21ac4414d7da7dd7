"""An epoch as a dask array (issue 31): ``stream.to_dask()`` against dask's fancy index.

``python -m benchmarks --only todask [--rows N] [--rounds N]`` writes one store of
``ROWS`` x ``COLS`` float32 in ``CHUNK_ROWS``-row chunks (50 chunks, 12.8 MB: the
issue's example) and computes, for the same permutation (the exact shuffle's epoch
order, one window at the default ``memory_budget``), the exact stream's epoch array
``shuffled_batch_stream(x, ...).to_dask().compute()`` against
``da.from_zarr(x)[perm].compute()``, both on dask's threaded scheduler; and the same at
a quarter-dataset budget (4 windows, each decoding every chunk).  Each case's graph
size is the task count of its array before dask's optimisation (``len(arr.dask)``);
times are the medians of interleaved rounds.  Writes ``<out>/todask.md`` and
``todask.json``; the targets: >= 3x faster and a graph >= 50x smaller.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

import daskzarr_batches as dzb

ROWS = 50_000
COLS = 64
CHUNK_ROWS = 1_000
BATCH = 256
ROUNDS = 7
#: the targets of issue 31: against dask's fancy index for the same permutation
SPEEDUP = 3.0
SMALLER = 50.0

TO_DASK = "stream.to_dask().compute(): exact shuffle, default budget"
TO_DASK_QUARTER = "stream.to_dask().compute(): exact shuffle, windows of 1/4 dataset"
FANCY = "da.from_zarr(x)[perm].compute()"
ITERATED = "iterating the stream (batches of 256), default budget"


def make_store(data_dir: Path, rows: int) -> Path:
    """The store (written once): ``rows`` x ``COLS`` float32 of standard normals."""
    path = data_dir / f"todask_{rows}_c{COLS}_r{CHUNK_ROWS}.zarr"
    done = path / "complete"
    if not done.exists():
        x = zarr.create_array(
            path, shape=(rows, COLS), chunks=(CHUNK_ROWS, COLS), dtype="f4", overwrite=True
        )
        x[:] = np.random.default_rng(0).standard_normal((rows, COLS), dtype=np.float32)
        done.write_text("ok")
    return path


def _quarter_budget(x: zarr.Array) -> int:
    """The smallest ``memory_budget`` (to 1/8) whose exact windows are 4: a quarter each."""
    budget = x.nbytes // 16
    while dzb.plan_epoch(x, BATCH, shuffle=True, seed=0, memory_budget=budget).n_windows > 4:
        budget = budget * 9 // 8
    return budget


def measure(data_dir: Path, rows: int, repeats: int) -> dict[str, Any]:
    """Every case's tasks, seconds per round and its check against the permutation."""
    path = make_store(data_dir, rows)
    x = zarr.open_array(path, mode="r")
    budgets = {TO_DASK: None, TO_DASK_QUARTER: _quarter_budget(x)}
    arrays: dict[str, Callable[[], da.Array]] = {}
    perm: np.ndarray | None = None
    windows: dict[str, int] = {}
    for name, budget in budgets.items():
        kwargs = {} if budget is None else {"memory_budget": budget}
        stream = dzb.shuffled_batch_stream(x, BATCH, seed=0, **kwargs)
        order = np.concatenate(list(stream.plan.window_samples()))
        assert perm is None or np.array_equal(order, perm)  # one permutation, any budget
        perm = order
        windows[name] = stream.to_dask().numblocks[0]
        arrays[name] = lambda s=stream: s.to_dask()
    assert perm is not None
    arrays[FANCY] = lambda: da.from_zarr(x)[perm]
    want = x[:][perm]
    for name, make in arrays.items():  # each computes the same epoch
        assert np.array_equal(make().compute(), want), name
    tasks = {name: len(make().dask) for name, make in arrays.items()}
    runs: dict[str, Callable[[], object]] = {
        name: (lambda make=make: make().compute()) for name, make in arrays.items()
    }  # the graph is built in the round, as a user would
    runs[ITERATED] = lambda: sum(len(b) for b in dzb.shuffled_batch_stream(x, BATCH, seed=0))
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run_case in runs.items():
            started = time.perf_counter()
            run_case()
            seconds[name].append(time.perf_counter() - started)
    return {
        "rows": rows,
        "bytes": int(want.nbytes),
        "chunks": -(-rows // CHUNK_ROWS),
        "windows": windows,
        "tasks": tasks,
        "seconds": seconds,
        "repeats": repeats,
    }


def evaluate(results: dict[str, Any]) -> list[dict[str, str]]:
    """The two targets, for the default-budget case."""
    median = {name: statistics.median(s) for name, s in results["seconds"].items()}
    speedup = median[FANCY] / median[TO_DASK]
    smaller = results["tasks"][FANCY] / results["tasks"][TO_DASK]
    return [
        {
            "what": f"to_dask() of the exact shuffle >= {SPEEDUP:g}x faster than the fancy index",
            "measured": f"{speedup:.1f}x",
            "status": "PASS" if speedup >= SPEEDUP else "MISS",
        },
        {
            "what": f"its graph >= {SMALLER:g}x smaller (tasks)",
            "measured": f"{smaller:.0f}x",
            "status": "PASS" if smaller >= SMALLER else "MISS",
        },
    ]


def report(results: dict[str, Any], checks: list[dict[str, str]], command: str, now: str,
           load: tuple[float, ...]) -> str:  # fmt: skip
    """``todask.md``: the setting, one row per case and the targets."""
    median = {name: statistics.median(s) for name, s in results["seconds"].items()}
    lines = [
        "# An epoch as a dask array (issue 31)",
        "",
        f"`{command}` on {now}: one local directory store of {results['rows']:,} x {COLS} "
        f"float32 ({results['bytes'] / 1e6:.1f} MB) in {CHUNK_ROWS}-row chunks "
        f"({results['chunks']} chunks), zarr's default codec (zstd); the exact shuffle's "
        "epoch order (seed 0) computed as `shuffled_batch_stream(x, 256, seed=0)"
        ".to_dask()` and as `da.from_zarr(x)[perm]` for the same permutation, dask's "
        f"threaded scheduler; {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"dask {dask.__version__}, zarr {zarr.__version__}, numpy {np.__version__}; load "
        f"average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end.  Tasks: "
        f"the array's graph before optimisation; seconds: medians of {results['repeats']} "
        "interleaved rounds (graph built in each), beside iterating the same stream's epoch.",
        "",
        "| case | windows (blocks) | tasks | median s | MB/s | fancy index / case |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in results["seconds"]:
        blocks = results["windows"].get(name)
        lines.append(
            f"| {name} | {blocks if blocks is not None else '-'} "
            f"| {format(results['tasks'][name], ',') if name in results['tasks'] else '-'} "
            f"| {median[name]:.3f} | {results['bytes'] / median[name] / 1e6:,.0f} "
            f"| {median[FANCY] / median[name]:.1f}x |"
        )
    lines += [
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {c['what']} | {c['measured']} | {c['status']} |" for c in checks),
    ]
    return "\n".join(lines) + "\n"


def run(options: Any) -> None:
    """``--only todask``: measure, evaluate, write ``todask.md`` and ``todask.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    repeats = options.rounds or ROUNDS
    rows = options.rows or ROWS
    load = os.getloadavg()
    results = measure(data_dir, rows, repeats)
    load_after = os.getloadavg()
    checks = evaluate(results)
    command = (
        "python -m benchmarks --only todask"
        + (f" --rounds {repeats}" if repeats != ROUNDS else "")
        + (f" --rows {rows}" if rows != ROWS else "")
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = report(results, checks, command, now, (load[0], load_after[0]))
    (out / "todask.md").write_text(text)
    payload = {"command": command, "date": now, "load": [load, load_after], **results,
               "targets": checks}  # fmt: skip
    (out / "todask.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)
