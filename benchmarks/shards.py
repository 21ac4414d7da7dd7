"""Sharded vs unsharded batch streams, side by side, against zarr's own ``x[:]``.

Run from the repository root::

    python -m benchmarks --only shards               # 600,000 x 64 float32, 8192-row chunks
    python -m benchmarks --only shards --rows 100000 --rounds 2

Two arrays hold the same data: one with 8192-row chunks, one with the same
chunks inside shards of 8 chunks.  Each stream kind (sequential, buffered
shuffle of one shard, exact shuffle with the default budget, which holds the
whole array, and with a quarter-dataset budget, which reads it 4 times) and zarr's
``x[:]`` read each array without latency and through a wrapper store that
sleeps ``--latency`` seconds before every chunk / shard get (an object store's
request latency; :class:`~benchmarks.latency_store.LatencyStore`).  The arrays
(``--cols``, ``--chunk-rows``, ``--per-shard``) live in a temporary directory.
Cases run in interleaved rounds in one process; the best time of each is kept
and ratios compare cases of the same run only.  The
process CPU seconds of each case (least of the rounds) are shown too: on a
shared, oversubscribed machine they vary less than wall time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.storage

import daskzarr_batches as dzb

from .latency_store import LatencyStore
from .suite.measure import consume as drain

MB = 1e6
#: defaults of the options this benchmark reads
ROWS, COLS, CHUNK_ROWS, PER_SHARD, LATENCY, ROUNDS = 600_000, 64, 8192, 8, 0.02, 3


def make_arrays(root: Path, rows: int, cols: int, chunk_rows: int, per_shard: int) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((rows, cols), dtype=np.float32)
    for name, shards in (("plain", None), ("sharded", (chunk_rows * per_shard, cols))):
        array = zarr.create_array(
            zarr.storage.LocalStore(root / name),
            shape=(rows, cols),
            chunks=(chunk_rows, cols),
            shards=shards,
            dtype="f4",
        )
        array[:] = data


def open_array(root: Path, name: str, delay: float) -> zarr.Array:
    store: Any = zarr.storage.LocalStore(root / name, read_only=True)
    if delay:
        store = LatencyStore(store, delay)
    return zarr.open_array(store, mode="r")


def cases(x: zarr.Array, shard_rows: int) -> dict[str, Callable[[], Any]]:
    budget = x.nbytes // 4
    return {
        "zarr x[:]": lambda: x[:],
        "sequential": lambda: drain(dzb.batch_stream(x, 256)),
        "buffered": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=shard_rows)
        ),
        "exact": lambda: drain(dzb.shuffled_batch_stream(x, 256, seed=0)),
        "exact, budget 1/4": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, memory_budget=budget, prefetch=0)
        ),
    }


def run(options: argparse.Namespace) -> None:
    """Print the table: each kind, unsharded and sharded, without and with latency."""
    args = argparse.Namespace(
        rows=options.rows or ROWS,
        cols=options.cols or COLS,
        chunk_rows=options.chunk_rows or CHUNK_ROWS,
        per_shard=options.per_shard or PER_SHARD,
        latency=LATENCY if options.latency is None else options.latency,
        rounds=options.rounds or ROUNDS,
    )
    shard_rows = args.chunk_rows * args.per_shard
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_arrays(root, args.rows, args.cols, args.chunk_rows, args.per_shard)
        table: dict[tuple[float, str, str], Callable[[], Any]] = {}
        for delay in (0.0, args.latency):
            for name in ("plain", "sharded"):
                x = open_array(root, name, delay)
                for kind, run in cases(x, shard_rows).items():
                    table[(delay, name, kind)] = run
        best: dict[tuple[float, str, str], float] = {}
        cpu: dict[tuple[float, str, str], float] = {}
        for _ in range(args.rounds):
            for key, run in table.items():
                started, used = time.perf_counter(), time.process_time()
                run()
                seconds = time.perf_counter() - started
                best[key] = min(best.get(key, np.inf), seconds)
                cpu[key] = min(cpu.get(key, np.inf), time.process_time() - used)
        nbytes = args.rows * args.cols * 4
        print(
            f"{args.rows} x {args.cols} float32, {args.chunk_rows}-row chunks, "
            f"{args.per_shard} chunks per shard, best of {args.rounds} interleaved rounds"
        )
        print(
            "| latency | kind | unsharded MB/s | sharded MB/s | sharded / unsharded "
            "| sharded / sharded x[:] | CPU s unsharded | CPU s sharded |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for delay in (0.0, args.latency):
            for kind in ("zarr x[:]", "sequential", "buffered", "exact", "exact, budget 1/4"):
                plain = nbytes / best[(delay, "plain", kind)] / MB
                sharded = nbytes / best[(delay, "sharded", kind)] / MB
                ref = nbytes / best[(delay, "sharded", "zarr x[:]")] / MB
                print(
                    f"| {delay * 1000:.0f} ms | {kind} | {plain:.0f} | {sharded:.0f} | "
                    f"{sharded / plain:.2f}x | {sharded / ref:.2f}x | "
                    f"{cpu[(delay, 'plain', kind)]:.2f} | {cpu[(delay, 'sharded', kind)]:.2f} |"
                )
