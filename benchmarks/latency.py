"""Every stream kind against zarr's own ``x[:]`` on a store that sleeps before each get.

An object store answers each request after tens of milliseconds; a wrapper store
that sleeps ``--latency`` seconds before every chunk ``get`` of a local store
stands for one.  Each round runs every case once, interleaved, in this process,
and the table shows each case's median time as a ratio of throughput to the
round's ``x[:]`` (zarr's own concurrent read of the whole array, on the same
wrapped store; ``--latency 0`` reads the local store itself, unwrapped)::

    python -m benchmarks --only latency --latency 0.02 --rounds 5
    python -m benchmarks --only latency --latency 0.1 --rounds 3
    python -m benchmarks --only latency --latency 0 --old main   # this tree vs main's library
    python -m benchmarks --only latency --latency 0.02 --sharded # 8 chunks per shard
    python -m benchmarks --only latency --latency 0.1 --sweep    # per io_concurrency

``--old REF`` runs the chunk-stream cases of the library as of ``REF`` beside
this tree's (``compare.load_baseline`` extracts it).  The dataset (600,000 x 64
float32 in 8192-row chunks, Zarr's default codecs; ``--rows``) is generated once
under ``--data``.
"""

from __future__ import annotations

import argparse
import operator
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import zarr
import zarr.storage

import daskzarr_batches as current

from .compare import load_baseline
from .latency_store import LatencyStore
from .suite.measure import consume as drain
from .suite.measure import timed

#: defaults of the options this benchmark reads
LATENCY, ROUNDS, ROWS = 0.02, 5, 600_000


def make_data(data_dir: Path, rows: int, sharded: bool) -> Path:
    """600,000 x 64 float32 in 8192-row chunks (optionally 8 chunks per shard), once."""
    path = data_dir / f"latency_x{rows}{'_sharded' if sharded else ''}.zarr"
    if (path / "complete").exists():
        return path
    x = zarr.create_array(
        path,
        shape=(rows, 64),
        chunks=(8192, 64),
        shards=(8 * 8192, 64) if sharded else None,
        dtype="f4",
        overwrite=True,
    )
    rng = np.random.default_rng(0)
    for lo in range(0, rows, 8 * 8192):
        hi = min(rows, lo + 8 * 8192)
        x[lo:hi] = rng.standard_normal((hi - lo, 64), dtype=np.float32)
    (path / "complete").write_text("ok")
    return path


def cases(dzb: ModuleType, x: zarr.Array, prefix: str, old: bool) -> dict[str, Callable[[], Any]]:
    """The stream kinds on ``x``; ``old``: a library without ``io_concurrency``."""
    buffer = 8 * x.chunks[0]
    chunk: dict[str, Any] = {}
    return {
        f"{prefix}chunk_stream ordered": lambda: drain(dzb.chunk_stream(x, **chunk)),
        f"{prefix}chunk_stream unordered": lambda: drain(
            dzb.chunk_stream(x, ordered=False, **chunk)
        ),
        f"{prefix}map_chunks(np.sum)": lambda: drain(dzb.map_chunks(np.sum, x, **chunk)),
        f"{prefix}reduce_chunks(np.sum, add)": lambda: dzb.reduce_chunks(
            np.sum, operator.add, x, **chunk
        ),
        f"{prefix}batch_stream, batch 256": lambda: drain(dzb.batch_stream(x, 256)),
        f"{prefix}buffered (8 chunks), batch 256": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer)
        ),
    }


def run_table(args: argparse.Namespace, baseline: ModuleType | None) -> str:
    path = make_data(args.data, args.rows, args.sharded)
    state = {"requests": 0, "now": 0, "peak": 0}
    local = zarr.storage.LocalStore(path, read_only=True)
    # no latency: the local store itself (a wrapper store is not known to be local)
    store = local if args.latency == 0 else LatencyStore(local, args.latency, state)
    x = zarr.open_array(store=store, mode="r")
    table: dict[str, Callable[[], Any]] = {"zarr x[:]": lambda: x[:]}
    if args.sweep:
        for io in (2, 4, 8, 16, 32):
            table[f"chunk_stream, io_concurrency={io}"] = lambda io=io: drain(
                current.chunk_stream(x, io_concurrency=io)
            )
            table[f"map_chunks(np.sum), io_concurrency={io}"] = lambda io=io: drain(
                current.map_chunks(np.sum, x, io_concurrency=io)
            )
    else:
        table.update(cases(current, x, "", old=False))
    if baseline is not None:
        table.update(cases(baseline, x, "old: ", old=True))
    seconds: dict[str, list[float]] = {name: [] for name in table}
    cpu: dict[str, list[float]] = {name: [] for name in table}
    peaks: dict[str, int] = {}
    names = list(table)
    for round_number in range(args.rounds):
        order = names if round_number % 2 == 0 else names[:1] + names[:0:-1]
        for name in order:
            state["peak"] = 0
            wall, used = timed(table[name])
            seconds[name].append(wall)
            cpu[name].append(used)
            peaks[name] = max(peaks.get(name, 0), state["peak"])
    reference = statistics.median(seconds["zarr x[:]"])
    mb = x.nbytes / 1e6
    kind = "sharded (8 chunks per shard)" if args.sharded else "unsharded"
    lines = [
        f"{args.rows:,} x 64 float32, 8192-row chunks, {kind}, {args.latency * 1e3:.0f} ms "
        f"before each get, {args.rounds} rounds; zarr x[:] median {reference:.3f} s "
        f"({mb / reference:.0f} MB/s)",
        "",
        "| case | median s | MB/s | vs x[:] | CPU s (median) | peak gets in flight |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        median = statistics.median(seconds[name])
        lines.append(
            f"| {name} | {median:.3f} | {mb / median:.0f} | {reference / median:.2f}x "
            f"| {statistics.median(cpu[name]):.2f} | {peaks[name] if args.latency else '-'} |"
        )
    return "\n".join(lines)


def run(options: argparse.Namespace) -> None:
    """Print the table (``--old REF``: with the earlier library's cases beside)."""
    args = argparse.Namespace(
        latency=LATENCY if options.latency is None else options.latency,
        rounds=options.rounds or ROUNDS,
        rows=options.rows or ROWS,
        sharded=options.sharded,
        sweep=options.sweep,
        data=Path(options.data),
    )
    args.data.mkdir(parents=True, exist_ok=True)
    if options.old is None:
        print(run_table(args, None))
        return
    with tempfile.TemporaryDirectory() as tmp:
        print(run_table(args, load_baseline(options.old, Path(tmp))))
