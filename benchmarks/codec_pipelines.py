"""zarr-python's codec pipeline against zarrs' Rust one, side by side in one process.

Each round runs every case once, in an order that rotates between rounds, on the
benchmark's dataset (``features``, float32, a local directory store)::

    python -m benchmarks --only codec-pipelines --data /work/bench-data     # 5 rounds, 1M rows
    python -m benchmarks --only codec-pipelines --rows 250000 --rounds 7

Cases: the raw decode limit (every chunk file read and decoded by numcodecs on one
thread per CPU, no Zarr), ``x[:]`` with each pipeline, and the sequential (batch
256) and buffered-shuffle (8 chunks) batch streams over ``open_array(...,
codec_pipeline=...)``.  It prints the median and best MB/s of each case and the
medians as ratios to the raw decode limit and to zarr's ``x[:]``, and the median
CPU seconds of the process per case (all threads, Rust ones included), which a
shared machine disturbs less than the wall clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import daskzarr_batches as dzb

from .internals import codec_pipeline_of, zarr_behind
from .suite.cases import raw_decode
from .suite.dataset import default_shape, make_dataset
from .suite.measure import consume as drain

#: default of ``--rounds``
ROUNDS = 5


def cases(path: Path, chunk_rows: int) -> dict[str, Callable[[], Any]]:
    threads = os.cpu_count() or 1
    arrays = {p: dzb.open_array(path / "features", codec_pipeline=p) for p in ("zarr", "zarrs")}
    zarr_arrays = {p: zarr_behind(a) for p, a in arrays.items()}
    for pipeline, opened in zarr_arrays.items():
        assert codec_pipeline_of(opened) == pipeline, pipeline
    x = zarr_arrays["zarr"]
    found: dict[str, Callable[[], Any]] = {
        f"raw decode, {threads} threads (limit)": lambda: raw_decode(x, path / "features", threads),
    }
    for pipeline in ("zarr", "zarrs"):
        array, whole = arrays[pipeline], zarr_arrays[pipeline]
        found[f"x[:] ({pipeline})"] = lambda whole=whole: whole[:]
        found[f"sequential batch_stream, batch 256 ({pipeline})"] = lambda a=array: drain(
            dzb.batch_stream(a, 256)
        )
        found[f"buffered shuffle (8 chunks), batch 256 ({pipeline})"] = lambda a=array: drain(
            dzb.shuffled_batch_stream(a, 256, shuffle_buffer_size=8 * chunk_rows, seed=0)
        )
    return found


def run(options: argparse.Namespace) -> None:
    """Print each case's median and best MB/s, ratios and CPU seconds."""
    default_rows, cols, chunk_rows = default_shape(False)
    args = argparse.Namespace(rows=options.rows or default_rows, rounds=options.rounds or ROUNDS)
    Path(options.data).mkdir(parents=True, exist_ok=True)
    dataset = make_dataset(Path(options.data), args.rows, cols, chunk_rows)
    nbytes = dataset.feature_bytes
    found = cases(dataset.path, chunk_rows)
    names = list(found)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm the page cache and the imports
        found[name]()
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            found[name]()
            seconds[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    mbs = {name: [nbytes / 1e6 / s for s in seconds[name]] for name in names}
    median = {name: statistics.median(v) for name, v in mbs.items()}
    limit = median[names[0]]
    zarr_all = median["x[:] (zarr)"]
    print(f"{args.rows:,} x {cols} float32, {chunk_rows}-row chunks, {args.rounds} rounds")
    print(
        f"{'case':52} {'median MB/s':>11} {'best':>7} {'/ raw':>6} {'/ zarr x[:]':>11} {'CPU s':>6}"
    )
    for name in names:
        print(
            f"{name:52} {median[name]:11.0f} {max(mbs[name]):7.0f} "
            f"{median[name] / limit:6.2f} {median[name] / zarr_all:11.2f} "
            f"{statistics.median(cpu[name]):6.2f}"
        )
