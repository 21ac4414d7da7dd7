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
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zarr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import daskzarr_batches as dzb  # noqa: E402

MB = 1e6
MiB = 2**20
#: glibc returns large freed blocks to the system only above its mmap threshold,
#: which it raises as blocks are freed; fixing it shows how much of a peak RSS
#: is memory the allocator kept rather than memory the stream holds.
MMAP_ENV = {"MALLOC_MMAP_THRESHOLD_": "524288"}


# --------------------------------------------------------------------------
# Dataset


@dataclass(frozen=True)
class Dataset:
    path: Path
    rows: int
    cols: int
    chunk_rows: int

    @property
    def features(self) -> zarr.Array:
        return zarr.open_array(self.path / "features", mode="r")

    @property
    def labels(self) -> zarr.Array:
        return zarr.open_array(self.path / "labels", mode="r")

    @property
    def feature_bytes(self) -> int:
        return self.rows * self.cols * 4

    @property
    def row_bytes(self) -> int:
        return self.cols * 4


def make_dataset(data_dir: Path, rows: int, cols: int, chunk_rows: int) -> Dataset:
    """Create (once) a group with ``features`` (float32) and ``labels`` (int64)."""
    path = data_dir / f"x{rows}_c{cols}_r{chunk_rows}.zarr"
    dataset = Dataset(path, rows, cols, chunk_rows)
    done = path / "complete"
    if done.exists():
        return dataset
    started = time.perf_counter()
    group = zarr.open_group(path, mode="w")
    x = group.create_array("features", shape=(rows, cols), chunks=(chunk_rows, cols), dtype="f4")
    y = group.create_array("labels", shape=(rows,), chunks=(chunk_rows,), dtype="i8")
    rng = np.random.default_rng(0)
    step = chunk_rows * max(1, (64 * MiB) // (chunk_rows * cols * 4))
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        x[lo:hi] = rng.standard_normal((hi - lo, cols), dtype=np.float32)
        y[lo:hi] = np.arange(lo, hi)
    done.write_text("ok")
    print(f"generated {path} in {time.perf_counter() - started:.1f} s", flush=True)
    return dataset


# --------------------------------------------------------------------------
# Measurement


class PeakRSS:
    """Samples this process's RSS in a thread; ``peak`` and ``growth`` in bytes."""

    def __init__(self, interval: float = 0.005) -> None:
        self._process = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.start = self._process.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def growth(self) -> int:
        return self.peak - self.start


@dataclass
class Result:
    name: str
    group: str
    seconds: float
    bytes: int
    samples: int
    amplification: float = 1.0
    rss_growth: int = 0
    extrapolated: bool = False
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mb_s(self) -> float:
        return self.bytes / self.seconds / MB if self.seconds > 0 else float("nan")

    @property
    def samples_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")


def timed(
    name: str,
    group: str,
    run: Callable[[], tuple[int, int, float]],
    repeats: int,
    quiet: bool = False,
) -> Result:
    """Best of ``repeats`` runs of ``run() -> (bytes, samples, amplification)``."""
    best: Result | None = None
    for _ in range(repeats):
        with PeakRSS() as rss:
            started = time.perf_counter()
            nbytes, samples, amplification = run()
            seconds = time.perf_counter() - started
        result = Result(name, group, seconds, nbytes, samples, amplification, rss.growth)
        if best is None or result.seconds < best.seconds:
            best = result
    assert best is not None
    if not quiet:
        report(best)
    return best


@dataclass
class Case:
    name: str
    group: str
    run: Callable[[], tuple[int, int, float]]
    repeats: int | None = None


def rounds(cases: list[Case], repeats: int) -> dict[str, Result]:
    """Run every case once per round, ``repeats`` rounds; keep each case's best.

    Interleaving spreads the load of a shared machine over all cases alike.
    """
    best: dict[str, Result] = {}
    seconds: dict[str, list[float]] = {}
    for round_number in range(repeats):
        for case in cases:
            if round_number >= (case.repeats or repeats):
                continue
            result = timed(case.name, case.group, case.run, 1, quiet=True)
            seconds.setdefault(case.name, []).append(result.seconds)
            if case.name not in best or result.seconds < best[case.name].seconds:
                best[case.name] = result
    for result in best.values():
        result.extra["seconds"] = seconds[result.name]
        report(result)
    return best


def report(best: Result) -> None:
    print(
        f"  {best.name:56s} {best.mb_s:9.1f} MB/s  amp {best.amplification:5.2f}  "
        f"RSS +{best.rss_growth / MiB:6.0f} MiB",
        flush=True,
    )


def drain(stream: dzb.BatchStream) -> tuple[int, int, float]:
    for _ in stream:
        pass
    stats = stream.stats
    return stats.bytes_yielded, stats.samples_yielded, stats.read_amplification


# --------------------------------------------------------------------------
# Reference readers


def l0(x: zarr.Array) -> tuple[int, int, float]:
    rows = x.chunks[0]
    for lo in range(0, x.shape[0], rows):
        x[lo : lo + rows]
    return x.nbytes, x.shape[0], 1.0


def zarr_threads(x: zarr.Array, threads: int) -> tuple[int, int, float]:
    rows = x.chunks[0]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda lo: x[lo : lo + rows], range(0, x.shape[0], rows)):
            pass
    return x.nbytes, x.shape[0], 1.0


def raw_decoder(x: zarr.Array) -> Callable[[bytes], np.ndarray] | None:
    """A decoder of stored chunk bytes for arrays stored as bytes + one compressor."""
    import numcodecs

    codecs = getattr(x.metadata, "codecs", ())
    names = [type(codec).__name__ for codec in codecs]
    if len(codecs) != 2 or names[0] != "BytesCodec":
        return None
    compressor = {
        "ZstdCodec": lambda c: numcodecs.Zstd(level=c.level),
        "BloscCodec": lambda c: numcodecs.Blosc(),
        "GzipCodec": lambda c: numcodecs.GZip(),
    }.get(names[1])
    if compressor is None:
        return None
    codec = compressor(codecs[1])
    return codec.decode  # type: ignore[no-any-return]


def raw_decode(x: zarr.Array, root: Path, threads: int) -> tuple[int, int, float]:
    """Read every stored chunk file and decode it on ``threads`` threads."""
    decode = raw_decoder(x)
    assert decode is not None
    n_chunks = math.ceil(x.shape[0] / x.chunks[0])

    def one(i: int) -> int:
        data = (root / "c" / str(i) / "0").read_bytes()
        return len(decode(data))

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        decoded = sum(pool.map(one, range(n_chunks)))
    # edge chunk is stored padded to a whole chunk: count the array's bytes
    assert decoded >= x.nbytes
    return x.nbytes, x.shape[0], 1.0


def dask_slices(x: zarr.Array, batch: int, count: int) -> tuple[int, int, float]:
    import dask.array as da

    array = da.from_zarr(x)
    for k in range(count):
        array[k * batch : (k + 1) * batch].compute()
    return count * batch * x.dtype.itemsize * x.shape[1], count * batch, 1.0


def dask_random(x: zarr.Array, batch: int, count: int) -> tuple[int, int, float]:
    import dask.array as da

    array = da.from_zarr(x)
    rng = np.random.default_rng(0)
    for _ in range(count):
        index = np.sort(rng.choice(x.shape[0], batch, replace=False))
        array[index].compute()
    return count * batch * x.dtype.itemsize * x.shape[1], count * batch, 1.0


def xbatcher_batches(x: zarr.Array, batch: int, count: int) -> tuple[int, int, float]:
    import dask.array as da
    import xarray as xr
    import xbatcher

    data = xr.DataArray(da.from_zarr(x), dims=("sample", "feature"))
    generator = xbatcher.BatchGenerator(data, input_dims={"sample": batch})
    for k, item in enumerate(generator):
        if k == count:
            break
        np.asarray(item.values)
    return count * batch * x.dtype.itemsize * x.shape[1], count * batch, 1.0


class SampleDataset:
    """The usual torch ``Dataset``: one Zarr read per sample."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._array: zarr.Array | None = None

    def __len__(self) -> int:
        return int(zarr.open_array(self.path, mode="r").shape[0])

    def __getitem__(self, index: int) -> np.ndarray:
        if self._array is None:
            self._array = zarr.open_array(self.path, mode="r")
        return np.asarray(self._array[index])


def torch_loader(path: str, batch: int, count: int) -> Callable[[], tuple[int, int, float]]:
    import torch.utils.data

    dataset = SampleDataset(path)

    def run() -> tuple[int, int, float]:
        # Timed from the first request, worker start-up included: the workers
        # prefetch 2 batches each, so skipping a warm-up batch would time
        # batches that were loaded before the clock started.
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=2)
        nbytes = samples = 0
        for k, item in enumerate(loader):
            if k == count:
                break
            nbytes += item.numpy().nbytes
            samples += len(item)
        return nbytes, samples, 1.0

    return run


# --------------------------------------------------------------------------
# Shuffle quality (pure: from the plan, no data read)


def shuffle_order(plan: dzb.EpochPlan) -> np.ndarray:
    return np.concatenate([np.asarray(w.samples) for w in plan.windows()])


def displacement(order: np.ndarray) -> float:
    """Mean |new position - old position| / n, over 1/3 (exact ~ 1.0, none = 0)."""
    n = len(order)
    return float(np.abs(order - np.arange(n)).mean() / n * 3)


def neighbour_entropy(order: np.ndarray, bins: int = 256) -> float:
    """Entropy (bits) of the histogram of differences between neighbouring ids."""
    n = len(order)
    diffs = np.diff(order)
    hist, _ = np.histogram(diffs, bins=bins, range=(-n, n))
    p = hist[hist > 0] / hist.sum()
    return float(-(p * np.log2(p)).sum())


# --------------------------------------------------------------------------
# Memory cases (each in a fresh process)


def memory_case(args: argparse.Namespace) -> None:
    """Child process: one epoch, print peak RSS as JSON."""
    x = zarr.open_array(Path(args.memory_case) / "features", mode="r")
    baseline = psutil.Process().memory_info().rss
    with PeakRSS() as rss:
        if args.budget:
            stream = dzb.shuffled_batch_stream(
                x, 256, seed=0, memory_budget=args.budget, prefetch=args.prefetch
            )
        else:
            stream = dzb.shuffled_batch_stream(
                x, 256, seed=0, shuffle_buffer_size=args.buffer, prefetch=args.prefetch
            )
        _, samples, amplification = drain(stream)
    print(
        json.dumps(
            {
                "baseline": baseline,
                "peak": rss.peak,
                "amplification": amplification,
                "samples": samples,
                "peak_window_bytes": stream.summary().peak_window_bytes,
            }
        )
    )


def run_memory_case(
    path: Path,
    *,
    buffer: int = 0,
    budget: int = 0,
    prefetch: int,
    env: dict[str, str] | None = None,
) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-case",
        str(path),
        "--buffer",
        str(buffer),
        "--budget",
        str(budget),
        "--prefetch",
        str(prefetch),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, cwd=ROOT, env=os.environ | (env or {})
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --------------------------------------------------------------------------
# The suite


@dataclass
class Target:
    what: str
    measured: str
    passed: bool | None  # None: not measured (skipped)
    why: str = ""


def run_suite(args: argparse.Namespace) -> None:
    data_dir = Path(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    ds = make_dataset(data_dir, args.rows, args.cols, args.chunk_rows)
    x, y = ds.features, ds.labels
    threads = os.cpu_count() or 1
    repeats = args.repeats
    results: dict[str, Result] = {}
    skipped: dict[str, str] = {}
    few = 10 if args.quick else 40

    print(f"dataset {ds.path} ({ds.feature_bytes / MB:.0f} MB features), {threads} CPUs")
    load_before = os.getloadavg()
    warm_up(x)
    buffer_rows = 8 * ds.chunk_rows
    budget = ds.feature_bytes // 4

    def shuffled(batch: int, **kwargs: Any) -> Callable[[], tuple[int, int, float]]:
        return lambda: drain(dzb.shuffled_batch_stream(x, batch, seed=0, **kwargs))

    cases: list[Case] = [
        Case("L0: zarr chunk-aligned, 1 thread", "reference", lambda: l0(x)),
        Case(
            f"zarr chunk-aligned, {2 * threads} threads",
            "reference",
            lambda: zarr_threads(x, 2 * threads),
        ),
    ]
    if raw_decoder(x) is not None:
        cases.append(
            Case(
                f"raw chunk bytes + decode, {threads} threads (limit)",
                "reference",
                lambda: raw_decode(x, ds.path / "features", threads),
            )
        )
    else:
        skipped["raw decode"] = "codec pipeline is not bytes + one compressor"
    cases += [
        Case("sequential, batch 256", "this", lambda: drain(dzb.batch_stream(x, 256))),
        Case("sequential, batch 32", "this", lambda: drain(dzb.batch_stream(x, 32))),
        Case("buffered shuffle (8 chunks), batch 256", "this",
             shuffled(256, shuffle_buffer_size=buffer_rows)),
        Case("buffered shuffle (8 chunks), batch 32", "this",
             shuffled(32, shuffle_buffer_size=buffer_rows)),
        Case("exact shuffle, budget 1/4 dataset, prefetch 0", "this",
             shuffled(256, memory_budget=budget, prefetch=0)),
        Case("exact shuffle, budget 1/4 dataset, prefetch 2", "this",
             shuffled(256, memory_budget=budget, prefetch=2), repeats=1),
        Case("paired features+labels, sequential", "this",
             lambda: drain(dzb.paired_batch_stream(x, y, 256))),
        Case("paired features+labels, buffered (8 chunks)", "this",
             lambda: drain(dzb.paired_shuffled_batch_stream(
                 x, y, 256, seed=0, shuffle_buffer_size=buffer_rows))),
    ]  # fmt: skip
    print(f"references and daskzarr_batches (local), {repeats} interleaved rounds, best kept")
    results.update(rounds(cases, repeats))

    print("naive dask and peers (a few batches, extrapolated)")
    naive = [
        Case("dask: x[slice].compute() per batch", "naive", lambda: dask_slices(x, 256, few)),
        Case("dask: x[sorted random idx].compute() per batch", "naive",
             lambda: dask_random(x, 256, max(2, few // 10))),
    ]  # fmt: skip
    try:
        import xbatcher  # noqa: F401

        naive.append(Case("xbatcher BatchGenerator, sequential", "peer",
                          lambda: xbatcher_batches(x, 256, few)))  # fmt: skip
    except ImportError as exc:
        skipped["xbatcher"] = f"not installed ({exc}); pip install .[bench]"
        print(f"  skipping xbatcher: {skipped['xbatcher']}")
    try:
        import torch  # noqa: F401

        loader = torch_loader(str(ds.path / "features"), 256, 3 if args.quick else 8)
        naive.append(Case("torch DataLoader, per-sample zarr, shuffled, 2 workers", "peer",
                          loader))  # fmt: skip
    except ImportError as exc:
        skipped["torch"] = f"not installed ({exc}); pip install .[bench]"
        print(f"  skipping torch: {skipped['torch']}")
    for result in rounds(naive, 1).values():
        result.extrapolated = True
        results[result.name] = result

    if not args.no_cluster:
        print("daskzarr_batches on distributed.LocalCluster (2 workers x 1 thread)")
        import distributed

        with (
            distributed.LocalCluster(
                n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster,
            distributed.Client(cluster) as client,
        ):
            on_cluster = [
                Case("LocalCluster: sequential, batch 256", "cluster",
                     lambda: drain(dzb.batch_stream(x, 256, client=client))),
                Case("LocalCluster: buffered shuffle (8 chunks)", "cluster",
                     shuffled(256, shuffle_buffer_size=buffer_rows, client=client)),
                Case("LocalCluster: transfer only, 64 MiB results worker -> client", "cluster",
                     lambda: transfer_only(client, ds.feature_bytes)),
            ]  # fmt: skip
            results.update(rounds(on_cluster, repeats))
    else:
        skipped["LocalCluster"] = "--no-cluster"

    ref = results["L0: zarr chunk-aligned, 1 thread"]
    seq = results["sequential, batch 256"]
    seq32 = results["sequential, batch 32"]
    buf = results["buffered shuffle (8 chunks), batch 256"]
    exact = results["exact shuffle, budget 1/4 dataset, prefetch 0"]
    pseq = results["paired features+labels, sequential"]
    pbuf = results["paired features+labels, buffered (8 chunks)"]
    cluster_seq = results.get("LocalCluster: sequential, batch 256")
    cluster_buf = results.get("LocalCluster: buffered shuffle (8 chunks)")

    print("prefetch hides I/O (consumer busy 1.2x the per-batch load time)")
    # the typical (median) load time of the rounds, not the luckiest one
    per_batch = float(np.median(buf.extra["seconds"])) / math.ceil(ds.rows / 256)
    prefetch_result = prefetch_case(x, buffer_rows, per_batch * 1.2)
    print(
        f"  wait {prefetch_result['wait']:.3f} s of {prefetch_result['epoch']:.2f} s "
        f"({100 * prefetch_result['fraction']:.1f}%), per-batch load {per_batch * 1e6:.0f} us"
    )

    print("memory (fresh process per case)")
    memory = memory_cases(args, ds, buffer_rows, budget)

    print("shuffle quality (from the plan, nothing read)")
    quality = quality_table(x, ds.chunk_rows)
    for row in quality:
        print(
            f"  {row['mode']:28s} displacement {row['displacement']:.3f}  "
            f"entropy {row['entropy']:.2f} bits"
        )

    args.load = (load_before, os.getloadavg())
    targets = evaluate(
        results,
        ref,
        seq,
        seq32,
        buf,
        pbuf,
        exact,
        pseq,
        cluster_seq,
        cluster_buf,
        prefetch_result,
        memory,
        skipped,
    )
    write_outputs(args, ds, out, results, ref, targets, memory, quality, prefetch_result, skipped)


def transfer_only(client: Any, total: int) -> tuple[int, int, float]:
    """Ceiling of the cluster path: fetch arrays made on workers, no Zarr read."""
    piece = 64 * MiB
    futures = [
        client.submit(np.ones, piece // 4, dtype="f4", pure=False)
        for _ in range(math.ceil(total / piece))
    ]
    nbytes = 0
    for future in futures:
        nbytes += future.result().nbytes
        future.release()
    return nbytes, 0, 1.0


def warm_up(x: zarr.Array) -> None:
    """Imports, thread pools and caches, so the first timed case is not penalised."""
    import dask.array as da

    da.from_zarr(x)[:10].compute()
    with dzb.batch_stream(x, 256) as stream:
        next(stream)


def prefetch_case(x: zarr.Array, buffer_rows: int, busy: float) -> dict[str, float]:
    stream = dzb.shuffled_batch_stream(x, 256, seed=1, shuffle_buffer_size=buffer_rows)
    started = time.perf_counter()
    consumer = 0.0
    for _ in stream:
        t = time.perf_counter()
        time.sleep(busy)
        consumer += time.perf_counter() - t
    epoch = time.perf_counter() - started
    wait = stream.stats.wait_seconds
    return {
        "wait": wait,
        "epoch": epoch,
        "fraction": wait / epoch,
        "busy": busy,
        "consumer": consumer,
    }


def memory_cases(
    args: argparse.Namespace, ds: Dataset, buffer_rows: int, budget: int
) -> dict[str, Any]:
    big = make_dataset(Path(args.data), 4 * ds.rows, ds.cols, ds.chunk_rows)
    prefetch = dzb.DEFAULT_PREFETCH
    window_bytes = buffer_rows * ds.row_bytes
    bound = 1.5 * (prefetch + 1) * window_bytes + 300 * MiB
    one = run_memory_case(ds.path, buffer=buffer_rows, prefetch=prefetch)
    four = run_memory_case(big.path, buffer=buffer_rows, prefetch=prefetch)
    exact = run_memory_case(ds.path, budget=budget, prefetch=0)
    exact_mmap = run_memory_case(ds.path, budget=budget, prefetch=0, env=MMAP_ENV)
    for label, case in (("1x", one), ("4x", four), ("exact", exact), ("exact+", exact_mmap)):
        print(
            f"  {label:6s} peak RSS {case['peak'] / MiB:7.0f} MiB "
            f"(baseline {case['baseline'] / MiB:.0f} MiB)"
        )
    return {
        "one": one,
        "four": four,
        "exact": exact,
        "exact_mmap": exact_mmap,
        "bound": bound,
        "window_bytes": window_bytes,
        "budget": budget,
        "prefetch": prefetch,
    }


def quality_table(x: zarr.Array, chunk_rows: int) -> list[dict[str, Any]]:
    rows = []
    n = x.shape[0]
    for chunks in (1, 2, 4, 8, 16, 32):
        if chunks * chunk_rows > n:
            break
        plan = dzb.plan_epoch(x, 256, shuffle=True, seed=0, shuffle_buffer_size=chunks * chunk_rows)
        order = shuffle_order(dzb_plan(x, chunks * chunk_rows))
        rows.append(
            {
                "mode": f"buffered, {chunks} chunks",
                "buffer_chunks": chunks,
                "displacement": displacement(order),
                "entropy": neighbour_entropy(order),
                "amplification": plan.read_amplification,
            }
        )
    order = shuffle_order(dzb_plan(x, None))
    rows.append(
        {
            "mode": "exact",
            "buffer_chunks": None,
            "displacement": displacement(order),
            "entropy": neighbour_entropy(order),
            "amplification": None,
        }
    )
    return rows


def dzb_plan(x: zarr.Array, buffer_rows: int | None) -> dzb.EpochPlan:
    """The plan a shuffled stream follows (the stream is closed unread)."""
    stream = dzb.shuffled_batch_stream(x, 256, seed=0, shuffle_buffer_size=buffer_rows)
    stream.close()
    return stream.plan


def evaluate(
    results: dict[str, Result],
    ref: Result,
    seq: Result,
    seq32: Result,
    buf: Result,
    pbuf: Result,
    exact: Result,
    pseq: Result,
    cluster_seq: Result | None,
    cluster_buf: Result | None,
    prefetch_result: dict[str, float],
    memory: dict[str, Any],
    skipped: dict[str, str],
) -> list[Target]:
    def ratio(a: Result, b: Result) -> float:
        return a.mb_s / b.mb_s

    targets = [
        Target("sequential >= 1.3x L0", f"{ratio(seq, ref):.2f}x", ratio(seq, ref) >= 1.3),
    ]
    raw = next((r for r in results.values() if r.name.startswith("raw chunk")), None)
    if raw is not None:
        targets.append(
            Target(
                "sequential >= 0.5x raw-decode limit",
                f"{ratio(seq, raw):.2f}x",
                ratio(seq, raw) >= 0.5,
            )
        )
    targets += [
        Target(
            "buffered shuffle (8 chunks) >= 1.0x L0",
            f"{ratio(buf, ref):.2f}x",
            ratio(buf, ref) >= 1.0,
        ),
        Target(
            "paired buffered shuffle >= 1.0x L0",
            f"{ratio(pbuf, ref):.2f}x",
            ratio(pbuf, ref) >= 1.0,
        ),
        Target(
            "batch 32 >= 0.8x batch 256 (sequential)",
            f"{ratio(seq32, seq):.2f}x",
            ratio(seq32, seq) >= 0.8,
        ),
        Target(
            "exact, budget 1/4: read amplification <= 4",
            f"{exact.amplification:.2f}",
            exact.amplification <= 4.0 + 1e-9,
        ),
        Target(
            "exact, budget 1/4: >= 0.8x L0/4",
            f"{ratio(exact, ref) * 4:.2f}x L0/4",
            ratio(exact, ref) * 4 >= 0.8,
        ),
    ]
    if cluster_seq is not None and cluster_buf is not None:
        targets.append(
            Target(
                "LocalCluster >= 0.6x local (sequential)",
                f"{ratio(cluster_seq, seq):.2f}x",
                ratio(cluster_seq, seq) >= 0.6,
            )
        )
        targets.append(
            Target(
                "LocalCluster >= 0.6x local (buffered)",
                f"{ratio(cluster_buf, buf):.2f}x",
                ratio(cluster_buf, buf) >= 0.6,
            )
        )
    else:
        targets.append(
            Target("LocalCluster >= 0.6x local", "skipped", None, skipped.get("LocalCluster", ""))
        )
    peers = [
        ("xbatcher BatchGenerator, sequential", seq, 50, "xbatcher"),
        ("torch DataLoader, per-sample zarr, shuffled, 2 workers", buf, 100, "torch"),
        ("dask: x[slice].compute() per batch", seq, 20, ""),
    ]
    for name, ours, factor, key in peers:
        other = results.get(name)
        label = f">= {factor}x {name.split(',')[0]}"
        if other is None:
            targets.append(Target(label, "skipped", None, skipped.get(key, "")))
        else:
            targets.append(
                Target(label, f"{ratio(ours, other):.0f}x", ratio(ours, other) >= factor)
            )
    targets.append(
        Target(
            "prefetch: wait <= 5% of epoch (consumer 1.2x load)",
            f"{100 * prefetch_result['fraction']:.1f}%",
            prefetch_result["fraction"] <= 0.05,
        )
    )
    one, four, bound = memory["one"], memory["four"], memory["bound"]
    targets.append(
        Target(
            "buffered peak RSS <= 1.5 x windows + 300 MB",
            f"{one['peak'] / MiB:.0f} MiB <= {bound / MiB:.0f} MiB",
            one["peak"] <= bound,
        )
    )
    grows = four["peak"] - one["peak"]
    targets.append(
        Target(
            "buffered peak RSS flat at 4x dataset",
            f"{four['peak'] / MiB:.0f} vs {one['peak'] / MiB:.0f} MiB",
            grows <= max(0.1 * one["peak"], 32 * MiB),
        )
    )
    for key, label in (("exact", ""), ("exact_mmap", " (fixed mmap threshold)")):
        ex = memory[key]
        held = ex["peak"] - ex["baseline"]
        targets.append(Target(f"exact: RSS over baseline <= budget{label}",
                              f"{held / MiB:.0f} MiB vs budget {memory['budget'] / MiB:.0f} MiB",
                              held <= memory["budget"]))  # fmt: skip
    return targets


def write_outputs(
    args: argparse.Namespace,
    ds: Dataset,
    out: Path,
    results: dict[str, Result],
    ref: Result,
    targets: list[Target],
    memory: dict[str, Any],
    quality: list[dict[str, Any]],
    prefetch_result: dict[str, float],
    skipped: dict[str, str],
) -> None:
    command = "python benchmarks/run.py" + (" --quick" if args.quick else "")
    if (args.rows, args.cols, args.chunk_rows) != defaults(args.quick):
        command += f" --rows {args.rows} --cols {args.cols} --chunk-rows {args.chunk_rows}"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmark results",
        "",
        f"`{command}` on {now}: {ds.rows:,} x {ds.cols} float32 features "
        f"({ds.feature_bytes / MB:.0f} MB) + int64 labels, {ds.chunk_rows}-row chunks, "
        f"Zarr default codec, local directory store; {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, zarr {zarr.__version__}, "
        f"numpy {np.__version__}, daskzarr_batches {dzb.__version__}.  "
        f"Load average (1 min) {args.load[0][0]:.1f} at the start, {args.load[1][0]:.1f} at "
        "the end (other jobs on the machine compete for its cores).  "
        f"Throughput is the best of {args.repeats} run(s); cases marked * ran a few "
        "batches and are extrapolated.  Batch 256 unless said.",
        "",
        "| case | MB/s | samples/s | vs L0 | read amp. | RSS growth MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results.values():
        star = " *" if r.extrapolated else ""
        lines.append(
            f"| {r.name}{star} | {r.mb_s:,.1f} | {f'{r.samples_s:,.0f}' if r.samples else '-'} | "
            f"{r.mb_s / ref.mb_s:.3g}x | {r.amplification:.2f} | {r.rss_growth / MiB:.0f} |"
        )
    lines += ["", "## Targets (issue 3)", "", "| target | measured | result |", "|---|---|---|"]
    for t in targets:
        status = "PASS" if t.passed else ("MISS" if t.passed is False else "SKIP")
        why = f" ({t.why})" if t.why else ""
        lines.append(f"| {t.what} | {t.measured} | {status}{why} |")
    lines += [
        "",
        "## Prefetch",
        "",
        f"Buffered shuffle, batch 256, consumer sleeping {prefetch_result['busy'] * 1e6:.0f} us "
        f"a batch (1.2x the per-batch load time, median of the rounds): waited "
        f"{prefetch_result['wait']:.3f} s of a {prefetch_result['epoch']:.2f} s epoch "
        f"({100 * prefetch_result['fraction']:.1f}%).",
        "",
        "## Memory (fresh process per case, peak RSS)",
        "",
        "| case | peak RSS MiB | baseline MiB | read amp. |",
        "|---|---:|---:|---:|",
        f"| buffered (8 chunks, prefetch {memory['prefetch']}), dataset 1x | "
        f"{memory['one']['peak'] / MiB:.0f} | {memory['one']['baseline'] / MiB:.0f} | "
        f"{memory['one']['amplification']:.2f} |",
        f"| buffered (8 chunks, prefetch {memory['prefetch']}), dataset 4x | "
        f"{memory['four']['peak'] / MiB:.0f} | {memory['four']['baseline'] / MiB:.0f} | "
        f"{memory['four']['amplification']:.2f} |",
        f"| exact, budget {memory['budget'] / MiB:.0f} MiB, prefetch 0 | "
        f"{memory['exact']['peak'] / MiB:.0f} | {memory['exact']['baseline'] / MiB:.0f} | "
        f"{memory['exact']['amplification']:.2f} |",
        f"| exact, same, with `MALLOC_MMAP_THRESHOLD_=524288` | "
        f"{memory['exact_mmap']['peak'] / MiB:.0f} | "
        f"{memory['exact_mmap']['baseline'] / MiB:.0f} | "
        f"{memory['exact_mmap']['amplification']:.2f} |",
        "",
        f"Bound for the buffered case: 1.5 x (1 + prefetch) x window "
        f"({memory['window_bytes'] / MiB:.0f} MiB) + 300 MiB = {memory['bound'] / MiB:.0f} MiB.",
        "",
        "## Shuffle quality (from the plan; nothing read)",
        "",
        "Displacement: mean |new - old position| / n, over 1/3 (a uniform permutation "
        "gives ~1.0, no shuffle 0).  Entropy: bits of the histogram (256 bins) of "
        "differences between neighbouring sample ids (higher is better mixed).",
        "",
        "| mode | displacement | neighbour entropy (bits) | read amp. |",
        "|---|---:|---:|---:|",
    ]
    for row in quality:
        amp = "" if row["amplification"] is None else f"{row['amplification']:.2f}"
        lines.append(
            f"| {row['mode']} | {row['displacement']:.3f} | {row['entropy']:.2f} | {amp} |"
        )
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()) + "."]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    payload = {
        "command": command,
        "date": now,
        "results": [
            asdict(r) | {"mb_s": r.mb_s, "vs_l0": r.mb_s / ref.mb_s} for r in results.values()
        ],
        "targets": [asdict(t) for t in targets],
        "memory": memory,
        "quality": quality,
        "prefetch": prefetch_result,
        "skipped": skipped,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    chart(out / "throughput.png", results, ref)
    print(f"\nwrote {out / 'results.md'}, {out / 'throughput.png'}")
    print("\nratios vs L0:")
    for r in results.values():
        print(f"  {r.mb_s / ref.mb_s:10.4f}x  {r.name}")
    print("\ntargets:")
    for t in targets:
        status = "PASS" if t.passed else ("MISS" if t.passed is False else "SKIP")
        print(f"  {status}  {t.what}: {t.measured}")


def chart(path: Path, results: dict[str, Result], ref: Result) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {
        "reference": "#888888",
        "naive": "#d62728",
        "peer": "#ff7f0e",
        "this": "#1f77b4",
        "cluster": "#17becf",
    }
    items = list(results.values())
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(items) + 1.2))
    ys = np.arange(len(items))[::-1]
    ax.barh(ys, [r.mb_s for r in items], color=[colours[r.group] for r in items])
    ax.set_yticks(ys, [r.name + (" *" if r.extrapolated else "") for r in items], fontsize=8)
    ax.set_xscale("log")
    ax.axvline(ref.mb_s, color="black", lw=0.8, ls="--")
    for y, r in zip(ys, items, strict=True):
        label = f"{r.mb_s:,.0f}" if r.mb_s >= 10 else f"{r.mb_s:.2g}"
        ax.text(r.mb_s * 1.05, y, f"{label} ({r.mb_s / ref.mb_s:.2g}x)", va="center", fontsize=7)
    ax.set_xlabel("MB/s (log scale), (ratio vs L0); dashed: L0")
    ax.set_xlim(right=max(r.mb_s for r in items) * 6)
    ax.set_title("daskzarr_batches vs zarr, dask and peers (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def defaults(quick: bool) -> tuple[int, int, int]:
    return (250_000, 64, 8192) if quick else (1_000_000, 64, 8192)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int)
    parser.add_argument("--cols", type=int)
    parser.add_argument("--chunk-rows", type=int)
    parser.add_argument("--quick", action="store_true", help="small dataset, 1 repeat")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--data", default=str(ROOT / "benchmarks" / "data"))
    parser.add_argument("--no-cluster", action="store_true")
    parser.add_argument("--memory-case", help=argparse.SUPPRESS)
    parser.add_argument("--buffer", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--prefetch", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_case:
        memory_case(args)
        return
    rows, cols, chunk_rows = defaults(args.quick)
    args.rows = args.rows or rows
    args.cols = args.cols or cols
    args.chunk_rows = args.chunk_rows or chunk_rows
    args.repeats = args.repeats or (2 if args.quick else 5)
    run_suite(args)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
