"""The suite's two benchmarks: ``suite`` (the whole report) and ``stores`` (issue 10's cases alone).

``python -m benchmarks`` (or ``--only suite``) measures this library against zarr,
dask and peer loaders, side by side in one run, on a dataset generated once under
``--data``.  Every case is measured in the same run, so ratios against L0
(zarr-python, chunk-aligned sequential reads on one thread) compare like with like
on a noisy machine.  Throughput is the best of ``--rounds`` runs.  Results go to
``<out>/results.md`` (tables with a PASS/MISS column per target),
``<out>/results.json`` and ``<out>/throughput.png``.

Peers (xbatcher, torch) are optional: install them with ``pip install .[bench]``;
a missing one is skipped with the reason printed.  Memory cases run in a fresh
subprocess each, so their peak RSS is not inflated by earlier cases.

``python -m benchmarks --only stores`` runs only the store cases (sharded, latency,
S3, codec pipelines) on the suite's dataset and prints their table and targets.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from . import big_samples as big
from . import cache_cases, cases, cpu, memory, patch_cases, quality, report, stores_cases, targets
from . import collection as coll
from . import mixture as mx
from . import writes as wr
from .dataset import Dataset, default_shape, make_dataset
from .measure import MB, Result, SuiteRun, rounds


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
    all_rows, cols, chunk_rows = shape(args)
    rows = min(all_rows, cases.START_ROWS) if args.quick else cases.START_ROWS
    ds = make_dataset(data_dir, rows, cols, chunk_rows)
    repeats = repeats_of(args)
    print(f"fast start: {ds.path.name}, {repeats} interleaved rounds, best kept")
    results.update(rounds(cases.start_cases(ds), repeats))
    first = cases.first_batch_case(ds, max(5, 3 * repeats))
    chunk = first["chunk"]
    print(
        f"  time to first batch: sequential {first['sequential'] * 1e3:.1f} ms, "
        f"buffered {first['buffered'] * 1e3:.1f} ms; one chunk read {chunk * 1e3:.1f} ms "
        f"(medians)"
    )
    return first


def measure_cpu(
    args: argparse.Namespace, data_dir: Path, skipped: dict[str, str]
) -> dict[str, Result]:
    """Issue 20's CPU cases on the 400,000-row array (``--quick``: the run's own, smaller).

    ``--rounds`` rounds, else :data:`cpu.ROUNDS` (the issue's targets are on the medians
    of 8), else 2 with ``--quick``.
    """
    all_rows, cols, chunk_rows = shape(args)
    rows = min(all_rows, cases.START_ROWS) if args.quick else cases.START_ROWS
    ds = make_dataset(data_dir, rows, cols, chunk_rows)
    repeats = int(args.rounds or (repeats_of(args) if args.quick else cpu.ROUNDS))
    return cpu.measure(ds, repeats, skipped)


def measure_quality(w: cases.Workload) -> list[dict[str, Any]]:
    print("shuffle quality (from the plan, nothing read)")
    rows = quality.quality_table(w.x, w.ds.chunk_rows)
    for row in rows:
        print(
            f"  {row['mode']:28s} displacement {row['displacement']:.3f}  "
            f"entropy {row['entropy']:.2f} bits"
        )
    return rows


def shape(options: argparse.Namespace) -> tuple[int, int, int]:
    """``(rows, cols, chunk_rows)`` of the run: the options, else the defaults."""
    rows, cols, chunk_rows = default_shape(options.quick)
    return options.rows or rows, options.cols or cols, options.chunk_rows or chunk_rows


def repeats_of(options: argparse.Namespace) -> int:
    """Rounds of the run: ``--rounds``, else 2 with ``--quick``, else 5."""
    return int(options.rounds or (2 if options.quick else 5))


def run_suite(args: argparse.Namespace) -> None:
    """The whole suite; writes ``results.md``, ``results.json`` and ``throughput.png``."""
    data_dir, out = Path(args.data), Path(args.out)
    rows, cols, chunk_rows = shape(args)
    repeats = repeats_of(args)
    out.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    ds = make_dataset(data_dir, rows, cols, chunk_rows)
    w = cases.Workload.open(ds)
    print(f"dataset {ds.path} ({ds.feature_bytes / MB:.0f} MB features), {w.threads} CPUs")
    load_before = os.getloadavg()
    cases.warm_up(w.x)
    skipped: dict[str, str] = {}
    results = measure_throughput(
        w, quick=args.quick, repeats=repeats, cluster=not args.no_cluster, skipped=skipped
    )
    if args.no_stores:
        skipped |= dict.fromkeys((*stores_cases.SKIP_KEYS, "cache"), "--no-stores")
    else:
        results |= stores_cases.measure_stores(
            ds, data_dir, repeats=repeats, threads=w.threads, skipped=skipped
        )
        results |= cache_cases.measure_cache(ds, data_dir, repeats=repeats, skipped=skipped)
    prefetch = measure_prefetch(w, results[cases.BUFFERED])
    first_batch = measure_fast_start(args, data_dir, results)
    results |= measure_cpu(args, data_dir, skipped)
    print("memory (fresh process per case)")
    memory_record = memory.memory_cases(
        ds, data_dir, w.buffer_rows, w.budget, sweep=not args.quick
    )  # --quick: no exact-shuffle sweep (it generates its own 64 MiB array)
    quality_rows = measure_quality(w)
    run = SuiteRun(
        dataset=ds,
        quick=args.quick,
        repeats=repeats,
        results=results,
        skipped=skipped,
        prefetch=prefetch,
        memory=memory_record,
        quality=quality_rows,
        load=(load_before, os.getloadavg()),
        first_batch=first_batch,
    )
    report.write_outputs(run, targets.evaluate(run), out)


def run_stores(options: argparse.Namespace) -> None:
    """Only the store cases on the suite's dataset; print their table and targets."""
    data_dir = Path(options.data)
    data_dir.mkdir(parents=True, exist_ok=True)
    rows, cols, chunk_rows = default_shape(False)
    ds = make_dataset(
        data_dir, options.rows or rows, options.cols or cols, options.chunk_rows or chunk_rows
    )
    repeats = options.rounds or stores_cases.STORE_REPEATS
    skipped: dict[str, str] = {}
    threads = os.cpu_count() or 1  # as cases.Workload
    results = stores_cases.measure_stores(
        ds, data_dir, repeats=repeats, threads=threads, skipped=skipped
    )
    print("\n" + "\n".join(stores_cases.stores_section(results)) + "\n")
    run = SuiteRun(ds, False, repeats, results, skipped, {}, {}, [])
    for target in targets.evaluate(run, targets.STORE_TARGETS):
        why = f" ({target.why})" if target.why else ""
        print(f"  {target.status}  {target.what}: {target.measured}{why}")


def run_cpu(options: argparse.Namespace) -> None:
    """Issue 20's CPU cases alone; evaluate ``CPU_TARGETS``, write ``cpu.md`` / ``cpu.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    ds = cpu.dataset(data_dir, options.rows, options.cols, options.chunk_rows)
    repeats = options.rounds or cpu.ROUNDS
    skipped: dict[str, str] = {}
    load = os.getloadavg()
    results = cpu.measure(ds, repeats, skipped)
    load_after = os.getloadavg()
    run = SuiteRun(ds, False, repeats, results, skipped, {}, {}, [])
    evaluated = targets.evaluate(run, targets.CPU_TARGETS)
    command = "python -m benchmarks --only cpu" + "".join(
        f" --{flag} {value}"
        for flag, value in (
            ("rows", options.rows),
            ("cols", options.cols),
            ("chunk-rows", options.chunk_rows),
            ("rounds", options.rounds),
        )
        if value
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# CPU per GB (issue 20)",
        "",
        f"`{command}` on {now}: {ds.rows:,} x {ds.cols} float32 in {ds.chunk_rows}-row "
        f"chunks, zarr's default codec (zstd), local directory store; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, zarr {zarr.__version__}, numpy "
        f"{np.__version__}; load average (1 min) {load[0]:.2f} at the start, "
        f"{load_after[0]:.2f} at the end.  {repeats} interleaved rounds; CPU is this "
        "process's (`time.process_time`, all threads) over the same region as the wall "
        "clock.",
        "",
        *cpu.section(results)[2:],
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {t.what} | {t.measured} | {t.status}{f' ({t.why})' if t.why else ''} |"
          for t in evaluated),
    ]  # fmt: skip
    text = "\n".join(lines) + "\n"
    (out / "cpu.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "load": [load, load_after],
        "cases": cpu.payload(results),
        "targets": [t.__dict__ for t in evaluated],
        "skipped": skipped,
    }
    (out / "cpu.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)


def run_big_samples(options: argparse.Namespace) -> None:
    """Measure, evaluate ``BIG_SAMPLE_TARGETS``, write ``big_samples.md`` / ``.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    fields = options.fields or big.FIELDS
    repeats = options.rounds or big.ROUNDS
    load = os.getloadavg()
    results = big.measure(data_dir, fields, repeats)
    load_after = os.getloadavg()
    run = SuiteRun(None, False, repeats, results, {}, {}, {}, [])  # type: ignore[arg-type]  # no dataset
    evaluated = targets.evaluate(run, targets.BIG_SAMPLE_TARGETS)
    command = (
        "python -m benchmarks --only big-samples"
        + (f" --fields {fields}" if fields != big.FIELDS else "")
        + (f" --rounds {repeats}" if repeats != big.ROUNDS else "")
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Big samples (issue 16)",
        "",
        f"`{command}` on {now}: {fields} fields of {big.FIELD[0]} x {big.FIELD[1]} float32 "
        f"({fields * big.FIELD[0] * big.FIELD[1] * 4 / MB:.0f} MB per array), "
        "chunks of 1, 4 and 32 fields, zarr's default codec (zstd), local directory store; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, zarr {zarr.__version__}, "
        f"numpy {np.__version__}; load average (1 min) {load[0]:.1f} at the start, "
        f"{load_after[0]:.1f} at the end.  Each kind's throughput over L0 (zarr reading the "
        f"same chunks one at a time on one thread): ratios of the medians of {repeats} "
        "interleaved rounds.",
        "",
        *big.table(results),
        "",
        "CPU time of one epoch (this process, all threads; one more epoch of each case "
        "after the rounds) over L0's: a kind needs that many times L0's CPU, so on a "
        "machine whose other jobs leave it about one core it cannot run faster than "
        "L0 / that ratio.",
        "",
        *big.cpu_table(results),
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {t.what} | {t.measured} | {t.status} |" for t in evaluated),
    ]
    text = "\n".join(lines) + "\n"
    (out / "big_samples.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "load": [load, load_after],
        "cases": {
            r.name: {"bytes": r.bytes, "seconds": r.extra["seconds"], "cpu": r.extra.get("cpu")}
            for r in results.values()
        },
        "targets": [t.__dict__ for t in evaluated],
    }
    (out / "big_samples.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)


def run_patches(options: argparse.Namespace) -> None:
    """The patch cases of issue 16; writes ``<out>/patches.md`` and ``patches.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    steps = options.steps or patch_cases.STEPS
    repeats = options.rounds or patch_cases.ROUNDS
    skipped: dict[str, str] = {}
    results = patch_cases.measure_patches(data_dir, steps=steps, repeats=repeats, skipped=skipped)
    run = SuiteRun(Dataset(data_dir, steps, 0, 0), False, repeats, results, skipped, {}, {}, [])
    evaluated = targets.evaluate(run, targets.PATCH_TARGETS)
    command = "python -m benchmarks --only patches"
    if options.steps:
        command += f" --steps {steps}"
    if options.rounds:
        command += f" --rounds {repeats}"
    print("\n" + patch_cases.write_outputs(results, evaluated, out, command=command, steps=steps))


def run_cache(options: Any) -> None:
    """Only the cache cases; print their table and targets, write ``--out``/cache.md, .json."""
    data_dir = Path(options.data)
    data_dir.mkdir(parents=True, exist_ok=True)
    rows, cols, chunk_rows = default_shape(False)
    ds = make_dataset(
        data_dir, options.rows or rows, options.cols or cols, options.chunk_rows or chunk_rows
    )
    skipped: dict[str, str] = {}
    repeats = options.rounds or stores_cases.STORE_REPEATS
    results = cache_cases.measure_cache(ds, data_dir, repeats=repeats, skipped=skipped)
    section = cache_cases.cache_section(results)
    run = SuiteRun(ds, False, repeats, results, skipped, {}, {}, [])
    lines = [*section, "", "| target | measured | status |", "|---|---:|---|"]
    for target in targets.evaluate(run, targets.CACHE_TARGETS):
        why = f" ({target.why})" if target.why else ""
        lines.append(f"| {target.what} | {target.measured} | {target.status}{why} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cache.md").write_text(
        f"<!-- python -m benchmarks --only cache; load {os.getloadavg()} -->\n\n{text}"
    )
    (out / "cache.json").write_text(
        json.dumps(
            {k: {"mb_s": r.mb_s, "seconds": r.seconds, **r.extra} for k, r in results.items()},
            indent=1,
            default=str,
        )
    )


def run_collection(options: argparse.Namespace) -> None:
    """Measure, evaluate ``COLLECTION_TARGETS``, write ``collection.md`` / ``.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    repeats = options.rounds or coll.ROUNDS
    load = os.getloadavg()
    results = coll.measure(data_dir, coll.STORES, repeats)
    load_after = os.getloadavg()
    run = SuiteRun(None, False, repeats, results, {}, {}, {}, [])  # type: ignore[arg-type]  # no dataset
    evaluated = targets.evaluate(run, targets.COLLECTION_TARGETS)
    command = "python -m benchmarks --only collection" + (
        f" --rounds {repeats}" if repeats != coll.ROUNDS else ""
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Collections (issue 18)",
        "",
        f"`{command}` on {now}: {coll.STORES} stores of {coll.ROWS:,} x {coll.COLS} float32 "
        f"joined by `open_collection` against one store of {coll.STORES * coll.ROWS:,} rows, "
        f"all in {coll.CHUNK_ROWS}-row chunks, zarr's default codec (zstd), local directory "
        f"stores; {os.cpu_count()} CPUs, Python {platform.python_version()}, zarr "
        f"{zarr.__version__}, numpy {np.__version__}; load average (1 min) {load[0]:.1f} at "
        f"the start, {load_after[0]:.1f} at the end.  Ratios of the medians of {repeats} "
        "interleaved rounds.",
        "",
        *coll.table(results),
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {t.what} | {t.measured} | {t.status} |" for t in evaluated),
    ]
    text = "\n".join(lines) + "\n"
    (out / "collection.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "load": [load, load_after],
        "cases": {
            r.name: {"bytes": r.bytes, "seconds": r.extra["seconds"]} for r in results.values()
        },
        "targets": [t.__dict__ for t in evaluated],
    }
    (out / "collection.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)


def run_mixture(options: argparse.Namespace) -> None:
    """Measure, evaluate ``MIXTURE_TARGETS``, write ``mixture.md`` / ``.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    repeats = options.rounds or mx.ROUNDS
    load = os.getloadavg()
    results = mx.measure(data_dir, repeats)
    load_after = os.getloadavg()
    run = SuiteRun(None, False, repeats, results, {}, {}, {}, [])  # type: ignore[arg-type]  # no dataset
    evaluated = targets.evaluate(run, targets.MIXTURE_TARGETS)
    command = "python -m benchmarks --only mixture" + (
        f" --rounds {repeats}" if repeats != mx.ROUNDS else ""
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = mixture_report(results, evaluated, command, now, load, load_after, repeats)
    (out / "mixture.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "load": [load, load_after],
        "cases": {
            r.name: {
                "bytes": r.bytes,
                "samples": r.samples,
                "amplification": r.amplification,
                "seconds": r.extra["seconds"],
            }
            for r in results.values()
        },
        "targets": [t.__dict__ for t in evaluated],
    }
    (out / "mixture.json").write_text(json.dumps(payload, indent=1) + "\n")
    print("\n" + text)


def mixture_report(
    results: dict[str, Result],
    evaluated: list[targets.Target],
    command: str,
    now: str,
    load: tuple[float, ...],
    load_after: tuple[float, ...],
    repeats: int,
) -> str:
    """``mixture.md``: the setting, the table of ``mixture.table`` and the targets."""
    rows = " and ".join(f"{n:,}" for n in mx.ROWS)
    lines = [
        "# Mixtures (issue 18)",
        "",
        f"`{command}` on {now}: `mix` of two stores of {rows} x {mx.COLS} float32 "
        f"(weights by length, `stop='first_exhausted'`: every sample of both once) against "
        f"the same two stores streamed one after the other, all in {mx.CHUNK_ROWS}-row "
        f"chunks, zarr's default codec (zstd), local directory stores; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, zarr {zarr.__version__}, numpy "
        f"{np.__version__}; load average (1 min) {load[0]:.1f} at the start, "
        f"{load_after[0]:.1f} at the end.  Ratios of the medians of {repeats} interleaved "
        "rounds; read amplification from the streams' stats.",
        "",
        *mx.table(results),
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {t.what} | {t.measured} | {t.status} |" for t in evaluated),
    ]
    return "\n".join(lines) + "\n"


def run_writes(options: argparse.Namespace) -> None:
    """Measure, evaluate ``WRITE_TARGETS``, write ``writes.md`` / ``.json``."""
    data_dir, out = Path(options.data), Path(options.out)
    data_dir.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    repeats = options.rounds or wr.ROUNDS
    rows = options.rows or wr.ROWS
    load = os.getloadavg()
    cluster = not getattr(options, "no_cluster", False)
    results = wr.measure(data_dir, rows, repeats, cluster=cluster)
    load_after = os.getloadavg()
    skipped = {} if cluster else {"cluster": "--no-cluster"}
    run = SuiteRun(None, False, repeats, results, skipped, {}, {}, [])  # type: ignore[arg-type]  # no dataset
    evaluated = targets.evaluate(run, targets.WRITE_TARGETS)
    command = (
        "python -m benchmarks --only writes"
        + (f" --rounds {repeats}" if repeats != wr.ROUNDS else "")
        + (f" --rows {rows}" if rows != wr.ROWS else "")
        + ("" if cluster else " --no-cluster")
    )
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Per-chunk jobs that write (issue 19)",
        "",
        f"`{command}` on {now}: {rows:,} x {wr.COLS} float32 in {wr.CHUNK_ROWS}-row chunks, "
        f"zarr's default codec (zstd), local directory stores, local threads "
        f"(and a LocalCluster of {wr.WORKERS} process workers x 1 thread for its cases); "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, zarr {zarr.__version__}, "
        f"numpy {np.__version__}; load average (1 min) {load[0]:.1f} at the start, "
        f"{load_after[0]:.1f} at the end.  Medians of {repeats} interleaved rounds.",
        "",
        *wr.table(results),
        "",
        "| target | measured | result |",
        "|---|---|---|",
        *(f"| {t.what} | {t.measured} | {t.status} |" for t in evaluated),
    ]
    text = "\n".join(lines) + "\n"
    (out / "writes.md").write_text(text)
    payload = {
        "command": command,
        "date": now,
        "load": [load, load_after],
        "cases": {r.name: {"bytes": r.bytes, **r.extra} for r in results.values()},
        "targets": [t.__dict__ for t in evaluated],
    }
    (out / "writes.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print("\n" + text)
