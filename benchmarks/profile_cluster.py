"""Where a cluster epoch's time goes, between the workers' reads and the consumer.

Runs the LocalCluster cases of the benchmark (2 process workers x 1 thread;
sequential and buffered shuffle of 8 chunks, batch 256) beside the
transfer-only ceiling (64 MiB arrays made on workers, fetched by the client,
no Zarr read), in interleaved rounds, and prints per case the median of:

- epoch seconds and the ratio to the round's transfer ceiling (fetched as the
  streams fetch: straight from the workers on a LocalCluster; and through the
  scheduler, the ceiling before issue 40);
- worker side (``client.get_task_stream``): read tasks, their mean time per
  window, total read time, the share of windows run on the busiest worker, the
  workers' busy fraction (read time / (epoch x workers));
- the workers' CPU over the epoch, and as a multiple of theirs in the transfer
  ceiling; the epoch against the same windows only read on the workers (zarr's
  ``x[a:b]``, nothing sent back: ``x reads only``), what the epoch cannot beat;
- client side: ``stats.wait_seconds`` (blocked on results: transfer, or reads
  not done yet), time spent cutting batches (slices, or ``np.take`` by the plan
  order) and copying unaligned windows, both timed by wrapping the library's
  private functions (``internals.time_batch_cutting``).

    python -m benchmarks --only cluster-profile --data /work/bench-data [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import distributed

import daskzarr_batches as dzb

from .internals import peak_in_flight, time_batch_cutting
from .suite.cases import transfer_only
from .suite.dataset import default_shape, make_dataset

#: default of ``--rounds``
ROUNDS = 5


def compute_seconds(task: dict[str, Any]) -> float:
    """Seconds a task of the task stream spent computing (transfers of its inputs excluded)."""
    return sum(s["stop"] - s["start"] for s in task["startstops"] if s["action"] == "compute")


def workers_cpu(client: Any) -> float:
    """The summed CPU seconds of the workers' processes so far."""
    return float(sum(client.run(time.process_time).values()))


def nbytes_of(x: Any, start: int, stop: int) -> int:
    """A read task of :func:`reads_only`: rows ``start:stop`` of ``x`` read, nothing sent."""
    return int(x[start:stop].nbytes)


def reads_only(client: Any, x: Any, rows: int) -> float:
    """Seconds the workers take to read every sequential window of ``x`` (zarr's
    ``x[a:b]``, windows of ``DEFAULT_WINDOW_BYTES``), sending nothing back: what a
    stream's epoch costs the workers before any transfer."""
    step = max(dzb.plan.DEFAULT_WINDOW_BYTES // (x.dtype.itemsize * x.shape[1]), 1)
    started = time.perf_counter()
    client.gather(
        [client.submit(nbytes_of, x, a, min(a + step, rows), pure=False)
         for a in range(0, rows, step)]
    )  # fmt: skip
    return time.perf_counter() - started


def profile(client: Any, make: Callable[[], dzb.BatchStream]) -> dict[str, float]:
    spent: dict[str, float] = {}
    with time_batch_cutting(spent), distributed.get_task_stream(client) as tasks:
        cpu = workers_cpu(client)
        started = time.perf_counter()
        stream = make()
        with stream:
            for _ in stream:
                pass
        seconds = time.perf_counter() - started
        cpu = workers_cpu(client) - cpu
    reads = [
        (item["worker"], compute_seconds(item))
        for item in tasks.data
        if str(item["key"]).startswith("('dzb-array")
    ]
    per_worker: dict[str, int] = {}
    for worker, _ in reads:
        per_worker[worker] = per_worker.get(worker, 0) + 1
    read_seconds = [s for _, s in reads]
    return {
        "epoch s": seconds,
        "windows": len(reads),
        "read ms/window": 1000 * statistics.mean(read_seconds),
        "read s": sum(read_seconds),
        "busiest worker": max(per_worker.values()) / len(reads),
        "workers busy": sum(read_seconds) / (seconds * len(client.nthreads())),
        "wait s": stream.stats.wait_seconds,
        "cut s": spent.get("cut", 0.0),
        "align s": spent.get("align", 0.0),
        "peak in flight": peak_in_flight(stream),
        "workers cpu s": cpu,
    }


def run(options: argparse.Namespace) -> None:
    """Print the medians of each cluster case's profile over ``--rounds`` rounds."""
    args = argparse.Namespace(rounds=options.rounds or ROUNDS)
    rows, cols, chunk_rows = default_shape(quick=False)
    Path(options.data).mkdir(parents=True, exist_ok=True)
    data = make_dataset(Path(options.data), options.rows or rows, cols, chunk_rows)
    x = data.features
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        cases = {
            "sequential, batch 256": lambda: dzb.batch_stream(x, 256, client=client),
            "buffered (8 chunks), batch 256": lambda: dzb.shuffled_batch_stream(
                x, 256, seed=0, shuffle_buffer_size=8 * chunk_rows, client=client
            ),
        }
        for make in cases.values():  # warm up: imports, connections
            profile(client, make)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            started = time.perf_counter()
            transfer_only(client, data.feature_bytes)
            ceiling = time.perf_counter() - started
            started = time.perf_counter()
            transfer_only(client, data.feature_bytes, direct=False)
            relayed = time.perf_counter() - started
            cpu = workers_cpu(client)
            started = time.perf_counter()
            transfer_only(client, data.feature_bytes)
            ceiling_cpu = workers_cpu(client) - cpu
            ceiling = min(ceiling, time.perf_counter() - started)
            reads = reads_only(client, x, data.rows)
            for name, make in cases.items():
                result = profile(client, make)
                result["x transfer"] = ceiling / result["epoch s"]
                result["x transfer via scheduler"] = relayed / result["epoch s"]
                result["x reads only"] = reads / result["epoch s"]
                result["workers cpu / ceiling's"] = result["workers cpu s"] / ceiling_cpu
                results[name].append(result)
    print(f"{data.feature_bytes / 2**20:.0f} MiB, medians of {args.rounds} rounds")
    keys = list(next(iter(results.values()))[0])
    print("| case | " + " | ".join(keys) + " |")
    print("|---|" + "---:|" * len(keys))
    for name, runs in results.items():
        cells = [f"{statistics.median(r[k] for r in runs):.3g}" for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
