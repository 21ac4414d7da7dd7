"""Sequential and buffered streams, ramp on and off, against ``x[:]`` on a store with latency.

    python -m benchmarks --only ramp-latency --latency 0.1 --rounds 3 --data /work/bench-data

Each request waits ``--latency`` seconds (:class:`~benchmarks.latency_store.LatencyStore`,
metadata reads included, as in the suite's store cases); every case runs once per
round, interleaved, and the table shows medians.  ``--rows`` picks the suite's
dataset of that many rows under ``--data`` (made here if missing; 196,608 rows was
the suite's latency subset, 400,000 is its fast-start array), ``--sharded`` its
copy with 8 chunks per shard.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zarr
import zarr.storage

import daskzarr_batches as dzb

from .latency_store import LatencyStore
from .suite.dataset import make_dataset, make_sharded

#: defaults of the options this benchmark reads
LATENCY, ROUNDS, ROWS = 0.1, 3, 196_608


def drain(stream: Any) -> int:
    return sum(len(batch) for batch in stream)


def flat(stream: dzb.BatchStream) -> dzb.BatchStream:
    """The same stream without the fast-start ramp."""
    stream.close()
    return dzb.BatchStream(dataclasses.replace(stream.spec, ramp=False))


def run(options: argparse.Namespace) -> None:
    """Print each case's median time and its ratio to ``x[:]``."""
    args = argparse.Namespace(
        latency=LATENCY if options.latency is None else options.latency,
        rounds=options.rounds or ROUNDS,
        rows=options.rows or ROWS,
    )
    Path(options.data).mkdir(parents=True, exist_ok=True)
    data = make_dataset(Path(options.data), args.rows, 64, 8192)
    path = (make_sharded(data) if options.sharded else data).path
    local = zarr.storage.LocalStore(path, read_only=True)
    store = LatencyStore(local, args.latency, metadata=True)
    x = zarr.open_array(store, path="features", mode="r")
    buffer = 8 * x.chunks[0]
    cases: dict[str, Callable[[], Any]] = {
        "x[:]": lambda: x[:],
        "sequential, ramp": lambda: drain(dzb.batch_stream(x, 256)),
        "sequential, flat": lambda: drain(flat(dzb.batch_stream(x, 256))),
        "buffered, ramp": lambda: drain(
            dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer)
        ),
        "buffered, flat": lambda: drain(
            flat(dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer))
        ),
    }
    times: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case, run in cases.items():
            started = time.perf_counter()
            run()
            times[case].append(time.perf_counter() - started)
    base = statistics.median(times["x[:]"])
    print(f"{path.name}, {args.latency * 1000:.0f} ms per request, medians of {args.rounds}")
    for case, seconds in times.items():
        median = statistics.median(seconds)
        print(f"  {case:18s} {median * 1e3:7.1f} ms  {base / median:.2f}x x[:]")
