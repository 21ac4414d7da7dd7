"""``daskzarr-batches bench``: time epochs of a batch stream on your data (or made-up data).

A command-line adapter like ``tools.cli``: it uses only the public API.  Each epoch
is a new stream (``epoch=e`` for the shuffled ones), consumed with no work per
batch, so the numbers are what the loader alone delivers: samples and MB (10^6
bytes of samples handed out) per second, the read amplification
(``stats.read_amplification``) and the share of the epoch spent waiting in
``next()`` (``stats.wait_seconds / seconds``; close to 100 % when nothing
else runs, since the consumer does nothing), and the time to the first batch
(``stats.time_to_first_batch``; the total row shows the mean over epochs).
Below the table, ``stats.bottleneck()`` of the last epoch: the stage that limited it,
the numbers behind it and the setting to change.  The timed epoch starts before the
stream is made, so planning is included.

CPU per GB (issue 20): the CPU seconds of this process (``time.process_time``: every
thread, native ones included) over the same region as the epoch's clock, plus, on a
``distributed`` client, the CPU its workers spent meanwhile (``client.run``), per GB
(10^9 bytes) of samples handed out.  With several epochs the summary adds the
spread of their wall times (min / median / max, and slowest over fastest).

``retries``, ``chunks_missing`` and ``skipped`` are read from ``stream.stats``
with ``getattr`` (0, 0 and ``[]`` when a ``StreamStats`` has no such field), so
the command reports them as soon as the streams count them.

Without a store, a temporary dataset is generated (``ROWS`` x ``FEATURES``
float32 features and int64 labels in ``CHUNK_ROWS``-row chunks, in a temporary
directory store that is removed afterwards) and streamed as pairs.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import zarr
from tqdm import tqdm

from .. import (
    ArgumentValueError,
    ArrayNotFoundError,
    BatchStream,
    ChunkCache,
    Collection,
    DaskZarrBatchesError,
    batch_stream,
    open_array,
    open_collection,
    paired_batch_stream,
    paired_shuffled_batch_stream,
    shuffled_batch_stream,
)
from ..store.backends import Backend
from ..streams.spec import shuffle_mode
from ..streams.timing import time_epoch
from .bench_results import EpochResult, _header, format_summary

__all__ = [
    "CHUNK_ROWS",
    "FEATURES",
    "ROWS",
    "BenchSettings",
    "EpochResult",
    "format_summary",
    "generate_dataset",
    "run_bench",
]

#: Samples of the generated dataset.
ROWS = 200_000
#: float32 features per sample of the generated dataset.
FEATURES = 32
#: Rows per chunk of the generated dataset.
CHUNK_ROWS = 4096
#: Seconds between updates of the bar's MB/s and wait share.
POSTFIX_INTERVAL = 0.2


@dataclass(frozen=True)
class BenchSettings:
    """What to stream and how (the command's options).

    Attributes
    ----------
    batch_size : int
    shuffle_buffer_size : int, str or None
        Buffered shuffle with this buffer (``--shuffle-buffer``): samples, a
        size in bytes such as ``"256MiB"``, or ``"auto"`` (the smallest
        buffer meeting ``shuffle_quality``).
    shuffle_quality : float or None
        The target of ``"auto"`` (``--shuffle-quality``); ``None``: ``DEFAULT_SHUFFLE_QUALITY``.
    exact : bool
        Exact shuffle (``--exact``).
    memory_budget : int or None
        The exact shuffle's ``memory_budget``; ``None``: the library default.
    seed : int
        Seed of a shuffle (ignored for sequential streams).
    epochs : int
    client : distributed.Client or None
    timeout : float or None
        Seconds per window.
    cache : ChunkCache or None
        Every epoch's stream reads through this cache (``--cache-dir``,
        ``--cache-memory``): the first epoch fills it, later ones read it.
    """

    batch_size: int
    shuffle_buffer_size: int | str | None = None
    shuffle_quality: float | None = None
    exact: bool = False
    memory_budget: int | None = None
    seed: int = 0
    epochs: int = 1
    client: Any = None
    timeout: float | None = None
    missing: str = "fill"
    on_error: str = "raise"
    retries: int = 3
    cache: ChunkCache | None = None

    @property
    def shuffle(self) -> str:
        """``"none"``, ``"buffer"`` or ``"exact"`` (a buffer size implies a shuffle)."""
        shuffled = self.exact or self.shuffle_buffer_size is not None
        return shuffle_mode(shuffled, self.shuffle_buffer_size, self.shuffle_quality)

    def function_name(self, paired: bool) -> str:
        """Name of the stream constructor these settings call."""
        shuffled = "shuffled_" if self.shuffle != "none" else ""
        return f"{'paired_' if paired else ''}{shuffled}batch_stream"

    def make_stream(self, features: Any, labels: Any, epoch: int) -> BatchStream:
        """A new stream over ``features`` (and ``labels``, if not None) for ``epoch``."""
        common: dict[str, Any] = {
            "client": self.client,
            "timeout": self.timeout,
            "missing": self.missing,
            "on_error": self.on_error,
            "retries": self.retries,
            "cache": self.cache,
        }
        if self.shuffle == "none":
            if labels is None:
                return batch_stream(features, self.batch_size, **common)
            return paired_batch_stream(features, labels, self.batch_size, **common)
        common.update(seed=self.seed, epoch=epoch, shuffle_buffer_size=self.shuffle_buffer_size)
        if self.shuffle_quality is not None:
            common["shuffle_quality"] = self.shuffle_quality
        if self.memory_budget is not None:
            common["memory_budget"] = self.memory_budget
        if labels is None:
            return shuffled_batch_stream(features, self.batch_size, **common)
        return paired_shuffled_batch_stream(features, labels, self.batch_size, **common)

    def describe(self, paired: bool) -> str:
        """The call, e.g. ``shuffled_batch_stream(batch_size=256, seed=0)``."""
        arguments = [f"batch_size={self.batch_size}"]
        if self.shuffle == "buffer":
            size = self.shuffle_buffer_size
            arguments.append(f"shuffle_buffer_size={size!r}")
            if self.shuffle_quality is not None:
                arguments.append(f"shuffle_quality={self.shuffle_quality}")
        if self.shuffle == "exact" and self.memory_budget is not None:
            arguments.append(f"memory_budget={self.memory_budget}")
        if self.shuffle != "none":
            arguments.append(f"seed={self.seed}")
        return f"{self.function_name(paired)}({', '.join(arguments)})"


def run_bench(
    out: TextIO,
    settings: BenchSettings,
    *,
    store: str | Sequence[str] | None = None,
    array: str | None = None,
    labels: str | None = None,
    storage_options: dict[str, Any] | None = None,
    backend: Backend = "auto",
    rows: int = ROWS,
    features: int = FEATURES,
    chunk_rows: int = CHUNK_ROWS,
    where: str = "local threaded scheduler",
    as_json: bool = False,
    progress: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Run ``settings.epochs`` epochs and print the summary (or JSON) to ``out``.

    Parameters
    ----------
    out : text stream
        Where the summary goes.
    settings : BenchSettings
        The stream's settings.
    store : str or sequence of str, optional
        Directory, ``.zip`` or URL of the data (several: one collection of
        the same arrays of each, :func:`open_collection`); ``None`` generates a
        temporary dataset of ``rows`` x ``features`` float32 features and int64
        labels in ``chunk_rows``-row chunks, streamed as pairs.
    array, labels : str, optional
        Paths of the features (optional if ``store`` is an array) and labels
        in ``store``.
    storage_options : dict, optional
        Options of a URL store (as :func:`open_array` takes them).
    backend : {"auto", "obstore", "fsspec"}
        What reads a URL store (:func:`open_array`'s ``backend``).
    rows, features, chunk_rows : int
        Size of the generated dataset.
    where : str
        How the summary names the scheduler.
    as_json : bool
        Print the summary as JSON.
    progress : callable, optional
        ``tqdm``-like factory for the live bar; ``None`` shows none.

    Returns
    -------
    dict
        The summary (what ``--json`` prints).

    Raises
    ------
    DaskZarrBatchesError
        Bad settings, no such array, or a failed read.
    """
    x: Any
    y: Any
    if store is None:
        with tempfile.TemporaryDirectory(prefix="daskzarr-batches-bench-") as tmp:
            path = Path(tmp) / "bench.zarr"
            generate_dataset(path, rows=rows, features=features, chunk_rows=chunk_rows)
            x = open_array(path, "features")
            y = open_array(path, "labels")
            data: dict[str, Any] = {
                "store": None,
                "generated": (
                    f"{rows:,} x {features} float32 features + int64 labels in "
                    f"{chunk_rows}-row chunks (a temporary directory store, removed afterwards)"
                ),
                "features": _describe("features", x),
                "labels": _describe("labels", y),
            }
            epochs = _run_epochs(x, y, settings, progress, out, data, where, as_json)
    else:
        x = _open(store, array, storage_options, backend, "--array")
        y = None if labels is None else _open(store, labels, storage_options, backend, "--labels")
        data = {
            "store": store if isinstance(store, str) else list(store),
            "generated": None,
            "features": _describe(array or "", x),
            "labels": None if y is None else _describe(labels or "", y),
        }
        epochs = _run_epochs(x, y, settings, progress, out, data, where, as_json)
    summary = _summary(data, settings, where, epochs, paired=y is not None)
    if as_json:
        print(json.dumps(summary, indent=2), file=out)
    else:  # the header went out before the epochs ran
        print(format_summary(summary, epochs, header=False), file=out)
    return summary


def _summary(
    data: dict[str, Any],
    settings: BenchSettings,
    where: str,
    epochs: Sequence[EpochResult],
    *,
    paired: bool,
    batches: int | None = None,
) -> dict[str, Any]:
    """What ``--json`` prints (``batches``: per epoch, before the epochs ran)."""
    return {
        "data": data,
        "stream": {
            "function": settings.function_name(paired),
            "call": settings.describe(paired),
            "batch_size": settings.batch_size,
            "shuffle": settings.shuffle,
            "shuffle_buffer_size": settings.shuffle_buffer_size,
            "memory_budget": settings.memory_budget,
            "seed": None if settings.shuffle == "none" else settings.seed,
            "batches_per_epoch": batches
            if batches is not None
            else (epochs[0].batches if epochs else 0),
            "cache": None if settings.cache is None else _describe_cache(settings.cache),
        },
        "computing_on": where,
        "cpu_of": _cpu_of(settings.client),
        "epochs": [epoch.to_json() for epoch in epochs],
        "total": EpochResult.total(epochs).to_json(),
        "spread": _spread(epochs),
    }


def _cpu_of(client: Any) -> str:
    """What the epochs' CPU seconds count."""
    return "this process" if client is None else "this process and the client's workers"


def _cpu_now(client: Any) -> float:
    """CPU seconds so far: this process's (all threads), plus ``client``'s workers'.

    Workers in this process (a ``LocalCluster(processes=False)``) are counted once,
    as this process; each other worker process once.
    """
    cpu = time.process_time()
    if client is not None:
        here = os.getpid()
        by_process = dict(client.run(_process_cpu).values())
        cpu += sum(seconds for pid, seconds in by_process.items() if pid != here)
    return cpu


def _process_cpu() -> tuple[int, float]:
    """``(pid, CPU seconds so far)`` of the process it runs in (on a worker: ``client.run``)."""
    return os.getpid(), time.process_time()


def _spread(epochs: Sequence[EpochResult]) -> dict[str, float] | None:
    """min / median / max wall seconds of the epochs, and slowest over fastest (2 or more)."""
    seconds = [e.seconds for e in epochs]
    if len(seconds) < 2:
        return None
    low, high = min(seconds), max(seconds)
    return {
        "min": low,
        "median": statistics.median(seconds),
        "max": high,
        "slowest_over_fastest": high / low if low > 0 else math.inf,
    }


def _describe_cache(cache: ChunkCache) -> dict[str, Any]:
    return {
        "memory": cache.memory,
        "directory": None if cache.directory is None else str(cache.directory),
        "disk": cache.disk,
    }


def generate_dataset(path: Path | str, *, rows: int, features: int, chunk_rows: int) -> None:
    """Write ``features`` (rows x features float32, normal) and ``labels`` (int64, 0..9).

    Both in ``chunk_rows``-row chunks, in a Zarr v3 group at ``path``, from a
    fixed seed.
    """
    rng = np.random.default_rng(0)
    root = zarr.open_group(str(path), mode="w")
    x = root.create_array(
        "features", shape=(rows, features), chunks=(chunk_rows, features), dtype="float32"
    )
    y = root.create_array("labels", shape=(rows,), chunks=(chunk_rows,), dtype="int64")
    step = chunk_rows * max(1, (8 * 2**20) // max(1, chunk_rows * features * 4))
    for start in range(0, rows, step):  # about 8 MiB at a time
        stop = min(rows, start + step)
        x[start:stop] = rng.standard_normal((stop - start, features), dtype=np.float32)
        y[start:stop] = rng.integers(0, 10, stop - start, dtype=np.int64)


def _open(
    store: str | Sequence[str],
    path: str | None,
    storage_options: dict[str, Any] | None,
    backend: Backend,
    flag: str,
) -> Any:
    try:
        if not isinstance(store, str):
            return open_collection(list(store), path, storage_options=storage_options or None)
        return open_array(store, path, storage_options=storage_options or None, backend=backend)
    except ArrayNotFoundError as exc:  # open_array speaks of path=, the command of --array
        raise ArrayNotFoundError(str(exc).replace("pass path=", f"pass {flag}")) from exc
    except DaskZarrBatchesError:
        raise
    except Exception as exc:  # the store itself: credentials, network, permissions, ...
        raise ArgumentValueError(f"cannot open {store!r}: {type(exc).__name__}: {exc}") from exc


def _describe(path: str, array: Any) -> dict[str, Any]:
    if isinstance(array, Collection):  # the first member's chunks, and the member count
        first = array.members[0]
        return {
            "path": path,
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "chunks": list(first.chunksize) if hasattr(first, "chunksize") else None,
            "members": len(array.members),
        }
    return {
        "path": path,
        "shape": list(array.shape),
        "dtype": str(array.dtype),
        "chunks": list(array.chunksize),
    }


def _run_epochs(
    x: Any,
    y: Any,
    settings: BenchSettings,
    progress: Callable[..., Any] | None,
    out: TextIO,
    data: dict[str, Any],
    where: str,
    as_json: bool,
) -> list[EpochResult]:
    """The epochs; the summary's header (data, arrays, stream) goes to ``out`` first.

    It is printed once the first stream is made (so a bad setting is its error alone),
    before that stream is read.
    """
    printed: list[bool] = []

    def announce() -> None:
        if as_json or printed:
            return
        printed.append(True)
        batches = -(-int(x.shape[0]) // settings.batch_size)
        planned = _summary(data, settings, where, [], paired=y is not None, batches=batches)
        tqdm.write(_header(planned), file=out)  # above a live bar, not through it
        out.flush()

    results = []
    for epoch in range(settings.epochs):
        results.append(_run_epoch(x, y, settings, epoch, progress, announce))
    return results


def _run_epoch(
    x: Any,
    y: Any,
    settings: BenchSettings,
    epoch: int,
    progress: Callable[..., Any] | None,
    announce: Callable[[], None] = lambda: None,
) -> EpochResult:
    n = int(x.shape[0])
    bar = (
        tqdm(disable=True)
        if progress is None
        else progress(
            total=n,
            desc=f"epoch {epoch}",
            unit=" samples",
            unit_scale=True,
            leave=False,
        )
    )
    live = not getattr(bar, "disable", False)
    paired = y is not None
    shown = [0.0]  # when the bar's rates were last updated, in seconds of the epoch

    def on_item(item: Any, stream: Any, elapsed: float) -> None:
        bar.update(len(item[0]) if paired else len(item))
        if elapsed - shown[0] >= POSTFIX_INTERVAL:
            shown[0] = elapsed
            bar.set_postfix_str(_rates(stream.stats, elapsed), refresh=False)

    with bar:
        cpu = _cpu_now(settings.client)

        def make() -> BatchStream:
            stream = settings.make_stream(x, y, epoch)
            announce()
            return stream

        seconds, stats = time_epoch(make, on_item=on_item if live else None)
        cpu = _cpu_now(settings.client) - cpu
        if live:  # the final numbers, also for an epoch shorter than the bar's refresh
            bar.set_postfix_str(_rates(stats, seconds))
    return EpochResult(
        epoch=epoch,
        batches=stats.items_yielded,
        samples=stats.samples_yielded,
        seconds=seconds,
        bytes_read=stats.bytes_read,
        bytes_yielded=stats.bytes_yielded,
        wait_seconds=stats.wait_seconds,
        retries=int(getattr(stats, "retries", 0)),
        chunks_missing=int(getattr(stats, "chunks_missing", 0)),
        skipped=list(getattr(stats, "skipped", [])),
        time_to_first_batch=getattr(stats, "time_to_first_batch", None),
        cpu_seconds=cpu,
        bottleneck=stats.bottleneck(),
        **(
            {}
            if settings.cache is None
            else {
                "cache_hits": stats.cache_hits,
                "cache_misses": stats.cache_misses,
                "bytes_from_cache": stats.bytes_from_cache,
            }
        ),
    )


def _rates(stats: Any, elapsed: float) -> str:
    """The bar's postfix: MB/s handed out and the share of time spent waiting."""
    if elapsed <= 0:
        return ""
    return (
        f"{stats.bytes_yielded / 1e6 / elapsed:.1f} MB/s, wait {stats.wait_seconds / elapsed:.0%}"
    )
