"""Benchmark daskzarr_batches against zarr, dask and peer loaders, side by side.

Run from the repository root::

    python benchmarks/run.py                      # 1,000,000 x 64 float32, 8192-row chunks
    python benchmarks/run.py --quick              # small dataset, under ~2 minutes
    python benchmarks/run.py --rows 200000 --cols 32 --chunk-rows 4096

The dataset (float32 ``features`` + int64 ``labels``, Zarr's default codec) is
generated once under ``benchmarks/data/``.  Every case is measured in the same
run, so ratios against L0 (zarr-python, chunk-aligned sequential reads on one
thread) compare like with like on a noisy machine.  Throughput is the best of
``--repeats`` runs.  Results go to ``<out>/results.md`` (tables with a PASS/MISS
column per target of issue 3), ``<out>/results.json`` and ``<out>/throughput.png``.

Peers (xbatcher, torch) are optional: install them with ``pip install
.[bench]``; a missing one is skipped with the reason printed.  Memory cases run
in a fresh subprocess each, so their peak RSS is not inflated by earlier cases.

This script parses the arguments and runs the steps in order; the cases, the
targets table and the report are in ``benchmarks/suite/``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.suite import cases, memory, quality, report, stores_cases, targets  # noqa: E402
from benchmarks.suite.dataset import default_shape, make_dataset  # noqa: E402
from benchmarks.suite.measure import MB, Result, SuiteRun, rounds  # noqa: E402


def measure_throughput(
    w: cases.Workload, *, quick: bool, repeats: int, cluster: bool, skipped: dict[str, str]
) -> dict[str, Result]:
    """Every throughput case, in report order."""
    print(f"references and daskzarr_batches (local), {repeats} interleaved rounds, best kept")
    results = rounds(cases.local_cases(w, skipped), repeats)
    print("naive dask and peers (a few batches, extrapolated)")
    naive = cases.naive_cases(w, quick, skipped)
    for result in rounds(naive, 1).values():
        result.extrapolated = True
        results[result.name] = result
    if cluster:
        results.update(measure_on_cluster(w, repeats))
    else:
        skipped["LocalCluster"] = "--no-cluster"
    return results


def measure_on_cluster(w: cases.Workload, repeats: int) -> dict[str, Result]:
    print("daskzarr_batches on distributed.LocalCluster (2 workers x 1 thread)")
    import distributed

    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        return rounds(cases.cluster_cases(w, client), repeats)


def measure_prefetch(w: cases.Workload, buffered: Result) -> dict[str, float]:
    print("prefetch hides I/O (consumer busy 1.2x the per-batch load time)")
    # the typical (median) load time of the rounds, not the luckiest one
    per_batch = float(np.median(buffered.extra["seconds"])) / math.ceil(w.ds.rows / 256)
    result = cases.prefetch_case(w.x, w.buffer_rows, per_batch * 1.2)
    print(
        f"  wait {result['wait']:.3f} s of {result['epoch']:.2f} s "
        f"({100 * result['fraction']:.1f}%), per-batch load {per_batch * 1e6:.0f} us"
    )
    return result


def measure_fast_start(
    args: argparse.Namespace, data_dir: Path, results: dict[str, Result]
) -> dict[str, float]:
    """The 400,000-row cases against L0 on that array, and the time to first batch there.

    ``--quick`` runs them on the run's own (smaller) dataset instead.
    """
    rows = min(args.rows, cases.START_ROWS) if args.quick else cases.START_ROWS
    ds = make_dataset(data_dir, rows, args.cols, args.chunk_rows)
    print(f"fast start: {ds.path.name}, {args.repeats} interleaved rounds, best kept")
    results.update(rounds(cases.start_cases(ds), args.repeats))
    first = cases.first_batch_case(ds, max(5, 3 * args.repeats))
    chunk = first["chunk"]
    print(
        f"  time to first batch: sequential {first['sequential'] * 1e3:.1f} ms, "
        f"buffered {first['buffered'] * 1e3:.1f} ms; one chunk read {chunk * 1e3:.1f} ms "
        f"(medians)"
    )
    return first


def measure_quality(w: cases.Workload) -> list[dict[str, Any]]:
    print("shuffle quality (from the plan, nothing read)")
    rows = quality.quality_table(w.x, w.ds.chunk_rows)
    for row in rows:
        print(
            f"  {row['mode']:28s} displacement {row['displacement']:.3f}  "
            f"entropy {row['entropy']:.2f} bits"
        )
    return rows


def run_suite(args: argparse.Namespace) -> None:
    data_dir, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    ds = make_dataset(data_dir, args.rows, args.cols, args.chunk_rows)
    w = cases.Workload.open(ds)
    print(f"dataset {ds.path} ({ds.feature_bytes / MB:.0f} MB features), {w.threads} CPUs")
    load_before = os.getloadavg()
    cases.warm_up(w.x)
    skipped: dict[str, str] = {}
    results = measure_throughput(
        w, quick=args.quick, repeats=args.repeats, cluster=not args.no_cluster, skipped=skipped
    )
    if args.no_stores:
        skipped |= dict.fromkeys(stores_cases.SKIP_KEYS, "--no-stores")
    else:
        results |= stores_cases.measure_stores(
            ds, data_dir, repeats=args.repeats, threads=w.threads, skipped=skipped
        )
    prefetch = measure_prefetch(w, results[cases.BUFFERED])
    first_batch = measure_fast_start(args, data_dir, results)
    print("memory (fresh process per case)")
    memory_record = memory.memory_cases(
        ds, data_dir, w.buffer_rows, w.budget, sweep=not args.quick
    )  # --quick: no exact-shuffle sweep (it generates its own 64 MiB array)
    quality_rows = measure_quality(w)
    run = SuiteRun(
        dataset=ds,
        quick=args.quick,
        repeats=args.repeats,
        results=results,
        skipped=skipped,
        prefetch=prefetch,
        memory=memory_record,
        quality=quality_rows,
        load=(load_before, os.getloadavg()),
        first_batch=first_batch,
    )
    report.write_outputs(run, targets.evaluate(run), out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rows", type=int)
    parser.add_argument("--cols", type=int)
    parser.add_argument("--chunk-rows", type=int)
    parser.add_argument("--quick", action="store_true", help="small dataset, 1 repeat")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--data", default=str(ROOT / "benchmarks" / "data"))
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument(
        "--no-stores",
        action="store_true",
        help="skip the sharded, latency, S3 and codec-pipeline cases (about a minute)",
    )
    args = parser.parse_args(argv)
    rows, cols, chunk_rows = default_shape(args.quick)
    args.rows = args.rows or rows
    args.cols = args.cols or cols
    args.chunk_rows = args.chunk_rows or chunk_rows
    args.repeats = args.repeats or (2 if args.quick else 5)
    return args


def main(argv: list[str] | None = None) -> None:
    run_suite(parse_args(argv))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
