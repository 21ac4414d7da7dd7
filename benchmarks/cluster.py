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

Then (issue 40) the per-chunk jobs against dask's own graph for the same work on
the same ``LocalCluster``, a ``rows`` x 64 float32 array (zstd, a local directory)
at 1 MiB and 4 MiB chunks (4096 and 16384 rows), best of ``--rounds`` in
interleaved rounds, ratio = dask's time / ours (below 1: ours slower); ``f`` a
chunk's column sums in float64, ``g`` an elementwise normalisation,
``a = da.from_zarr(x)``:

- reduce: ``reduce_chunks(f, np.add, x)`` vs ``a.map_blocks(f).sum(0)``-like
  (``a.map_blocks(f, drop_axis=0, new_axis=0)`` summed over its blocks);
- map: ``list(map_chunks(f, x))`` vs ``dask.compute(*[delayed(f)(b) for b in a.to_delayed()])``;
- moments: ``feature_moments(x)`` vs ``dask.compute(a.mean(0), a.var(0))``;
- write: ``map_to_zarr(g, x, out)`` vs ``a.map_blocks(g).to_zarr(out)``.

``--match WORD`` runs only the jobs whose name contains it (``--match jobs``: the
jobs table alone, ``--match epoch``: the first table alone).

    python -m benchmarks --only cluster [--rows N] [--workers 2] [--rounds 3] [--match reduce]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dask
import dask.array as da
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
    """Print each job's MiB/s locally and on the cluster, and their ratio; then the jobs table."""
    args = argparse.Namespace(
        rows=options.rows or ROWS,
        workers=options.workers or WORKERS,
        repeat=options.rounds or ROUNDS,
        match=getattr(options, "match", None),
    )
    if args.match is None or args.match in "shuffled epoch feature moments":
        local_vs_cluster(args)
    if args.match is None or any(args.match in name for name in (*JOBS, "jobs")):
        per_chunk_jobs(args)


def local_vs_cluster(args: argparse.Namespace) -> None:
    """The shuffled epoch and feature moments, local threads vs the LocalCluster."""
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


# -- issue 40: each per-chunk job against dask's own graph on the same cluster

#: the jobs of the table, in its order
JOBS = ("reduce", "map", "moments", "write")
#: rows of a 1 MiB and a 4 MiB chunk of 64 float32 columns
CHUNK_SIZES = {"1 MiB": 4096, "4 MiB": 16384}
COLS = 64


def column_sums(chunk: np.ndarray) -> np.ndarray:
    """``f``: a chunk's column sums in float64."""
    return chunk.sum(axis=0, dtype=np.float64)


def column_sums_row(chunk: np.ndarray) -> np.ndarray:
    """``f`` as a dask block: one row."""
    return chunk.sum(axis=0, dtype=np.float64)[None]


def normalise(rows: np.ndarray) -> np.ndarray:
    """``g``: an elementwise normalisation (float32)."""
    return (rows - np.float32(0.5)) * np.float32(2.0)


def job_pairs(x: zarr.Array, out: Path, client: Any) -> dict[str, tuple[Any, Any]]:
    """Each job as (ours, dask's own graph for the same work), both on ``client``."""
    a = da.from_zarr(x)
    counter = iter(range(10**6))

    def fresh() -> Path:
        path = out / f"out-{next(counter)}.zarr"
        shutil.rmtree(path, ignore_errors=True)
        return path

    def dask_reduce() -> Any:
        blocks = a.map_blocks(
            column_sums_row, chunks=((1,) * a.numblocks[0], (COLS,)), dtype=np.float64
        )
        return client.compute(blocks.sum(axis=0)).result()

    return {
        "reduce": (
            lambda: dzb.reduce_chunks(column_sums, np.add, x, client=client),
            dask_reduce,
        ),
        "map": (
            lambda: list(dzb.map_chunks(column_sums, x, client=client)),
            lambda: dask.compute(
                *[dask.delayed(column_sums)(b) for b in a.to_delayed().ravel()],
                scheduler=client,
            ),
        ),
        "moments": (
            lambda: dzb.feature_moments(x, client=client),
            lambda: dask.compute(a.mean(axis=0), a.var(axis=0), scheduler=client),
        ),
        "write": (
            lambda: dzb.map_to_zarr(normalise, x, fresh(), client=client),
            # on the cluster: to_zarr(compute=True) would run on dask's default scheduler,
            # local threads, as the client is not the default (before: it did)
            lambda: dask.compute(
                a.map_blocks(normalise).to_zarr(str(fresh()), compute=False), scheduler=client
            ),
        ),
    }


def per_chunk_jobs(args: argparse.Namespace) -> None:
    """Print, per chunk size, each job's seconds, dask's, and dask's / ours (best of rounds)."""
    chosen = [j for j in JOBS if args.match is None or args.match in (j, "jobs")]
    workdir = Path(tempfile.mkdtemp(prefix="dzb-bench-cluster-jobs-"))
    try:
        arrays = {}
        rng = np.random.default_rng(0)
        data = rng.random((args.rows, COLS), dtype=np.float32)
        for label, rows in CHUNK_SIZES.items():
            x = zarr.create_array(
                store=workdir / f"x-{rows}.zarr",
                shape=(args.rows, COLS),
                chunks=(rows, COLS),
                dtype="float32",
            )
            x[:] = data
            arrays[label] = x
        del data
        size = args.rows * COLS * 4 / MiB
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                processes=True,
                host="127.0.0.1",
                dashboard_address="127.0.0.1:0",
            ) as cluster,
            Client(cluster, set_as_default=False) as client,
        ):
            pairs = {label: job_pairs(x, workdir, client) for label, x in arrays.items()}
            for jobs in pairs.values():  # warm up: the workers' imports and connections
                for name in chosen:
                    jobs[name][0](), jobs[name][1]()
            times: dict[tuple[str, str, str], list[float]] = {}
            for _ in range(args.repeat):  # interleaved rounds: ours, then dask's
                for label, jobs in pairs.items():
                    for name in chosen:
                        for side, job in zip(("ours", "dask"), jobs[name], strict=True):
                            started = time.perf_counter()
                            job()
                            elapsed = time.perf_counter() - started
                            times.setdefault((label, name, side), []).append(elapsed)
        print(
            f"\nper-chunk jobs on a LocalCluster of {args.workers} processes x 1 thread, "
            f"{args.rows} x {COLS} float32 = {size:.0f} MiB, best of {args.repeat}; "
            "ratio = dask s / ours"
        )
        labels = list(CHUNK_SIZES)
        print("| job | " + " | ".join(f"ours s ({c}) | dask s ({c}) | ratio ({c})" for c in labels)
              + " |")  # fmt: skip
        print("|---|" + "---:|" * 3 * len(labels))
        for name in chosen:
            cells = []
            for label in labels:
                ours = min(times[label, name, "ours"])
                theirs = min(times[label, name, "dask"])
                cells += [f"{ours:.2f}", f"{theirs:.2f}", f"{theirs / ours:.2f}"]
            print(f"| {name} | " + " | ".join(cells) + " |")
    finally:
        shutil.rmtree(workdir)
