"""The measured cases: references, this library's streams, naive dask, peers, LocalCluster."""

from __future__ import annotations

import concurrent.futures
import importlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import daskzarr_batches as dzb

from ..internals import exact_window_rows
from .dataset import Dataset
from .measure import FLOOR_PREFIX, L0, Case, Measured, MiB, drain

# Names the targets refer to (the report shows every case by its name).
RAW_DECODE = "raw chunk bytes + decode"
#: issue 20's yardstick of CPU per GB: decoding alone, the chunk files read beforehand
FLOOR = f"{FLOOR_PREFIX}: chunk bytes read beforehand, decode only, 1 thread"
SEQUENTIAL = "sequential, batch 256"
SEQUENTIAL_32 = "sequential, batch 32"
BUFFERED = "buffered shuffle (8 chunks), batch 256"
EXACT = "exact shuffle, windows of 1/4 dataset, prefetch 0"
PAIRED_BUFFERED = "paired features+labels, buffered (8 chunks)"
DASK_SLICES = "dask: x[slice].compute() per batch"
XBATCHER = "xbatcher BatchGenerator, sequential"
TORCH = "torch DataLoader, per-sample zarr, shuffled, 2 workers"
LOADER_SEQUENTIAL = "Loader, sequential"
LOADER_BUFFERED = "Loader, buffered shuffle (8 chunks)"
TORCH_LOADER_0 = "Loader via torch DataLoader, buffered, 0 workers"
TORCH_LOADER_2 = "Loader via torch DataLoader, buffered, 2 workers"
CLUSTER_SEQUENTIAL = "LocalCluster: sequential, batch 256"
CLUSTER_BUFFERED = "LocalCluster: buffered shuffle (8 chunks)"
CLUSTER_TRANSFER = "LocalCluster: transfer only, 64 MiB results worker -> client"


@dataclass(frozen=True)
class Workload:
    """The dataset opened for the cases, and the sizes the cases share."""

    ds: Dataset
    x: zarr.Array
    y: zarr.Array
    threads: int
    #: rows of a buffered shuffle's buffer: 8 chunks
    buffer_rows: int
    #: memory budget of the exact-shuffle memory cases: a quarter of the features
    budget: int
    #: memory budget of the exact-shuffle speed cases: the smallest whose windows hold a
    #: quarter of the samples (the budget also holds their index arrays and decoding)
    quarter_budget: int

    @classmethod
    def open(cls, ds: Dataset) -> Workload:
        return cls(
            ds=ds,
            x=ds.features,
            y=ds.labels,
            threads=os.cpu_count() or 1,
            buffer_rows=8 * ds.chunk_rows,
            budget=ds.feature_bytes // 4,
            quarter_budget=quarter_windows_budget(ds.rows, ds.feature_bytes // ds.rows),
        )

    def shuffled(self, batch: int, **kwargs: Any) -> Callable[[], Measured]:
        return lambda: drain(dzb.shuffled_batch_stream(self.x, batch, seed=0, **kwargs))


def quarter_windows_budget(rows: int, row_bytes: int) -> int:
    """The smallest ``memory_budget`` whose exact-shuffle windows hold ``ceil(rows / 4)``.

    Issue 3's exact-shuffle targets (read amplification 4, >= 0.8x L0/4) are about
    an epoch read in four windows; since issue 10 the budget also holds each
    window's index arrays and its decoding, so a budget of exactly a quarter of the
    samples' bytes makes five windows.  The library's own arithmetic
    (``internals.exact_window_rows``) gives the budget of four.
    """
    need = -(-rows // 4)
    budget = need * row_bytes
    while exact_window_rows(budget, row_bytes) < need:
        budget += max(1, budget // 1000)
    return budget


# --------------------------------------------------------------------------
# Reference readers


def l0(x: zarr.Array) -> Measured:
    rows = x.chunks[0]
    for lo in range(0, x.shape[0], rows):
        x[lo : lo + rows]
    return x.nbytes, x.shape[0], 1.0


def zarr_threads(x: zarr.Array, threads: int) -> Measured:
    rows = x.chunks[0]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(lambda lo: x[lo : lo + rows], range(0, x.shape[0], rows)):
            pass
    return x.nbytes, x.shape[0], 1.0


def raw_decoder(x: zarr.Array) -> Callable[[bytes], np.ndarray] | None:
    """A decoder of stored chunk bytes for arrays stored as bytes + one compressor."""
    import numcodecs

    codecs: tuple[Any, ...] = tuple(getattr(x.metadata, "codecs", ()))
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
    decode: Callable[[bytes], np.ndarray] = compressor(codecs[1]).decode
    return decode


def raw_decode(x: zarr.Array, root: Path, threads: int) -> Measured:
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


class RawFloor:
    """Issue 20's raw-decode floor: the array's stored chunks decoded on one thread.

    ``setup`` reads every chunk file of ``root`` (outside the clock: a case's
    ``setup``); ``run`` decodes them with the array's own codec (numcodecs,
    :func:`raw_decoder`) one after another and drops the bytes.  Its CPU seconds
    per GB are the least any reader of these files spends once they are in memory.
    """

    def __init__(self, x: zarr.Array, root: Path) -> None:
        decode = raw_decoder(x)
        assert decode is not None
        self.decode = decode
        self.x = x
        self.files = sorted(path for path in (root / "c").rglob("*") if path.is_file())
        self.stored: list[bytes] = []

    def setup(self) -> None:
        self.stored = [path.read_bytes() for path in self.files]

    def run(self) -> Measured:
        stored, self.stored = self.stored, []
        if not stored:  # run without setup: read here (timed)
            stored = [path.read_bytes() for path in self.files]
        decoded = sum(len(self.decode(data)) for data in stored)
        assert decoded >= self.x.nbytes  # edge chunks are stored padded to a whole chunk
        return self.x.nbytes, self.x.shape[0], 1.0

    def case(self, name: str = FLOOR) -> Case:
        return Case(name, "reference", self.run, setup=self.setup)


# --------------------------------------------------------------------------
# Naive dask and peers (a few batches each, extrapolated)


def batches_measured(x: zarr.Array, batch: int, count: int) -> Measured:
    return count * batch * x.dtype.itemsize * x.shape[1], count * batch, 1.0


def dask_slices(x: zarr.Array, batch: int, count: int) -> Measured:
    import dask.array as da

    array = da.from_zarr(x)
    for k in range(count):
        array[k * batch : (k + 1) * batch].compute()
    return batches_measured(x, batch, count)


def dask_random(x: zarr.Array, batch: int, count: int) -> Measured:
    import dask.array as da

    array = da.from_zarr(x)
    rng = np.random.default_rng(0)
    for _ in range(count):
        index = np.sort(rng.choice(x.shape[0], batch, replace=False))
        array[index].compute()
    return batches_measured(x, batch, count)


def xbatcher_batches(x: zarr.Array, batch: int, count: int) -> Measured:
    import dask.array as da
    import xarray as xr
    import xbatcher

    data = xr.DataArray(da.from_zarr(x), dims=("sample", "feature"))
    generator = xbatcher.BatchGenerator(data, input_dims={"sample": batch})
    for k, item in enumerate(generator):
        if k == count:
            break
        np.asarray(item.values)
    return batches_measured(x, batch, count)


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


def torch_loader(path: str, batch: int, count: int) -> Callable[[], Measured]:
    import torch.utils.data

    dataset: Any = SampleDataset(path)  # a map-style dataset, as torch takes it

    def run() -> Measured:
        # Timed from the first request, worker start-up included: the workers
        # prefetch 2 batches each, so skipping a warm-up batch would time
        # batches that were loaded before the clock started.
        loader: Any = torch.utils.data.DataLoader(
            dataset, batch_size=batch, shuffle=True, num_workers=2
        )
        nbytes = samples = 0
        for k, item in enumerate(loader):
            if k == count:
                break
            nbytes += item.numpy().nbytes
            samples += len(item)
        return nbytes, samples, 1.0

    return run


# --------------------------------------------------------------------------
# The training Loader, alone and through torch


def loader(w: Workload, buffered: bool) -> dzb.Loader:
    """A Loader over the features, batch 256, as the streams of the same name."""
    if not buffered:
        return dzb.Loader(w.x, 256)
    return dzb.Loader(w.x, 256, shuffle=True, shuffle_buffer_size=w.buffer_rows, seed=0)


def torch_batches(w: Workload, workers: int) -> Measured:
    """One buffered epoch of ``ZarrIterableDataset`` through ``DataLoader(batch_size=None)``.

    Worker start-up is timed (the workers are not persistent).  With workers the
    reads happen in their processes, so the read amplification is not known here
    (NaN, shown as -).
    """
    import torch.utils.data

    from daskzarr_batches.torch import ZarrIterableDataset

    dataset = ZarrIterableDataset(loader(w, buffered=True))
    batches: Any = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    nbytes = samples = 0
    for batch in batches:
        nbytes += batch.numel() * batch.element_size()
        samples += len(batch)
    amplification = dataset.loader.stats.read_amplification if workers == 0 else math.nan
    return nbytes, samples, amplification


# --------------------------------------------------------------------------
# Cluster


def transfer_only(client: Any, total: int, direct: bool | None = None) -> Measured:
    """Ceiling of the cluster path: fetch arrays made on workers, no Zarr read.

    Fetched as the streams fetch their windows (``direct=None``: straight from
    the workers where ``execute.runners.direct_fetch`` says so, as on a
    LocalCluster); ``direct=False``: through the scheduler, as
    ``future.result()`` does (the ceiling before issue 40).
    """
    from ..internals import direct_fetch

    direct = direct_fetch(client) if direct is None else direct
    piece = 64 * MiB
    futures = [
        client.submit(np.ones, piece // 4, dtype="f4", pure=False)
        for _ in range(math.ceil(total / piece))
    ]
    nbytes = 0
    for future in futures:
        nbytes += client.gather(future, direct=direct).nbytes
        future.release()
    return nbytes, 0, 1.0


# --------------------------------------------------------------------------
# The case lists, in report order


def local_cases(w: Workload, skipped: dict[str, str]) -> list[Case]:
    """References and this library on the local scheduler (interleaved rounds)."""
    x, y, threads = w.x, w.y, w.threads
    cases = [
        Case(L0, "reference", lambda: l0(x)),
        Case(f"zarr chunk-aligned, {2 * threads} threads", "reference",
             lambda: zarr_threads(x, 2 * threads)),
    ]  # fmt: skip
    if raw_decoder(x) is not None:
        cases.append(Case(f"{RAW_DECODE}, {threads} threads (limit)", "reference",
                          lambda: raw_decode(x, w.ds.path / "features", threads)))  # fmt: skip
        cases.append(RawFloor(x, w.ds.path / "features").case())
    else:
        skipped["raw decode"] = "codec pipeline is not bytes + one compressor"
    cases += [
        Case(SEQUENTIAL, "this", lambda: drain(dzb.batch_stream(x, 256))),
        Case(SEQUENTIAL_32, "this", lambda: drain(dzb.batch_stream(x, 32))),
        Case(BUFFERED, "this", w.shuffled(256, shuffle_buffer_size=w.buffer_rows)),
        Case("buffered shuffle (8 chunks), batch 32", "this",
             w.shuffled(32, shuffle_buffer_size=w.buffer_rows)),
        Case(EXACT, "this", w.shuffled(256, memory_budget=w.quarter_budget, prefetch=0)),
        Case("exact shuffle, budget of 1/4 windows, prefetch 2", "this",
             w.shuffled(256, memory_budget=w.quarter_budget, prefetch=2), repeats=1),
        Case("paired features+labels, sequential", "this",
             lambda: drain(dzb.paired_batch_stream(x, y, 256))),
        Case(PAIRED_BUFFERED, "this",
             lambda: drain(dzb.paired_shuffled_batch_stream(
                 x, y, 256, seed=0, shuffle_buffer_size=w.buffer_rows))),
        # the training Loader over the same streams (compared with SEQUENTIAL, BUFFERED)
        Case(LOADER_SEQUENTIAL, "this", lambda: drain(loader(w, buffered=False))),
        Case(LOADER_BUFFERED, "this", lambda: drain(loader(w, buffered=True))),
    ]  # fmt: skip
    if installed("torch", skipped):
        cases += [
            Case(TORCH_LOADER_0, "this", lambda: torch_batches(w, 0)),
            Case(TORCH_LOADER_2, "this", lambda: torch_batches(w, 2), cpu_of=CHILDREN_CPU),
        ]
    return cases


def naive_cases(w: Workload, quick: bool, skipped: dict[str, str]) -> list[Case]:
    """Naive dask and the peers that are installed (a few batches each)."""
    x = w.x
    few = 10 if quick else 40
    cases = [
        Case(DASK_SLICES, "naive", lambda: dask_slices(x, 256, few)),
        Case("dask: x[sorted random idx].compute() per batch", "naive",
             lambda: dask_random(x, 256, max(2, few // 10))),
    ]  # fmt: skip
    if installed("xbatcher", skipped):
        cases.append(Case(XBATCHER, "peer", lambda: xbatcher_batches(x, 256, few)))
    if installed("torch", skipped):
        loader = torch_loader(str(w.ds.path / "features"), 256, 3 if quick else 8)
        cases.append(Case(TORCH, "peer", loader, cpu_of=CHILDREN_CPU))
    return cases


def installed(peer: str, skipped: dict[str, str]) -> bool:
    """Whether ``peer`` imports; if not, say why in ``skipped`` and print it."""
    try:
        importlib.import_module(peer)
    except ImportError as exc:
        skipped[peer] = f"not installed ({exc}); pip install .[bench]"
        print(f"  skipping {peer}: {skipped[peer]}")
        return False
    return True


def workers_cpu(client: Any) -> Callable[[], float]:
    """The summed CPU seconds of ``client``'s worker processes (``client.run``, one round trip)."""
    return lambda: float(sum(client.run(time.process_time).values()))


#: what the CPU of a cluster case counts
CLUSTER_CPU = "this process + workers"
#: what the CPU of a case with torch DataLoader workers counts
CHILDREN_CPU = "this process + DataLoader workers reaped within the epoch"


def cluster_cases(w: Workload, client: Any) -> list[Case]:
    """This library on a ``distributed`` client, and the transfer ceiling.

    Their CPU is the client process's and the workers' (:func:`workers_cpu`).
    """
    x = w.x
    cpu = workers_cpu(client)
    return [
        Case(CLUSTER_SEQUENTIAL, "cluster",
             lambda: drain(dzb.batch_stream(x, 256, client=client)),
             other_cpu=cpu, cpu_of=CLUSTER_CPU),
        Case(CLUSTER_BUFFERED, "cluster",
             w.shuffled(256, shuffle_buffer_size=w.buffer_rows, client=client),
             other_cpu=cpu, cpu_of=CLUSTER_CPU),
        Case(CLUSTER_TRANSFER, "cluster",
             lambda: transfer_only(client, w.ds.feature_bytes),
             other_cpu=cpu, cpu_of=CLUSTER_CPU),
    ]  # fmt: skip


def warm_up(x: zarr.Array) -> None:
    """Imports, thread pools and caches, so the first timed case is not penalised."""
    import dask.array as da

    da.from_zarr(x)[:10].compute()
    with dzb.batch_stream(x, 256) as stream:
        next(stream)


# --------------------------------------------------------------------------
# Prefetch


def prefetch_case(x: zarr.Array, buffer_rows: int, busy: float) -> dict[str, float]:
    """A buffered epoch whose consumer sleeps ``busy`` s a batch; how long it waited."""
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


# --------------------------------------------------------------------------
# Fast start (issue 10): a 100 MB array, where start-up weighs on the epoch

#: rows of the fast-start array (400,000 x 64 float32 = 100 MB at the default width)
START_ROWS = 400_000
START_L0 = "400k rows: L0, zarr chunk-aligned, 1 thread"
START_SEQUENTIAL = "400k rows: sequential, batch 256"
START_PAIRED_BUFFERED = "400k rows: paired features+labels, buffered (8 chunks)"


def start_cases(ds: Dataset) -> list[Case]:
    """Epochs of the fast-start array, each against L0 on it (interleaved rounds)."""
    x, y = ds.features, ds.labels
    buffer = 8 * ds.chunk_rows
    return [
        Case(START_L0, "reference", lambda: l0(x)),
        Case(START_SEQUENTIAL, "this", lambda: drain(dzb.batch_stream(x, 256))),
        Case(START_PAIRED_BUFFERED, "this",
             lambda: drain(dzb.paired_shuffled_batch_stream(
                 x, y, 256, seed=0, shuffle_buffer_size=buffer))),
    ]  # fmt: skip


def first_batch_seconds(make: Callable[[], Any]) -> float:
    """Seconds from the stream's constructor call to its first batch."""
    started = time.perf_counter()
    with make() as stream:
        next(stream)
        return time.perf_counter() - started


def first_batch_case(ds: Dataset, rounds: int) -> dict[str, float]:
    """Median time to the first batch, and of one chunk read, in interleaved rounds.

    Each round reads one chunk (``x[a:b]`` of a chunk-aligned block, as L0
    does) and 8 chunks (``x[a:b]`` over as many chunks as the buffer holds:
    ``"buffer"``), then makes a sequential and a buffered (8 chunks) stream of
    batch 256 and takes its first batch; the streams' seeds vary by round, so
    the buffered stream starts from another buffer each time.  The buffered
    stream reads its whole first buffer before its first batch (issue 18).
    """
    x = ds.features
    rows = ds.chunk_rows
    n_chunks = math.ceil(ds.rows / rows)
    times: dict[str, list[float]] = {"chunk": [], "buffer": [], "sequential": [], "buffered": []}
    for k in range(rounds):
        lo = (k * 7 % n_chunks) * rows
        started = time.perf_counter()
        x[lo : lo + rows]
        times["chunk"].append(time.perf_counter() - started)
        lo = (k * 7 % max(n_chunks - 8, 1)) * rows
        started = time.perf_counter()
        x[lo : lo + 8 * rows]
        times["buffer"].append(time.perf_counter() - started)
        times["sequential"].append(first_batch_seconds(lambda: dzb.batch_stream(x, 256)))
        times["buffered"].append(
            first_batch_seconds(
                lambda k=k: dzb.shuffled_batch_stream(x, 256, seed=k, shuffle_buffer_size=8 * rows)
            )
        )
    return {name: float(np.median(values)) for name, values in times.items()}
