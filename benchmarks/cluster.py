"""Local threads vs. a LocalCluster of process workers, measured side by side.

Writes a Zarr array (default 1,000,000 x 16 float32 = 61 MiB, 31,250-row
chunks) to a temporary directory, then times, on the local threaded scheduler
and on a ``LocalCluster`` (``--workers`` processes x 1 thread on 127.0.0.1):

- a buffered shuffled epoch (``shuffled_batch_stream``, batch 4096, buffer of
  4 chunks, prefetch 2): every batch travels to this process;
- per-feature moments (``feature_moments``): only per-chunk statistics travel.

Prints MiB/s of decoded data and the cluster/local ratio, best of ``--rounds``.
On one small machine the cluster mostly adds transfer and scheduling overhead;
the point of a cluster is more cores, memory and I/O bandwidth than one host.

    python -m benchmarks --only cluster [--rows N] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dask
import numpy as np
import zarr
from distributed import Client, LocalCluster

import daskzarr_batches as dzb

MiB = 2**20
#: defaults of the options this benchmark reads
ROWS, WORKERS, ROUNDS = 1_000_000, 2, 3


def best_of(repeat: int, job: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        job()
        times.append(time.perf_counter() - started)
    return min(times)


def run(options: argparse.Namespace) -> None:
    """Print each job's MiB/s locally and on the cluster, and their ratio."""
    args = argparse.Namespace(
        rows=options.rows or ROWS,
        workers=options.workers or WORKERS,
        repeat=options.rounds or ROUNDS,
    )

    workdir = Path(tempfile.mkdtemp(prefix="dzb-bench-cluster-"))
    try:
        chunk = 31_250
        x = zarr.create_array(
            store=workdir / "x.zarr", shape=(args.rows, 16), chunks=(chunk, 16), dtype="float32"
        )
        rng = np.random.default_rng(0)
        for start in range(0, args.rows, 4 * chunk):
            stop = min(start + 4 * chunk, args.rows)
            x[start:stop] = rng.standard_normal((stop - start, 16), dtype=np.float32)
        size = x.nbytes / MiB

        def epoch() -> None:
            stream = dzb.shuffled_batch_stream(
                x, 4096, seed=0, shuffle_buffer_size=4 * chunk, prefetch=2
            )
            for _ in stream:
                pass

        def moments() -> None:
            dzb.feature_moments(x)

        jobs = {"shuffled epoch": epoch, "feature moments": moments}
        with dask.config.set(scheduler="threads"):
            local = {name: best_of(args.repeat, job) for name, job in jobs.items()}
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
            ) as cluster,
            Client(cluster),
        ):
            remote = {name: best_of(args.repeat, job) for name, job in jobs.items()}

        print(
            f"{args.rows} x 16 float32 = {size:.0f} MiB, {x.nchunks} chunks, best of {args.repeat}"
        )
        print(f"{'job':<16} {'local MiB/s':>12} {'cluster MiB/s':>14} {'cluster/local':>14}")
        for name in jobs:
            print(
                f"{name:<16} {size / local[name]:>12.0f} {size / remote[name]:>14.0f} "
                f"{local[name] / remote[name]:>14.2f}"
            )
    finally:
        shutil.rmtree(workdir)
