"""The decoded-chunk cache (issue 17): epoch 2 from memory or disk, not the store.

On the stores of ``stores_cases`` (a local store without latency, the 20 ms and
100 ms :class:`~benchmarks.latency_store.LatencyStore`, S3 on loopback when s3fs and
moto are installed), over the same smaller dataset of ``SUBSET_CHUNKS`` chunks, one
stream kind (the buffered shuffle of 8 chunks, batch 256) in interleaved rounds:

- **uncached**: the stream with no cache;
- **epoch 1**: a new :class:`~daskzarr_batches.ChunkCache` each run (what the first
  epoch costs with a cache: reads plus keeping every chunk);
- **epoch 2**: a cache that already holds the array (filled once before the rounds);
- **disk, new process** (latency stores): a directory filled once, read by a new
  process with ``ChunkCache(0, directory=...)`` (memory 0: every chunk from a file);
  timed inside that process, from before the stream is made until it is exhausted
  (``time_epoch``), so interpreter start-up is not counted;
- **exact, 1/4 budget** (20 ms store): an exact shuffle whose ``memory_budget`` is a
  quarter of the array (read amplification about 4 uncached), with a cache that holds
  the array: the store requests of epoch 1 and epoch 2 per stored chunk;
- **LocalCluster exact shuffle** (20 ms store): the same exact shuffle on a
  ``LocalCluster`` of 2 process workers x 1 thread, with a cache holding the array
  (its decoded chunks kept as cluster futures): seconds of epoch 1 (a new cache) and
  epoch 2, and the chunk reads each made (cache misses: one store read per chunk
  task) against the uncached epoch on the same cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zarr
import zarr.storage

import daskzarr_batches as dzb

from ..latency_store import LatencyStore
from . import ROOT
from .dataset import Dataset
from .measure import Case, Measured, Result, drain, rounds
from .stores_cases import (
    LATENCIES,
    STORE_REPEATS,
    Opened,
    open_local,
    s3_available,
    s3_copy,
    subset,
)

#: the stores of these cases (the first part of a case name)
LOCAL = "cache, local, no latency"
S3_STORE = "cache, S3 loopback"
#: the kinds (the second part)
UNCACHED = "buffered, uncached"
EPOCH_1 = "buffered, epoch 1 (new memory cache)"
EPOCH_2 = "buffered, epoch 2 (memory cache holding the array)"
DISK = "buffered, disk cache, new process"
EXACT_READS = "exact 1/4 budget, cache holding the array"
CLUSTER_EXACT = "LocalCluster exact shuffle 1/4 budget, epoch 2 vs epoch 1"


def store_label(delay: float) -> str:
    return f"cache, {delay * 1000:.0f} ms"


def name(store: str, kind: str) -> str:
    return f"[{store}] {kind}"


def buffered(o: Opened, cache: dzb.ChunkCache | None, epoch: int = 0) -> Measured:
    return drain(
        dzb.shuffled_batch_stream(
            o.x, 256, seed=0, epoch=epoch, shuffle_buffer_size=o.buffer_rows, cache=cache
        )
    )


def store_cases(o: Opened, label: str, memory: int) -> list[Case]:
    """Uncached, epoch 1 and epoch 2 of the buffered stream over ``o``."""
    warm = dzb.ChunkCache(memory)
    buffered(o, warm)  # filled once, before the rounds
    return [
        Case(name(label, UNCACHED), "reference", lambda: buffered(o, None)),
        Case(name(label, EPOCH_1), "this", lambda: buffered(o, dzb.ChunkCache(memory))),
        Case(name(label, EPOCH_2), "this", lambda: buffered(o, warm, 1)),
    ]


#: one epoch in a new process, timed there; prints JSON
_NEW_PROCESS = """
import json, sys, zarr, zarr.storage, daskzarr_batches as dzb
from benchmarks.latency_store import LatencyStore
from daskzarr_batches.streams.timing import time_epoch
path, directory, delay, buffer_rows = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
store = LatencyStore(zarr.storage.LocalStore(path, read_only=True), delay, metadata=True)
x = zarr.open_group(store=store, mode="r")["features"]
cache = dzb.ChunkCache(0, directory=directory)
seconds, stats = time_epoch(lambda: dzb.shuffled_batch_stream(
    x, 256, seed=0, epoch=1, shuffle_buffer_size=buffer_rows, cache=cache))
print(json.dumps({"seconds": seconds, "bytes": stats.bytes_yielded,
                  "samples": stats.samples_yielded, "hits": stats.cache_hits,
                  "misses": stats.cache_misses, "requests": store.requests}))
"""


def disk_new_process(small: Dataset, delay: float, directory: Path, repeats: int) -> Result:
    """The best of ``repeats`` epochs, each in a new process reading ``directory``."""
    o = open_local("fill", small, delay)
    buffered(o, dzb.ChunkCache(0, directory=directory))  # filled once
    extra = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *([extra] if extra else [])])}
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", _NEW_PROCESS, str(small.path),
             str(directory), str(delay), str(8 * small.chunk_rows)],
            capture_output=True, text=True, check=True, env=env,
        ).stdout  # fmt: skip
        runs.append(json.loads(out.strip().splitlines()[-1]))
    best = min(runs, key=lambda r: r["seconds"])
    result = Result(name(store_label(delay), DISK), "this", best["seconds"], best["bytes"],
                    best["samples"])  # fmt: skip
    result.extra |= {
        "seconds": [r["seconds"] for r in runs],
        "cache_hits": best["hits"],
        "cache_misses": best["misses"],
        "requests": best["requests"],
    }
    return result


def exact_reads(small: Dataset, delay: float) -> Result:
    """Store requests per stored chunk of an exact shuffle at 1/4 budget, epochs 1 and 2."""
    store = LatencyStore(zarr.storage.LocalStore(small.path, read_only=True), delay)
    x = zarr.open_group(store=store, mode="r")["features"]
    assert isinstance(x, zarr.Array)
    chunks = -(-x.shape[0] // x.chunks[0])
    budget = x.nbytes // 4
    uncached = dzb.plan_epoch(x, 256, shuffle=True, seed=0, memory_budget=budget)
    cache = dzb.ChunkCache(2 * x.nbytes)
    reads, seconds = [], []
    for epoch in range(2):
        before = store.requests
        started = time.perf_counter()
        stream = dzb.shuffled_batch_stream(
            x, 256, seed=0, epoch=epoch, memory_budget=budget, cache=cache
        )
        nbytes, samples, _ = drain(stream)
        seconds.append(time.perf_counter() - started)
        reads.append((store.requests - before) / chunks)
    result = Result(name(store_label(delay), EXACT_READS), "this", seconds[1], nbytes, samples,
                    uncached.read_amplification)  # fmt: skip
    result.extra |= {
        "reads_per_chunk": reads,
        "seconds_per_epoch": seconds,
        "uncached_read_amplification": uncached.read_amplification,
        "windows": uncached.n_windows,
    }
    return result


def cluster_exact(small: Dataset, delay: float, workers: int = 2) -> Result:
    """An exact shuffle at 1/4 budget on a LocalCluster: uncached, then epochs 1 and 2 cached.

    Each epoch's seconds from before the stream is made until it is exhausted; the
    chunk reads are the store reads of the chunk tasks (``cache_misses``) or, uncached,
    the plan's chunk reads.
    """
    from distributed import Client, LocalCluster

    extra = os.environ.get("PYTHONPATH")  # the workers unpickle the latency store
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([extra] if extra else [])])
    store = LatencyStore(zarr.storage.LocalStore(small.path, read_only=True), delay)
    x = zarr.open_group(store=store, mode="r")["features"]
    assert isinstance(x, zarr.Array)
    chunks = -(-x.shape[0] // x.chunks[0])
    budget = x.nbytes // 4
    plan = dzb.plan_epoch(x, 256, shuffle=True, seed=0, memory_budget=budget)
    seconds, reads, hits = [], [], []
    try:
        with (
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=":0") as cluster,
            Client(cluster, set_as_default=False) as client,
        ):  # fmt: skip
            cache = dzb.ChunkCache(2 * x.nbytes)
            for epoch, using in ((0, None), (0, cache), (1, cache)):
                started = time.perf_counter()
                stream = dzb.shuffled_batch_stream(
                    x, 256, seed=0, epoch=epoch, memory_budget=budget, cache=using,
                    client=client,
                )  # fmt: skip
                nbytes, samples, _ = drain(stream)
                seconds.append(time.perf_counter() - started)
                misses = stream.stats.cache_misses if using else plan.chunks_read
                reads.append(misses / chunks)
                hits.append(stream.stats.cache_hits)
            cache.clear()
    finally:
        if extra is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = extra
    result = Result(name(store_label(delay), CLUSTER_EXACT), "this", seconds[2], nbytes, samples,
                    plan.read_amplification)  # fmt: skip
    result.extra |= {
        "workers": workers,
        "seconds_uncached_epoch_1_epoch_2": seconds,
        "chunk_reads_per_chunk": reads,
        "cache_hits": hits,
        "epoch_2_over_epoch_1": seconds[1] / seconds[2],
        "epoch_2_over_uncached": seconds[0] / seconds[2],
        "uncached_read_amplification": plan.read_amplification,
        "windows": plan.n_windows,
    }
    return result


def measure_cache(
    ds: Dataset, data_dir: Path, *, repeats: int, skipped: dict[str, str]
) -> dict[str, Result]:
    """Every cache case, the store groups each in their own interleaved rounds."""
    repeats = min(repeats, STORE_REPEATS)
    small = subset(ds, data_dir)
    memory = 2 * small.features.nbytes
    started = time.perf_counter()
    print(f"chunk cache: {small.rows:,} rows, {repeats} interleaved rounds")
    cases = store_cases(open_local(LOCAL, small), LOCAL, memory)
    for delay in LATENCIES:
        cases += store_cases(
            open_local(store_label(delay), small, delay), store_label(delay), memory
        )
    results = rounds(cases, repeats)
    for delay in LATENCIES:
        directory = Path(tempfile.mkdtemp(prefix="dzb-cache-bench-", dir=data_dir))
        try:
            result = disk_new_process(small, delay, directory, repeats)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        results[result.name] = result
        print(f"  {result.name:56s} {result.mb_s:9.1f} MB/s  {result.extra}")
    result = exact_reads(small, LATENCIES[0])
    results[result.name] = result
    print(f"  {result.name:56s} {result.extra}")
    result = cluster_exact(small, LATENCIES[0])
    results[result.name] = result
    print(f"  {result.name:56s} {result.extra}")
    if s3_available(skipped):
        with s3_copy(small, obstore=False) as (s3,):  # through s3fs, as measured before
            results |= rounds(store_cases(s3, S3_STORE, memory), repeats)
    print(f"  cache cases took {time.perf_counter() - started:.0f} s")
    return results


def cache_section(results: dict[str, Result]) -> list[str]:
    """The report's table: per store, epoch 1 and 2 against uncached and the local store."""
    labels = [LOCAL, *(store_label(d) for d in LATENCIES), S3_STORE]
    rows = [label for label in labels if name(label, UNCACHED) in results]
    if not rows:
        return []
    local = results.get(name(LOCAL, UNCACHED))
    lines = [
        "## Chunk cache: epoch 2 from memory or disk (issue 17)",
        "",
        f"The buffered shuffle (8 chunks, batch 256) over {SUBSET_CHUNKS_TEXT}; MB/s, then "
        "ratios over the uncached epoch on the same store and over the uncached epoch on the "
        "local store without latency.  Disk: a directory filled once, read by a new process "
        "with `ChunkCache(0, directory=...)`, timed inside it.",
        "",
        "| store | uncached MB/s | epoch 1 | epoch 2 (memory) | epoch 2 / local uncached "
        "| disk, new process |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label in rows:
        base = results[name(label, UNCACHED)]
        cells = [f"{base.mb_s:,.1f}"]
        for kind in (EPOCH_1, EPOCH_2):
            r = results.get(name(label, kind))
            cells.append("-" if r is None else f"{r.mb_s:,.1f} ({r.mb_s / base.mb_s:.2f}x)")
        r = results.get(name(label, EPOCH_2))
        cells.append("-" if r is None or local is None else f"{r.mb_s / local.mb_s:.2f}x")
        r = results.get(name(label, DISK))
        cells.append("-" if r is None else f"{r.mb_s:,.1f} ({r.mb_s / base.mb_s:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for key, r in results.items():
        if key.endswith(EXACT_READS):
            one, two = r.extra["reads_per_chunk"]
            lines += [
                "",
                f"Exact shuffle at a quarter budget ({r.extra['windows']} windows, read "
                f"amplification {r.extra['uncached_read_amplification']:.2f} uncached) with a "
                f"cache holding the array, {key}: store requests per stored chunk {one:.2f} in "
                f"epoch 1 and {two:.2f} in epoch 2 (epochs "
                + ", ".join(f"{s:.2f} s" for s in r.extra["seconds_per_epoch"])
                + ").",
            ]
        if key.endswith(CLUSTER_EXACT):
            uncached, one, two = r.extra["seconds_uncached_epoch_1_epoch_2"]
            reads = r.extra["chunk_reads_per_chunk"]
            lines += [
                "",
                f"{key}: the same exact shuffle on a LocalCluster of {r.extra['workers']} "
                "process workers x 1 thread, the cache's chunks kept as cluster futures: "
                f"uncached {uncached:.2f} s ({reads[0]:.2f} chunk reads per stored chunk), "
                f"epoch 1 with a new cache {one:.2f} s ({reads[1]:.2f}), epoch 2 {two:.2f} s "
                f"({reads[2]:.2f}): epoch 2 {one / two:.2f}x epoch 1, "
                f"{uncached / two:.2f}x uncached.",
            ]
    return lines


SUBSET_CHUNKS_TEXT = "the stores' smaller dataset (64 chunks)"
