"""Sequential and buffered streams, ramp on and off, against ``x[:]`` on a store with latency.

    python benchmarks/ramp_latency.py --latency 0.1 --rounds 3 --data /work/bench-data

Each request waits ``--latency`` seconds (``benchmarks.suite.stores_cases.LatencyStore``);
every case runs once per round, interleaved, and the table shows medians.  ``--rows``
picks the suite's dataset of that many rows under ``--data`` (made by
``benchmarks/run.py``; 196,608 rows is its latency subset, 400,000 its fast-start array).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zarr
import zarr.storage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import daskzarr_batches as dzb
from benchmarks.suite.stores_cases import LatencyStore


def drain(stream: Any) -> int:
    return sum(len(batch) for batch in stream)


def flat(stream: dzb.BatchStream) -> dzb.BatchStream:
    """The same stream without the fast-start ramp."""
    stream.close()
    return dzb.BatchStream(dataclasses.replace(stream.spec, ramp=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=196_608)
    parser.add_argument("--sharded", action="store_true")
    parser.add_argument("--data", type=Path, default=Path("benchmarks/data"))
    args = parser.parse_args()
    path = args.data / f"x{args.rows}_c64_r8192{'_s8' if args.sharded else ''}.zarr"
    store = LatencyStore(zarr.storage.LocalStore(path, read_only=True), args.latency)
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


if __name__ == "__main__":
    main()
