"""Streams: the public constructors and the iterators they return.

A constructor validates its arguments into a :class:`StreamSpec` (``_spec``)
and hands it to a stream.  A :class:`BatchStream` plans the epoch from the
spec (``_plan``), turns each window into a dask graph (``_read``), keeps a
bounded number of graphs in flight on a runner (``_runners``), consumes the
results in plan order and cuts them into batches (``_batching``).  A
:class:`ChunkStream` does the same with one graph per stored block, in order
or as reads complete.  Both count what they read and yield in
:class:`StreamStats`, and release every future on exhaustion, ``close()``,
``break``, an exception in the consumer, or garbage collection.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar

import numpy as np

from ._batching import Batcher, Ranges, positions_between
from ._batching import count_batches as _count
from ._errors import (
    ArgumentValueError,
    ChunkReadError,
    MissingChunksWarning,
    SkippedChunksWarning,
    StreamFailedError,
    WindowError,
    WindowTimeoutError,
    warn_caller,
)
from ._plan import EpochPlan, PlanSummary, Window, read_amplification
from ._policy import DEFAULT_POLICY, DEFAULT_RETRIES, MissingMode, OnError, ReadPolicy, ReadReport
from ._read import (
    ShardItem,
    block_graph,
    blocks_by_shard,
    count_tasks,
    read_threads,
    release_free_memory,
    shard_graph,
    window_graph,
)
from ._runners import Runner, make_runner, resolve_client
from ._sources import SliceSource, Source, as_source
from ._spec import (
    DEFAULT_IO_BYTES,
    DEFAULT_IO_CONCURRENCY,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PREFETCH,
    DEFAULT_WINDOW_BYTES,
    StreamSpec,
    flag,
    io_concurrency,
    positive_int,
    shuffle_mode,
    timeout_seconds,
)

__all__ = [
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
    "BatchStream",
    "ChunkStream",
    "SkippedChunk",
    "Stream",
    "StreamStats",
    "batch_stream",
    "chunk_stream",
    "count_batches",
    "paired_batch_stream",
    "paired_shuffled_batch_stream",
    "plan_epoch",
    "shuffled_batch_stream",
]

T = TypeVar("T")


# --------------------------------------------------------------------------
# Public constructors


def count_batches(array: Any, batch_size: int, *, drop_remainder: bool = False) -> int:
    """Number of batches a batch stream over ``array`` yields.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array or numpy.ndarray
        Samples along axis 0.
    batch_size : int
        Samples per batch (>= 1).
    drop_remainder : bool, default False
        Whether a short last batch is dropped.

    Returns
    -------
    int
        ``ceil(n / batch_size)``, or ``n // batch_size`` with
        ``drop_remainder``; 0 for an empty array.
    """
    size = positive_int("batch_size", batch_size)
    drop = flag("drop_remainder", drop_remainder)
    return _count(as_source(array).n_samples, size, drop)


def chunk_stream(
    array: Any,
    *,
    concurrency: int | None = None,
    ordered: bool = True,
    with_index: bool = False,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "warn",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
) -> ChunkStream:
    """Stream one numpy array per stored chunk, over the whole chunk grid.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array or numpy.ndarray
        Any number of dimensions >= 1.  Numpy arrays are split along axis 0
        into blocks of dask's default chunk size.
    concurrency : int, optional
        The former name of ``io_concurrency`` (the same meaning); prefer
        ``io_concurrency``.  Giving both with different values is an error.
    ordered : bool, default True
        ``True``: C order of block index.  ``False``: as reads complete.
    with_index : bool, default False
        Yield ``(block_index, chunk)`` tuples instead of bare arrays.
    client : distributed.Client, optional
        Compute on this cluster; default: dask's active scheduler.
    timeout : float, optional
        Seconds to wait for one chunk before raising
        :class:`WindowTimeoutError`.
    missing, on_error, retries
        The read policy, as for :func:`batch_stream`; a skipped chunk is not
        yielded.
    io_concurrency : int, optional
        Reads kept in flight (at most this many; each is one store request
        of one chunk, or of one shard of a sharded array, whose inner chunks
        are then yielded one by one).  Locally the stream's store requests are
        also capped at this number; decoding runs on Zarr's executor,
        whatever the value.  Default: one read per CPU for a store known to
        be local (``LocalStore``, ``MemoryStore``, ``ZipStore``, numpy and
        dask arrays), where more reads measured more CPU time and no gain;
        ``DEFAULT_IO_CONCURRENCY`` (16) for any other store (object stores,
        fsspec, wrappers), lowered for large chunks or shards so that the
        reads in flight hold at most 256 MiB decoded (to no fewer than the
        CPU count); on a cluster, twice its worker threads (futures in
        flight).

    Returns
    -------
    ChunkStream
        An iterator with ``len()`` (number of non-empty stored chunks),
        ``close()``, context-manager use and ``.stats``.  Edge chunks are
        cropped to the array; every chunk is an array the caller owns.
    """
    return build_chunk_stream(
        array,
        concurrency=concurrency,
        io_concurrency=io_concurrency,
        ordered=ordered,
        with_index=with_index,
        client=client,
        timeout=timeout,
        policy=ReadPolicy(missing, on_error, retries),
    )


def build_chunk_stream(
    array: Any,
    *,
    concurrency: object,
    ordered: object,
    with_index: object,
    client: Any,
    timeout: object,
    policy: ReadPolicy,
    transform: Callable[[np.ndarray], Any] | None = None,
    io_concurrency: object = None,
) -> ChunkStream:
    """Validate and build a :class:`ChunkStream` (shared with ``map_chunks``)."""
    source = as_source(array)
    client = resolve_client(client)
    requests = _io_concurrency(concurrency, io_concurrency)
    units = blocks_by_shard(source)
    if requests is None:
        requests = _default_io_concurrency(client, source, units)
    return ChunkStream(
        source,
        concurrency=requests,
        units=units,
        ordered=flag("ordered", ordered),
        with_index=flag("with_index", with_index),
        client=client,
        timeout=timeout_seconds(timeout),
        policy=policy,
        transform=transform,
    )


def batch_stream(
    array: Any,
    batch_size: int,
    *,
    drop_remainder: bool = False,
    prefetch: int = DEFAULT_PREFETCH,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "warn",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
) -> BatchStream:
    """Stream minibatches along axis 0, in order.

    Batch ``k`` is rows ``[k * batch_size, (k + 1) * batch_size)`` with all
    other axes whole; a batch may cross chunk boundaries.  Each stored chunk
    is decoded exactly once per epoch, whatever the batch size.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array or numpy.ndarray
        Samples along axis 0.
    batch_size : int
        Samples per batch (>= 1; numpy integers accepted).
    drop_remainder : bool, default False
        Drop the short last batch instead of yielding it.
    prefetch : int, default 2
        Windows computed ahead of the one being consumed (0: compute on
        demand).  About ``prefetch + 1`` windows are held at once.
    window_bytes : int, default 32 MiB
        Target decoded size of one window of work (rounded to whole chunks;
        at least one chunk).  A window's consecutive chunks are read with one
        Zarr call, which decodes them concurrently (how the default was chosen:
        ``docs/benchmarks.md``).
    client : distributed.Client, optional
        Compute windows on this cluster.  Default: a ``distributed`` client if
        dask's configuration points at one, else the local threaded scheduler.
    timeout : float, optional
        Seconds to wait for one window before raising
        :class:`WindowTimeoutError`; ``None`` or ``float("inf")`` wait
        forever.
    missing : {"warn", "fill", "error"}, default "warn"
        Chunks absent from the store are read as the fill value, as Zarr
        does, with one :class:`MissingChunksWarning` per stream naming how
        many and the first key (``"warn"``), silently (``"fill"``: for arrays
        that leave empty chunks unwritten on purpose), or raise
        :class:`MissingChunkError` (``"error"``).
    on_error : {"raise", "skip"}, default "raise"
        Chunks whose bytes do not decode raise :class:`CorruptChunkError`
        from ``next()``; with ``"skip"`` their samples leave the epoch (from
        every array of a paired stream), a :class:`SkippedChunksWarning`
        names them and ``stats.skipped`` lists them; the stream then yields
        fewer samples than ``len()`` promised.
    retries : int, default 3
        Retries of one read after a transient fault (connection errors,
        timeouts, HTTP 5xx / 429 / throttling), with exponential backoff and
        jitter; not-found, permission and decoding errors are never retried.
    io_concurrency : int, optional
        Store requests the stream's local reads keep in flight at most;
        ``None`` (default): no limit beyond the stream's own, the windows in
        flight (``prefetch + 1`` windows' worth of samples) read at once, each
        requesting its chunks concurrently (measured to keep up with Zarr's
        ``x[:]`` at 20-100 ms per request).  Decoding
        runs on Zarr's executor whatever the value.  On a cluster, each
        worker's reads are bounded by its threads and Zarr's
        ``async.concurrency``.

    Returns
    -------
    BatchStream
        Iterator of owned ``numpy.ndarray`` batches with ``len()``,
        ``close()``, context-manager use, ``.stats``, ``.spec`` and ``.plan``.
        One pass: an exhausted stream stays exhausted; make a new stream
        (with ``epoch=``) for the next epoch.
    """
    return BatchStream(
        StreamSpec(
            (array,),
            batch_size,
            shuffle="none",
            drop_remainder=drop_remainder,
            prefetch=prefetch,
            window_bytes=window_bytes,
            client=client,
            timeout=timeout,
            missing=missing,
            on_error=on_error,
            retries=retries,
            io_concurrency=io_concurrency,
        )
    )


def shuffled_batch_stream(
    array: Any,
    batch_size: int,
    *,
    seed: int | None = None,
    shuffle_buffer_size: int | None = None,
    drop_remainder: bool = False,
    epoch: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    prefetch: int | None = None,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "warn",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
) -> BatchStream:
    """Stream minibatches of shuffled samples.

    Every sample appears exactly once per epoch (before ``drop_remainder``).

    Parameters
    ----------
    array : zarr.Array, dask.array.Array or numpy.ndarray
        Samples along axis 0.
    batch_size : int
        Samples per batch.
    seed : int, optional
        Makes the order repeatable: the same ``(seed, epoch)`` gives the same
        batches across runs, processes, prefetch, concurrency and scheduler.
        ``None`` draws fresh entropy (see the stream's ``.seed`` to repeat it).
    shuffle_buffer_size : int, optional
        ``None``: an exact uniform permutation of all samples; out of core
        that reads the data about ``ceil(dataset bytes / window bytes)``
        times, with windows sized from ``memory_budget``.
        An int ``S``: a shuffle buffer.  The order of chunks is permuted,
        about ``S`` samples (rounded up to whole chunks) are held at a time
        and drawn from at random.  Each chunk is read once and memory stays
        at about ``(prefetch + 1) * S`` samples, but samples only mix with
        those in the same buffer: a larger buffer shuffles better.  The first
        buffer is read as windows of 1, 1, 2, 4, ... chunks, so the first batch
        waits for one chunk, and those first batches mix fewer chunks.
    drop_remainder : bool, default False
        Drop the short last batch.
    epoch : int, default 0
        Mixed into the seed: each epoch of a seed has its own order.
    memory_budget : int, default 1 GiB
        Exact shuffle only: bytes of samples the stream may hold at once.
        The ``prefetch + 1`` windows alive at once share it, so a window
        holds ``memory_budget / (prefetch + 1)`` bytes of samples and the
        data is decoded about ``dataset bytes / window bytes`` times per
        epoch (``stream.summary().read_amplification`` tells before reading;
        ``prefetch=0``, the exact shuffle's default, gives the fewest reads).
        Decoding adds about 1/16 of a window; the allocator may keep more
        (``docs/benchmarks.md``).
    prefetch : int, optional
        Windows computed ahead of the one being consumed.  Default: 2 with a
        shuffle buffer; 0 for the exact shuffle, whose windows would
        otherwise split ``memory_budget`` and multiply the reads.
    client, timeout, missing, on_error, retries, io_concurrency
        As for :func:`batch_stream`.
    """
    return BatchStream(
        StreamSpec(
            (array,),
            batch_size,
            shuffle=shuffle_mode(True, shuffle_buffer_size),
            seed=seed,
            shuffle_buffer_size=shuffle_buffer_size,
            drop_remainder=drop_remainder,
            epoch=epoch,
            memory_budget=memory_budget,
            prefetch=prefetch,
            client=client,
            timeout=timeout,
            missing=missing,
            on_error=on_error,
            retries=retries,
            io_concurrency=io_concurrency,
        )
    )


def paired_batch_stream(
    features: Any,
    labels: Any,
    batch_size: int,
    *,
    drop_remainder: bool = False,
    prefetch: int = DEFAULT_PREFETCH,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "warn",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
) -> BatchStream:
    """Stream ``(features_batch, labels_batch)`` pairs in order.

    Row ``i`` of both arrays of a pair is the same sample, also when the two
    arrays are chunked differently along axis 0.  Parameters are those of
    :func:`batch_stream`; ``features`` and ``labels`` must have the same
    length (else :class:`LengthMismatchError`).
    """
    return BatchStream(
        StreamSpec(
            (features, labels),
            batch_size,
            shuffle="none",
            drop_remainder=drop_remainder,
            prefetch=prefetch,
            window_bytes=window_bytes,
            client=client,
            timeout=timeout,
            missing=missing,
            on_error=on_error,
            retries=retries,
            io_concurrency=io_concurrency,
        )
    )


def paired_shuffled_batch_stream(
    features: Any,
    labels: Any,
    batch_size: int,
    *,
    seed: int | None = None,
    shuffle_buffer_size: int | None = None,
    drop_remainder: bool = False,
    epoch: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    prefetch: int | None = None,
    client: Any = None,
    timeout: float | None = None,
    missing: MissingMode = "warn",
    on_error: OnError = "raise",
    retries: int = DEFAULT_RETRIES,
    io_concurrency: int | None = None,
) -> BatchStream:
    """Stream shuffled ``(features_batch, labels_batch)`` pairs.

    Features and labels are drawn with the same sample indices, so row ``i``
    of both is the same sample.  Parameters are those of
    :func:`shuffled_batch_stream`.
    """
    return BatchStream(
        StreamSpec(
            (features, labels),
            batch_size,
            shuffle=shuffle_mode(True, shuffle_buffer_size),
            seed=seed,
            shuffle_buffer_size=shuffle_buffer_size,
            drop_remainder=drop_remainder,
            epoch=epoch,
            memory_budget=memory_budget,
            prefetch=prefetch,
            client=client,
            timeout=timeout,
            missing=missing,
            on_error=on_error,
            retries=retries,
            io_concurrency=io_concurrency,
        )
    )


def plan_epoch(
    array: Any,
    batch_size: int,
    *,
    labels: Any = None,
    shuffle: bool = False,
    seed: int | None = None,
    shuffle_buffer_size: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    prefetch: int | None = None,
    drop_remainder: bool = False,
    epoch: int = 0,
) -> PlanSummary:
    """What an epoch would read and yield, without reading any data.

    Takes the arguments of the stream constructors and returns the plan the
    matching stream would follow (``stream.summary()`` gives the same for a
    stream that exists).  Use it to choose a shuffle buffer or a memory
    budget before a long run.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array or numpy.ndarray
        Samples along axis 0 (the features of a paired stream).
    batch_size : int
        Samples per batch.
    labels : array, optional
        Second array of a paired stream.
    shuffle : bool, default False
        ``False``: the plan of :func:`batch_stream` (``window_bytes``);
        ``True``: that of :func:`shuffled_batch_stream` (``seed``,
        ``shuffle_buffer_size``, ``memory_budget``).
    seed, shuffle_buffer_size, memory_budget, window_bytes, prefetch, \
drop_remainder, epoch
        As for the stream constructors, and validated exactly as they are
        (whatever the mode uses).  ``prefetch`` matters to the exact
        shuffle, whose windows share ``memory_budget`` with the windows
        prefetched.  With ``seed=None`` the shuffle order is a random draw.

    Returns
    -------
    PlanSummary
        Per window: samples, batches, chunks read, decoded bytes, bytes held,
        dask tasks; for the epoch: read amplification, peak window bytes,
        number of dask tasks.  ``print()`` it for a table.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.zeros((10_000, 4), dtype="f4")
    >>> plan = plan_epoch(x, 100, shuffle=True, seed=0, memory_budget=40_000, prefetch=0)
    >>> plan.n_windows, round(plan.read_amplification, 1)
    (4, 4.0)
    """
    spec = StreamSpec(
        (array,) if labels is None else (array, labels),
        batch_size,
        shuffle=shuffle_mode(shuffle, shuffle_buffer_size),
        seed=seed,
        epoch=epoch,
        shuffle_buffer_size=shuffle_buffer_size,
        memory_budget=memory_budget,
        window_bytes=window_bytes,
        prefetch=prefetch,
        drop_remainder=drop_remainder,
    )
    return _summary(spec)


def _summary(spec: StreamSpec) -> PlanSummary:
    """The plan of ``spec`` in numbers (shared by ``plan_epoch`` and ``summary()``)."""
    return spec.plan().summary(task_count=lambda window: count_tasks(spec.sources, window))


def _io_concurrency(concurrency: object, io: object) -> int | None:
    """``io_concurrency``, or its former name ``concurrency``; both must agree."""
    old = None if concurrency is None else positive_int("concurrency", concurrency)
    new = io_concurrency(io)
    if old is not None and new is not None and old != new:
        raise ArgumentValueError(
            f"concurrency={old} and io_concurrency={new} disagree; concurrency is the "
            "former name of io_concurrency: pass io_concurrency only"
        )
    return new if new is not None else old


def _default_io_concurrency(
    client: Any, source: Source, units: Sequence[tuple[tuple[int, ...], ...]] | None
) -> int:
    """Reads in flight of a chunk stream when ``io_concurrency`` is not given.

    On a cluster: twice its worker threads (futures in flight).  Locally:
    one per CPU for a store known to be local (no latency to hide; more reads
    in flight measured more CPU time per epoch), else
    ``DEFAULT_IO_CONCURRENCY``, lowered so that the reads in flight hold at
    most ``DEFAULT_IO_BYTES`` decoded (one chunk, or one shard, each), but
    not below the CPU count.
    """
    if client is not None:
        threads = sum(client.nthreads().values())
        return max(2 * threads, 1)
    cpus = os.cpu_count() or 1
    if _is_local(source):
        return cpus
    largest = max((len(unit) for unit in units), default=1) if units else 1
    chunk_bytes = source.dtype.itemsize * math.prod(
        max(sizes, default=0) for sizes in source.chunks
    )
    fits = DEFAULT_IO_BYTES // max(largest * chunk_bytes, 1)
    return max(min(DEFAULT_IO_CONCURRENCY, fits), min(cpus, DEFAULT_IO_CONCURRENCY), 1)


_LOCAL_STORES = ("LocalStore", "MemoryStore", "ZipStore", "GpuMemoryStore")


def _is_local(source: Source) -> bool:
    """Whether ``source`` is read without request latency: a numpy or dask array, or a
    Zarr array on a local store (a wrapper store may add latency: it is not local)."""
    if not isinstance(source, SliceSource):
        return True  # a dask array computes its own graph
    store = getattr(source.array, "store", None)
    return store is None or type(store).__name__ in _LOCAL_STORES


# --------------------------------------------------------------------------
# Stream iterators


@dataclass(frozen=True)
class SkippedChunk:
    """A chunk whose samples left the epoch because it does not decode.

    Attributes
    ----------
    array : str
        The array's name.
    chunk : int or tuple of int
        The axis-0 chunk (batch streams) or block index (chunk streams).
    samples : range
        The samples the chunk holds.
    """

    array: str
    chunk: int | tuple[int, ...]
    samples: range


@dataclass
class StreamStats:
    """Counters of one stream, updated as items are consumed.

    Attributes
    ----------
    chunks_read : int
        Stored chunks decoded (for batch streams: axis-0 chunks, each covering
        every stored chunk along the other axes; per paired array).
    bytes_read : int
        Decoded bytes of those chunks.
    bytes_yielded : int
        Bytes of the arrays handed to the consumer.
    items_yielded : int
        Batches (or chunks) handed to the consumer.
    samples_yielded : int
        Samples (rows of axis 0) handed to the consumer.
    windows_read : int
        Dask graphs whose results were consumed.
    wait_seconds : float
        Time the consumer spent blocked in ``next()`` waiting for data.
    chunks_missing : int
        Chunks (batch streams: axis-0 chunks per array) with stored objects
        absent from the store, read as the fill value; each counted once per
        stream, however many windows read it; not in ``chunks_read``.
    retries : int
        Reads retried after a transient fault.
    skipped : list of SkippedChunk
        Chunks left out because they do not decode (``on_error="skip"``).
    samples_filled : int
        Samples yielded in place of skipped ones so that a rank keeps its
        steps: a :class:`Loader` with ``world_size > 1`` fills the shortfall
        of skipped chunks from the start of the rank's own share, as
        ``even_batches`` pads.
    time_to_first_batch : float or None
        Seconds from the stream's creation to the first batch (chunk streams:
        the first chunk) handed out; ``None`` before it.  The start-up cost:
        sequential and buffered streams read a one-unit window first, so it is
        about one chunk read (``docs/architecture.md``, *Fast start*).
    """

    chunks_read: int = 0
    bytes_read: int = 0
    bytes_yielded: int = 0
    items_yielded: int = 0
    samples_yielded: int = 0
    windows_read: int = 0
    wait_seconds: float = 0.0
    chunks_missing: int = 0
    retries: int = 0
    skipped: list[SkippedChunk] = field(default_factory=list)
    samples_filled: int = 0
    time_to_first_batch: float | None = None

    @property
    def read_amplification(self) -> float:
        """``bytes_read / bytes_yielded`` (1.0 means every byte read once).

        0.0 when nothing was read or yielded, ``inf`` when bytes were read
        but nothing yielded: the rule ``PlanSummary`` follows too.
        """
        return read_amplification(self.bytes_read, self.bytes_yielded)


class Stream(Generic[T]):
    """An iterator with ``len()``, ``close()``, context-manager use and stats.

    One pass: once exhausted (or closed) it stays exhausted, as Python's
    iterators do.  Once ``next()`` has raised an error (a chunk that cannot
    be read, a timeout, an interrupt), every later ``next()`` raises
    :class:`StreamFailedError` naming it: an epoch cut short never looks
    finished.  ``next()`` may be called from several threads: calls are
    serialised, and each item goes to exactly one caller.

    Subclasses provide ``_produce()``, a generator of items; everything it
    holds (futures, threads) is released in its ``finally`` block, which runs
    on exhaustion, ``close()``, errors, and when the stream is dropped
    (``break`` out of a ``for`` loop over it, or garbage collection).  The
    generator sees the stream through a weak proxy, so the stream and its
    generator form no reference cycle: a stream dropped after ``break`` is
    finalised at once by reference counting, and its work in flight is
    released right away.
    """

    def __init__(
        self, length: int, runner: Runner, timeout: float | None, missing: str = "warn"
    ) -> None:
        self._created = time.perf_counter()
        self.stats = StreamStats()
        self._length = length
        self._runner = runner
        self._timeout = timeout
        self._token = uuid.uuid4().hex[:12]
        self._items: Iterator[T] | None = None
        self._closed = False
        self._failure: BaseException | None = None  # the error that stopped the stream
        self._lock = threading.Lock()
        self._missing = missing
        self._missing_seen: set[tuple[str, object]] = set()  # (array, chunk), each counted once
        self._warned = False

    def _produce(self) -> Iterator[T]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> T:
        with self._lock:
            if self._failure is not None:
                raise self._failed()
            if self._closed:
                raise StopIteration
            if self._items is None:
                proxy: Any = weakref.proxy(self)
                self._items = type(self)._produce(proxy)
            try:
                return next(self._items)
            except BaseException as exc:  # StopIteration included: exhausted
                closed_elsewhere = self._closed  # close() from another thread stopped it
                if not closed_elsewhere and not isinstance(exc, StopIteration):
                    self._failure = exc  # every later next() names it
                self._close(force=True)
                if closed_elsewhere:
                    raise StopIteration from None
                raise

    def _failed(self) -> StreamFailedError:
        """The error a ``next()`` after the stream's first error raises."""
        first = self._failure
        assert first is not None
        error = StreamFailedError(
            f"this stream stopped at an earlier error and yields nothing more "
            f"({self.stats.items_yielded} of {len(self)} items were yielded): "
            f"{type(first).__name__}: {first}; make a new stream (a Loader resumes from "
            "its state_dict()) to go on"
        )
        error.__cause__ = first
        return error

    def close(self) -> None:
        """Stop the stream: cancel work in flight and release its results.

        From another thread while ``next()`` runs, the stream stops handing
        out items once that call returns.
        """
        if self._lock.acquire(blocking=False):
            try:
                self._close()
            finally:
                self._lock.release()
        else:  # next() is running on another thread: stop its work, it returns
            self._closed = True
            self._runner.close()

    def _close(self, force: bool = False) -> None:
        if self._items is None and self._closed and not force:
            return
        self._closed = True
        items, self._items = self._items, None
        try:
            if items is not None:
                # A stream collected in a reference cycle (a suspended Loader at interpreter
                # exit) has its weak references cleared before this runs: the generator's
                # cleanup then finds its proxy of the stream dead and stops there.
                with contextlib.suppress(ReferenceError):
                    items.close()  # type: ignore[attr-defined]
        finally:
            self._runner.close()  # releases anything the generator could not

    def _note(self, name: str, report: ReadReport, chunks: Sequence[object] | None = None) -> None:
        """Count what the read policy saw in one task; warn at the first missing chunk.

        ``chunks``: the chunks the report's missing keys stand for (default:
        its axis-0 chunks); each (array, chunk) is counted once per stream,
        however many windows read it (an exact shuffle reads a chunk in
        several).
        """
        self.stats.retries += report.retries
        if not report.missing_keys:
            return
        found = report.missing_chunks if chunks is None else chunks
        new = {(name, chunk) for chunk in found} - self._missing_seen
        self._missing_seen |= new
        self.stats.chunks_missing += len(new)
        self._warn_missing(name, report.missing_keys[0])

    def _warn_missing(self, name: str, key: str) -> None:
        """One warning per stream, at its first missing chunk (``missing="warn"``).

        Attributed to the caller's line (the first frame outside the package),
        from the ``next()`` that hands out the first item holding the chunk.
        """
        if self._warned or self._missing != "warn":
            return
        self._warned = True
        count = self.stats.chunks_missing
        warn_caller(
            MissingChunksWarning(
                f"{count} chunk(s) of array {name} were missing from the store and read as the "
                f"fill value (first: {key!r}; stream.stats.chunks_missing counts them all); "
                "pass missing='fill' if the array leaves empty chunks unwritten on purpose, "
                "or missing='error' to raise",
                array=name,
                key=key,
                count=count,
            )
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self._describe_self()}, {state}>"

    def _describe_self(self) -> str:
        raise NotImplementedError

    def _place(self, sources: Sequence[Source]) -> list[Source]:
        """Sources as the runner wants them in graphs (sent to a cluster once)."""
        try:
            return self._runner.place(sources, self._timeout)
        except Exception as exc:
            names = ", ".join(source.name for source in sources)
            error = WindowTimeoutError if isinstance(exc, TimeoutError) else WindowError
            raise error(
                f"could not send {names} to the cluster's workers: {type(exc).__name__}: {exc}"
            ) from exc

    def _submit(
        self, dsk: dict[Any, Any], key: Any, priority: int, what: Callable[..., str]
    ) -> Any:
        """Hand a graph to the runner; a refusal (e.g. a closed client) names the work."""
        try:
            return self._runner.submit(dsk, key, priority)
        except Exception as exc:
            raise WindowError(
                f"{what()} could not be submitted: {type(exc).__name__}: {exc}"
            ) from exc

    def _wait(self, future: Any, what: Callable[..., str]) -> Any:
        """Block for ``future``'s result, turning failures into our errors."""
        started = time.perf_counter()
        try:
            return future.result(timeout=self._timeout)
        except ChunkReadError:
            raise
        except TimeoutError as exc:
            if future.done():  # the task itself raised a TimeoutError
                raise WindowError(f"{what()} failed: {exc!r}") from exc
            raise WindowTimeoutError(
                f"{what()} was not ready after timeout={self._timeout} s{self._runner.timeout_note}"
            ) from exc
        except Exception as exc:
            raise WindowError(f"{what()} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.stats.wait_seconds += time.perf_counter() - started


class BatchStream(Stream[Any]):
    """Batches along axis 0, computed window by window from an epoch plan.

    Yields one ``numpy.ndarray`` per batch, or a tuple of them (one per
    array) for paired streams.  Created by :func:`batch_stream` and friends
    from a :class:`StreamSpec`.

    Attributes
    ----------
    spec : StreamSpec
        The validated settings of the epoch.
    plan : EpochPlan
        The epoch's plan (pure, inspectable without reading data).
    seed : int or None
        The entropy behind the shuffle; pass it as ``seed=`` to repeat an
        epoch drawn with ``seed=None``.
    positions : list of (int, int)
        The epoch positions the stream walks, in order (the whole epoch, a
        rank's share, a worker's part).
    position : int
        Where the stream is in ``positions``: the offset after the last
        sample it has yielded (skipped samples before it included), from
        which a stream started with ``start=position`` yields exactly the
        batches this one has still to yield.
    stats : StreamStats

    Notes
    -----
    ``positions``, ``start``, ``quota`` and ``fill`` are how a
    :class:`Loader` runs a rank's share and resumes it: the stream walks the
    offsets ``start, start + 1, ...`` of ``positions``; it stops after
    ``quota`` samples (all of them: ``None``); with ``fill=True`` it goes on
    past the end of ``positions``, wrapping around to their start, until it
    has yielded ``quota`` samples, so that samples skipped as undecodable
    (``on_error="skip"``) do not cost a rank a step.
    """

    def __init__(
        self,
        spec: StreamSpec,
        *,
        positions: Ranges | None = None,
        drop_remainder: bool | None = None,
        start: int = 0,
        quota: int | None = None,
        fill: bool = False,
    ) -> None:
        created = time.perf_counter()
        self.spec = spec
        self.plan = spec.plan()
        assert spec.prefetch is not None  # resolved by the spec
        #: epoch positions this stream yields, in order (a rank's share, the rest of an epoch)
        self.positions: Ranges = (
            [(0, self.plan.n_used)] if positions is None else [r for r in positions if r[1] > r[0]]
        )
        self._total = sum(b - a for a, b in self.positions)
        if start < 0 or (start > self._total and not fill):
            raise ArgumentValueError(
                f"start={start} is outside the stream's {self._total} positions"
            )
        if fill and quota is None:
            raise ArgumentValueError("fill=True needs a quota of samples to fill up to")
        self._start = start
        self._fill = fill and self._total > 0
        self._drop = spec.drop_remainder if drop_remainder is None else drop_remainder
        self._quota = quota
        runner = make_runner(
            spec.client,
            in_flight=spec.prefetch + 1 + RAMP_WINDOWS,
            read_workers=read_threads(spec.sources),
            requests=spec.io_concurrency,
        )
        planned = max(self._total - start, 0) if quota is None else quota
        length = _count(planned, spec.batch_size, self._drop)
        super().__init__(length, runner, spec.timeout, spec.missing)
        self._created = created
        # offsets (from ``start``) of the samples left out as undecodable, ascending
        self._skipped: list[np.ndarray] = []

    @property
    def seed(self) -> int | None:
        """The entropy behind the shuffle (``None`` for a sequential stream)."""
        return self.spec.seed

    @property
    def position(self) -> int:
        """Offset in ``positions`` after the last sample yielded (skipped ones included)."""
        yielded = self.stats.samples_yielded
        if yielded == 0:
            return self._start
        if not self._skipped:
            return self._start + yielded
        skipped = np.concatenate(self._skipped)
        # the k-th kept offset is k plus the number of skipped offsets below it
        below = int(np.searchsorted(skipped - np.arange(len(skipped)), yielded - 1, "right"))
        return self._start + yielded + below

    def _produce(self) -> Iterator[Any]:
        spec = self.spec
        assert spec.prefetch is not None
        windows = _WindowSource(self.plan, self.positions, self._start, self._fill)
        in_flight: deque[tuple[Window, int, Any]] = deque()
        batcher = Batcher(spec.batch_size, drop_remainder=self._drop)
        sources: list[Source] = []
        deliver = _Delivery(self.stats, spec.paired, self._created)
        policy = spec.policy
        plan_order = self._runner.plan_order  # results arrive in plan order: cut by slicing
        quota = self._quota
        fed = 0  # samples handed to the batcher
        skipped = 0  # samples left out as undecodable, in windows read so far
        filled_read = filled_kept = 0  # samples read, and kept, past the positions' end

        # Windows in flight are counted by their share of a full window's samples, so
        # the fast-start ramp's small windows (together one window) are read together:
        # on a store with high latency each would otherwise cost a round trip.
        full = max(spec.window_rows, 1)
        pending: list[tuple[Window, int]] = []
        held = 0.0

        def weight(window: Window) -> float:
            return min(1.0, window.size / full)

        def top_up(limit: int, most: int | None = None) -> None:
            nonlocal held
            while most is None or len(in_flight) < most:
                if not pending:
                    # past the positions' end: only what the skipped samples left short
                    short = 0 if quota is None else quota - (windows.planned - skipped)
                    upcoming = windows.next(short)
                    if upcoming is None:
                        return
                    pending.append(upcoming)
                window, offset = pending[0]
                if in_flight and held + weight(window) > limit + 1e-9:
                    return
                pending.pop()
                held += weight(window)
                dsk, key = window_graph(
                    sources,
                    window,
                    f"{self._token}-{offset}",  # unique: a wrapped share meets a window again
                    policy,
                    self._runner.scope,
                    plan_order,
                    spec.decode_bytes,
                )
                future = self._submit(dsk, key, -window.index, lambda w=window: self._where(w))
                in_flight.append((window, offset, future))

        try:
            sources = self._place(spec.sources)
            # Fast start: the first window is read alone (no read competes with it) and
            # its first batch is handed out before the next windows are planned and sent.
            first = True
            top_up(1, most=1)
            while True:
                if not first:
                    top_up(spec.prefetch + 1)
                if not in_flight:
                    break
                window, offset, future = in_flight[0]  # stays in flight (released) if this fails
                results = self._wait(future, lambda w=window: self._where(w))
                in_flight.popleft()
                held -= weight(window)
                self._runner.release(future)  # a distributed result leaves the worker now
                del future
                order = None if plan_order else window.gather_index()
                # slices copy fast from any address; np.take needs aligned rows
                outputs = tuple(rows if order is None else _aligned(rows) for rows, _ in results)
                reports = [report for _, report in results]
                del results
                self._count_reads(window, reports)
                size = window.size
                if any(report.skipped for report in reports):
                    outputs, order, gone = self._skip(window, outputs, order, reports)
                    self._skipped.append(offset + gone)
                    skipped += len(gone)
                    size -= len(gone)
                if quota is not None and fed + size > quota:  # the quota's last window
                    size = quota - fed
                    outputs, order = _first_rows(outputs, order, size)
                fed += size
                if offset >= self._total - self._start:  # a window past the end: filling
                    self.stats.samples_filled += size
                    filled_read += window.size
                    filled_kept += size
                    if filled_read >= self._total and not filled_kept:
                        raise ChunkReadError(
                            f"cannot fill the {(quota or 0) - fed} samples still due to keep this "
                            f"stream's {len(self)} steps: every sample of its positions was "
                            "skipped as undecodable (on_error='skip')"
                        )
                if not first:
                    top_up(spec.prefetch)
                for batch in batcher.feed(outputs, order):
                    yield deliver(batch)
                    if first:
                        top_up(spec.prefetch)
                        first = False
                if first:  # the window completed no batch
                    top_up(spec.prefetch)
                    first = False
                del outputs  # hold at most prefetch + 1 windows (memory_budget relies on it)
                if spec.decode_bytes is not None:
                    release_free_memory()  # the window's memory, not kept by the C heap
                if quota is not None and fed >= quota:
                    break
            rest = batcher.finish()  # only after skipped chunks: the plan drops the rest
            if rest is not None:
                yield deliver(rest)
        finally:
            for _, _, future in in_flight:
                self._runner.release(future)
            in_flight.clear()

    def summary(self) -> PlanSummary:
        """The epoch's plan in numbers, per window and in total; reads nothing.

        Returns
        -------
        PlanSummary
            Chunks read, decoded bytes, bytes held, samples, batches and dask
            tasks per window; read amplification, peak window bytes and task
            count for the epoch.  About ``prefetch + 1`` windows are held at
            once.  The same as :func:`plan_epoch` with this stream's arguments.
        """
        return _summary(self.spec)

    def _describe_self(self) -> str:
        names = ", ".join(source.name for source in self.spec.sources)
        return (
            f"{names}: batch_size={self.spec.batch_size}, shuffle={self.spec.shuffle!r}, "
            f"batch {self.stats.items_yielded}/{len(self)}"
        )

    def _where(self, window: Window) -> str:
        batches = window.batch_range(self.spec.batch_size)
        chunks = [[piece.chunk for piece in pieces] for pieces in window.pieces]
        names = ", ".join(source.name for source in self.spec.sources)
        return (
            f"window {window.index} (batches {batches.start}..{batches.stop - 1}, "
            f"axis-0 chunks {chunks if self.spec.paired else chunks[0]} of {names})"
        )

    def _count_reads(self, window: Window, reports: Sequence[ReadReport]) -> None:
        stats = self.stats
        stats.windows_read += 1
        for source, pieces, report in zip(self.spec.sources, window.pieces, reports, strict=True):
            self._note(source.name, report)
            gone = set(report.missing_chunks) | {chunk for chunk, _, _ in report.skipped}
            read = [piece for piece in pieces if piece.chunk not in gone]
            stats.chunks_read += len(read)
            stats.bytes_read += sum(piece.rows for piece in read) * source.row_bytes

    def _skip(
        self,
        window: Window,
        outputs: tuple[np.ndarray, ...],
        order: np.ndarray | None,
        reports: Sequence[ReadReport],
    ) -> tuple[tuple[np.ndarray, ...], np.ndarray | None, np.ndarray]:
        """Leave out the samples of undecodable chunks, from every array.

        Each output holds the window's samples in ascending order (``order``
        maps plan positions to them), or in plan order (``order`` is
        ``None``), less its own skipped chunks; the samples skipped by any
        array are removed from all, so pairs stay aligned, and the plan order
        is renumbered.  Also returns the plan positions (within the window)
        of the samples left out, ascending.
        """
        if order is None:  # outputs in plan order (also sequential windows: ascending)
            ascending = np.asarray(window.samples)
        else:
            ascending = np.concatenate(
                [p.start + np.arange(p.rows)[p.take] for p in window.pieces[0]]
            )
        dropped_by = [
            np.concatenate(
                [np.arange(lo, hi) for _, lo, hi in report.skipped] or [np.empty(0, np.int64)]
            )
            for report in reports
        ]
        keep = ~np.isin(ascending, np.concatenate(dropped_by))
        kept = []
        for rows, dropped in zip(outputs, dropped_by, strict=True):
            kept.append(rows[keep[~np.isin(ascending, dropped)]])
        renumbered = None
        kept_in_plan = keep
        if order is not None:
            kept_in_plan = keep[order]
            positions = order[kept_in_plan]
            renumbered = (np.cumsum(keep) - 1)[positions].astype(np.int64)
        gone = np.flatnonzero(~kept_in_plan)
        names = []
        for source, report in zip(self.spec.sources, reports, strict=True):
            for chunk, lo, hi in report.skipped:
                skipped = SkippedChunk(source.name, chunk, range(lo, hi))
                if skipped not in self.stats.skipped:  # an exact shuffle reads it again
                    self.stats.skipped.append(skipped)
                    names.append(f"axis-0 chunk {chunk} (samples {lo}:{hi}) of {source.name}")
        if names:
            warn_caller(
                SkippedChunksWarning(
                    f"skipped {len(names)} chunk(s) that do not decode, and their samples in "
                    f"every array (on_error='skip'): {'; '.join(names)}"
                )
            )
        return tuple(kept), renumbered, gone


def _windows_of(plan: EpochPlan, positions: Ranges, index: int = 0) -> Iterator[Window]:
    """The windows delivering ``positions`` (epoch positions, in order), numbered on."""
    for first, end in positions:
        for window in plan.windows_between(first, end, index):
            yield window
            index = window.index + 1


class _WindowSource:
    """The windows a batch stream reads, each with its offset from the stream's start.

    First the windows of offsets ``start:total`` of ``positions``; then, with
    ``fill``, windows past the end (wrapping around to the positions' start),
    each asked for as many samples as are still short (:meth:`next`).  Holds
    the plan and positions, never the stream: a stream dropped with windows
    left is still finalised by reference counting.
    """

    def __init__(self, plan: EpochPlan, positions: Ranges, start: int, fill: bool) -> None:
        self.plan = plan
        self.positions = positions
        self.fill = fill
        self.start = start
        total = sum(stop - first for first, stop in positions)
        self.planned = 0  # offsets (from start) covered by the windows handed out
        self.index = 0
        self._windows: Iterator[Window] = iter(())
        if start < total:
            self._windows = _windows_of(plan, positions_between(positions, start, total))

    def next(self, short: int) -> tuple[Window, int] | None:
        """The next window and its offset; past the end, one of ``short`` samples at most."""
        window = next(self._windows, None)
        if window is None and self.fill and short > 0:
            at = self.start + self.planned  # wraps: positions_between counts modulo the total
            self._windows = _windows_of(
                self.plan, positions_between(self.positions, at, at + short), self.index
            )
            window = next(self._windows, None)
        if window is None:
            return None
        offset = self.planned
        self.planned += window.size
        self.index = window.index + 1
        return window, offset


def _first_rows(
    outputs: tuple[np.ndarray, ...], order: np.ndarray | None, size: int
) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
    """The first ``size`` samples (in plan order) of a window's outputs."""
    if order is None:
        return tuple(rows[:size] for rows in outputs), None
    return outputs, order[:size]


#: Windows beyond ``prefetch + 1`` a stream may have in flight: the fast-start ramp's
#: small windows, which together count as one (``ramp_split``: about log2 of a window's
#: chunks).
RAMP_WINDOWS = 8


class _Delivery:
    """Counts a batch in ``stats`` and hands it out (the per-batch hot path)."""

    __slots__ = ("created", "paired", "stats")

    def __init__(self, stats: StreamStats, paired: bool, created: float) -> None:
        self.stats = stats
        self.paired = paired
        self.created = created

    def __call__(self, batch: tuple[np.ndarray, ...]) -> Any:
        stats = self.stats
        first = batch[0]
        if stats.time_to_first_batch is None:
            stats.time_to_first_batch = time.perf_counter() - self.created
        stats.items_yielded += 1
        stats.samples_yielded += len(first)
        if self.paired:
            stats.bytes_yielded += sum(part.nbytes for part in batch)
            return batch
        stats.bytes_yielded += first.nbytes
        return first


class ChunkStream(Stream[Any]):
    """One item per stored chunk; created by :func:`chunk_stream` and :func:`map_chunks`.

    Without ``transform`` an item is the chunk itself; with one it is
    ``transform(chunk)``, computed in the task that read the chunk (on a
    worker, with a client), so only the result travels to the consumer.

    Each read task reads one *unit*: one stored block, or, for a sharded Zarr
    array, every inner block of one shard with one read (``units``), whose
    blocks are then handed out one by one.  At most ``concurrency`` units are
    in flight or held.
    """

    def __init__(
        self,
        source: Source,
        *,
        concurrency: int,
        ordered: bool,
        with_index: bool,
        client: Any,
        timeout: float | None,
        policy: ReadPolicy = DEFAULT_POLICY,
        transform: Callable[[np.ndarray], Any] | None = None,
        units: Sequence[tuple[tuple[int, ...], ...]] | None = None,
    ) -> None:
        created = time.perf_counter()
        self.source = source
        self.policy = policy
        self._blocks = list(source.blocks())
        self._sharded = units is not None
        self._units = (
            [tuple(unit) for unit in units] if units else [(block,) for block in self._blocks]
        )
        # reads wait on the store in their threads, so a Zarr or numpy source gets one
        # thread per read in flight; a dask array computes its graph on one per CPU
        threads = concurrency if isinstance(source, SliceSource) else os.cpu_count() or 1
        runner = make_runner(
            client, in_flight=concurrency, read_workers=threads, requests=concurrency
        )
        super().__init__(len(self._blocks), runner, timeout, policy.missing)
        self._created = created
        self._concurrency = concurrency
        self._ordered = ordered
        self._with_index = with_index
        self._transform = transform

    def _produce(self) -> Iterator[Any]:
        units = self._units
        in_flight: dict[Any, int] = {}  # future -> unit number; insertion order = unit order
        held: dict[int, dict[tuple[int, ...], ShardItem]] = {}  # read units not yet handed out
        source = self.source
        submitted = 0

        def submit_next() -> None:
            nonlocal submitted
            unit = units[submitted]
            if not self._sharded:
                dsk, key = block_graph(
                    source, unit[0], self._token, self._transform, self.policy, self._runner.scope
                )
            else:
                assert isinstance(source, SliceSource)
                dsk, key = shard_graph(
                    source, unit, self._token, self._transform, self.policy, self._runner.scope
                )
            future = self._submit(dsk, key, -submitted, lambda u=unit: self._where_unit(u))
            in_flight[future] = submitted
            submitted += 1

        def top_up() -> None:
            while len(in_flight) + len(held) < self._concurrency and submitted < len(units):
                submit_next()

        def collect(future: Any) -> list[ShardItem]:
            number = in_flight[future]
            unit = units[number]
            result = self._wait(future, lambda u=unit: self._where_unit(u))
            del in_flight[future]
            self._runner.release(future)
            if not self._sharded:
                item, report = result
                return [(unit[0], _aligned(item), report, None)]
            return [(block, _aligned(item), report, error) for block, item, report, error in result]

        def hand_out(entry: ShardItem) -> Iterator[Any]:
            block, item, report, error = entry
            self._note(self.source.name, report, [block] if report.missing_chunks else ())
            if error is not None:
                raise WindowError(
                    f"{self._where(block)} failed: {type(error).__name__}: {error}"
                ) from error
            if report.skipped:
                self._skip(block)
                return
            yield self._deliver(block, item, missing=bool(report.missing_chunks))

        try:
            (source,) = self._place([self.source])
            if self._ordered:
                unit_of = {block: number for number, unit in enumerate(units) for block in unit}
                for block in self._blocks:  # C order of the chunk grid
                    number = unit_of[block]
                    while number not in held:
                        top_up()
                        while submitted <= number:  # held units fill the limit: read it anyway
                            submit_next()
                        future = next(f for f, n in in_flight.items() if n == number)
                        held[number] = {entry[0]: entry for entry in collect(future)}
                    entries = held[number]
                    entry = entries.pop(block)
                    if not entries:
                        del held[number]
                    top_up()
                    yield from hand_out(entry)
                return
            while True:
                top_up()
                if not in_flight:
                    break
                ready = self._first_done(list(in_flight))
                if not ready:  # nothing finished within timeout: name the oldest
                    oldest = self._where_unit(units[next(iter(in_flight.values()))])
                    raise WindowTimeoutError(
                        f"{oldest} was not ready after timeout={self._timeout} s "
                        f"(nor any of the {len(in_flight)} reads in flight)"
                        f"{self._runner.timeout_note}"
                    )
                for future in ready:
                    arrived = collect(future)
                    del future
                    top_up()
                    for one in arrived:
                        yield from hand_out(one)
        finally:
            for future in in_flight:
                self._runner.release(future)
            in_flight.clear()
            held.clear()

    def _where_unit(self, unit: tuple[tuple[int, ...], ...]) -> str:
        if not self._sharded:
            return self._where(unit[0])
        return f"the shard of chunks {unit[0]}..{unit[-1]} of array {self.source.name}" + (
            "" if self._transform is None else f" ({_name(self._transform)}() on its chunks)"
        )

    def _describe_self(self) -> str:
        order = "ordered" if self._ordered else "unordered"
        what = "" if self._transform is None else f"{_name(self._transform)}() on "
        return f"{what}{self.source.name}: chunk {self.stats.items_yielded}/{len(self)}, {order}"

    def _where(self, block: tuple[int, ...]) -> str:
        where = f"chunk {block} of array {self.source.name}"
        if self._transform is None:
            return where
        return f"{_name(self._transform)}() on {where}"

    def _first_done(self, futures: list[Any]) -> list[Any]:
        started = time.perf_counter()
        done = self._runner.wait(futures, self._timeout)
        self.stats.wait_seconds += time.perf_counter() - started
        return [f for f in futures if f in done]  # block order; empty if timed out

    def _skip(self, block: tuple[int, ...]) -> None:
        slices = self.source.block_slices(block)
        samples = range(slices[0].start, slices[0].stop)
        self.stats.skipped.append(SkippedChunk(self.source.name, block, samples))
        self.stats.windows_read += 1
        warn_caller(
            SkippedChunksWarning(
                f"skipped chunk {block} (samples {samples.start}:{samples.stop}) of array "
                f"{self.source.name}: it does not decode (on_error='skip')"
            )
        )

    def _deliver(self, block: tuple[int, ...], item: Any, missing: bool = False) -> Any:
        stats = self.stats
        if stats.time_to_first_batch is None:
            stats.time_to_first_batch = time.perf_counter() - self._created
        sizes = [axis[i] for axis, i in zip(self.source.chunks, block, strict=True)]
        stats.windows_read += 1
        if not missing:
            stats.chunks_read += 1
            stats.bytes_read += math.prod(sizes) * self.source.dtype.itemsize
        stats.bytes_yielded += int(getattr(item, "nbytes", 0))
        stats.items_yielded += 1
        stats.samples_yielded += sizes[0]
        return (block, item) if self._with_index else item


def _aligned(value: Any) -> Any:
    """``value``, copied if it is an array whose data is not aligned for its dtype.

    A result received from a distributed worker sits wherever the message put
    it; on an unaligned address ``np.take`` is many times slower (see
    docs/benchmarks.md), so one copy of the window pays for itself.
    """
    if isinstance(value, np.ndarray) and not value.flags.aligned:
        return np.require(value, requirements=["A"])
    return value


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or repr(function)
