"""Streams: the public constructors and the iterators they return.

A constructor validates its arguments into a :class:`StreamSpec` (batch streams) or a
:class:`ChunkSpec` (chunk streams), both in ``streams.spec`` with their read options
as one :class:`ReadOptions`, and hands it to a stream.  A :class:`BatchStream` plans
the epoch from the spec (``plan``), turns each window into a dask graph (``read``), keeps a
bounded number of graphs in flight on a runner (``execute.runners``), consumes the
results in plan order and cuts them into batches (``plan.batching``).  A
:class:`ChunkStream` does the same with one graph per stored block, in order
or as reads complete.  Both count what they read and yield in
:class:`StreamStats`, and release every future on exhaustion, ``close()``,
``break``, an exception in the consumer, or garbage collection.
"""

from __future__ import annotations

from typing import Any

from ..store.cache import ChunkCache
from ..store.policy import MissingMode, OnError
from ..store.requests import ReaderFactory
from .batch import BatchStream
from .chunk import ChunkStream, build_chunk_stream
from .patch_stream import patch_stream
from .planning import count_batches, plan_epoch
from .spec import (
    DEFAULT_IO_CONCURRENCY,
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PREFETCH,
    DEFAULT_WINDOW_BYTES,
    UNSET,
    ChunkSpec,
    ReadOptions,
    StreamSpec,
    merged_io_concurrency,
    read_options,
    shuffle_mode,
)

__all__ = [
    "DEFAULT_IO_CONCURRENCY",
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
    "batch_stream",
    "chunk_stream",
    "count_batches",
    "paired_batch_stream",
    "paired_shuffled_batch_stream",
    "patch_stream",
    "plan_epoch",
    "shuffled_batch_stream",
]


# --------------------------------------------------------------------------
# Public constructors


def chunk_stream(
    array: Any,
    *,
    concurrency: int | None = None,
    ordered: bool = True,
    with_index: bool = False,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
) -> ChunkStream:
    """Stream one numpy array per stored chunk, over the whole chunk grid.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array, numpy.ndarray, path or URL, Collection or ChunkSubset
        Any number of dimensions >= 1 (a collection: each member's own blocks,
        member after member).  Numpy arrays are split along axis 0
        into blocks of dask's default chunk size.
    concurrency : int, optional
        The seed's name of ``io_concurrency`` (the same meaning and unit,
        reads in flight), kept here only: the other entry points take
        ``io_concurrency``.  Giving both with different values is an error.
    ordered : bool, default True
        ``True``: C order of block index.  ``False``: as reads complete.
    with_index : bool, default False
        Yield ``(block_index, chunk)`` tuples instead of bare arrays.
    client : distributed.Client, optional
        Compute on this cluster; default: dask's active scheduler.
    timeout : float, optional
        Seconds to wait for one chunk before raising
        [`WindowTimeoutError`][daskzarr_batches.WindowTimeoutError].
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        The read policy, as for [`batch_stream`][daskzarr_batches.batch_stream]; a skipped chunk
        is not
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
    cache : ChunkCache, optional
        Serve decoded chunks from this cache when it holds them and keep the
        chunks read from the store in it, so later epochs (and other streams
        sharing it) read memory or a local disk instead of the store; see
        [`ChunkCache`][daskzarr_batches.ChunkCache].  ``stats.cache_hits`` / ``cache_misses`` count.
        Sharded arrays keep their inner chunks.

    Returns
    -------
    ChunkStream
        An iterator with ``len()`` (number of non-empty stored chunks),
        ``close()``, context-manager use and ``.stats``.  Edge chunks are
        cropped to the array; every chunk is an array the caller owns.
    """
    options = read_options(
        read, client=client, timeout=timeout, missing=missing, on_error=on_error,
        retries=retries, io_concurrency=merged_io_concurrency(concurrency, io_concurrency),
        cache=cache, reader=reader,
    )  # fmt: skip
    return build_chunk_stream(ChunkSpec(array, ordered, with_index, options))


def batch_stream(
    array: Any,
    batch_size: int,
    *,
    drop_remainder: bool = False,
    prefetch: int | None = None,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
    return_sources: bool = False,
) -> BatchStream:
    """Stream minibatches along axis 0, in order.

    Batch ``k`` is rows ``[k * batch_size, (k + 1) * batch_size)`` with all
    other axes whole; a batch may cross chunk boundaries.  Each stored chunk
    is decoded exactly once per epoch, whatever the batch size.

    Parameters
    ----------
    array : zarr, dask or numpy array, path or URL, Collection, Mixture or ChunkSubset
        Samples along axis 0 (a mixture: the samples it draws per epoch).
    batch_size : int
        Samples per batch (>= 1; numpy integers accepted).
    drop_remainder : bool, default False
        Drop the short last batch instead of yielding it.
    prefetch : int, optional
        Windows computed ahead of the one being consumed (0: compute on
        demand).  About ``prefetch + 1`` windows are held at once.  ``None``
        (every stream's and the ``Loader``'s default): ``DEFAULT_PREFETCH``
        (2), or 0 for the exact shuffle.
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
        [`WindowTimeoutError`][daskzarr_batches.WindowTimeoutError]; ``None`` or ``float("inf")``
        wait
        forever.
    missing : {"fill", "warn", "error"}, default "fill"
        Chunks absent from the store are read as the fill value, as the Zarr
        spec says (Zarr leaves a chunk that is all fill value unwritten by
        default), counted in ``stream.stats.chunks_missing`` (``"fill"``),
        the same with one [`MissingChunksWarning`][daskzarr_batches.MissingChunksWarning] per
        stream naming how
        many and the first key (``"warn"``: where every chunk should be
        stored), or raise [`MissingChunkError`][daskzarr_batches.MissingChunkError] (``"error"``).
         An array
        gone from its store raises [`StoreGoneError`][daskzarr_batches.StoreGoneError] whatever
        this says.
    on_error : {"raise", "skip"}, default "raise"
        Chunks whose bytes do not decode raise
        [`CorruptChunkError`][daskzarr_batches.CorruptChunkError]
        from ``next()``; with ``"skip"`` their samples leave the epoch (from
        every array of a paired stream), a
        [`SkippedChunksWarning`][daskzarr_batches.SkippedChunksWarning]
        names them and ``stats.skipped`` lists them; the stream then yields
        fewer samples than ``len()`` promised.
    retries : int, default 3
        Retries of one read after a transient fault (connection errors,
        timeouts, HTTP 5xx / 429 / throttling), with exponential backoff and
        jitter; not-found, permission and decoding errors are never retried.
    io_concurrency : int, optional
        Store requests the stream's reads keep in flight at most; ``None``
        (default): no limit beyond the stream's own, the windows in flight
        (``prefetch + 1`` windows' worth of samples) read at once, each
        requesting its chunks concurrently (how that compares with Zarr's
        ``x[:]`` on slow stores: ``docs/benchmarks.md``, "Latency hiding").
        Decoding runs on Zarr's executor whatever the value.  On a cluster
        the limit holds within each read task on its worker (a worker's
        tasks together are also bounded by its threads and Zarr's
        ``async.concurrency``).
    cache : ChunkCache, optional
        Serve decoded chunks from this cache when it holds them and keep the
        chunks read from the store in it, so later epochs (and other streams
        sharing it) read memory or a local disk instead of the store; see
        [`ChunkCache`][daskzarr_batches.ChunkCache].  ``stats.cache_hits`` / ``cache_misses`` count.
        Sharded arrays keep their inner chunks.
    read : ReadOptions, optional
        The read keywords above (``client`` ... ``cache``, the fields of
        [`ReadOptions`][daskzarr_batches.ReadOptions]) as one value, to share
        one set across streams; a flat one given beside it must agree with it.
    return_sources : bool, default False
        For a collection ([`concat`][daskzarr_batches.concat],
        [`open_collection`][daskzarr_batches.open_collection]): each item
        is ``(batch, sources)``, ``sources`` an int64 array of shape
        ``(batch, 2)``: the member each sample comes from and its position
        within that member (paired streams: the last element of the tuple).
        Computed from the sample ids; nothing more is read.

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
            **read_options(
                read,
                client=client,
                timeout=timeout,
                missing=missing,
                on_error=on_error,
                retries=retries,
                io_concurrency=io_concurrency,
                cache=cache,
                reader=reader,
            ).keywords(),
            return_sources=return_sources,
        )
    )


def shuffled_batch_stream(
    array: Any,
    batch_size: int,
    *,
    seed: int | None = 0,
    shuffle_buffer_size: int | str | None = None,
    shuffle_quality: float | None = None,
    drop_remainder: bool = False,
    epoch: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    prefetch: int | None = None,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
    return_sources: bool = False,
) -> BatchStream:
    """Stream minibatches of shuffled samples.

    Every sample appears exactly once per epoch (before ``drop_remainder``).

    Parameters
    ----------
    array : zarr, dask or numpy array, path or URL, Collection, Mixture or ChunkSubset
        Samples along axis 0 (a mixture: the samples it draws per epoch).
    batch_size : int
        Samples per batch.
    seed : int or None, default 0
        Makes the order repeatable: the same ``(seed, epoch)`` gives the same
        batches across runs, processes, prefetch, concurrency and scheduler
        (0, as every ``seed`` of the package: a run repeats unless asked not
        to).  ``None`` draws fresh entropy (see the stream's ``.seed`` to
        repeat it).
    shuffle_buffer_size : int, optional
        ``None``: an exact uniform permutation of all samples; out of core
        that reads the data about ``ceil(dataset bytes / window bytes)``
        times, with windows sized from ``memory_budget``.
        An int ``S``: a shuffle buffer.  The order of chunks is permuted,
        about ``S`` samples (rounded up to whole chunks) are held at a time
        and drawn from at random.  Each chunk is read once and memory stays
        at about ``(prefetch + 1) * S`` samples, but samples only mix with
        those in the same buffer: a larger buffer shuffles better.  The first
        buffer is read as one window (its chunks concurrently).
        A string is a size in bytes (``"256MiB"``, ``"1GB"``; ``MB`` and
        ``GB`` are powers of 1000, ``MiB`` and ``GiB`` of 1024), converted
        to the samples it holds: ``bytes // row bytes`` (at least 1), so a
        buffer of big samples (fields of a few hundred KB) stays within a
        known memory.  ``stream.spec.shuffle_buffer_size`` is that count.
        ``"auto"``: the smallest buffer of whole chunks whose batch mixing
        (``ShuffleQuality.mixing``, computed from the plan, nothing read)
        reaches ``shuffle_quality`` of an exact shuffle's, with ``prefetch +
        1`` buffers within ``memory_budget``; if none does, the largest
        within it and a ``ShuffleQualityWarning`` naming what it reaches
        (``ArgumentValueError`` if not even one chunk fits).
        ``stream.spec.shuffle_buffer_size`` is the size chosen and
        ``stream.summary()`` shows it with its figure.  The first buffer is
        read as one window, its chunks concurrently, so the first batch
        mixes as many chunks as any other.
    shuffle_quality : float, optional
        The target of ``shuffle_buffer_size="auto"``, a fraction of an exact
        shuffle's batch mixing in ``(0, 1]`` (default
        ``plan.quality.DEFAULT_SHUFFLE_QUALITY``); an error with any other
        ``shuffle_buffer_size``.
    drop_remainder : bool, default False
        Drop the short last batch.
    epoch : int, default 0
        Mixed into the seed: each epoch of a seed has its own order.
    memory_budget : int, default 1 GiB
        Exact shuffle and ``shuffle_buffer_size="auto"``: bytes of samples
        the stream may hold at once (for "auto", ``prefetch + 1`` buffers).
        The ``prefetch + 1`` windows alive at once share it, so a window
        holds ``memory_budget / (prefetch + 1)`` bytes of samples and the
        data is decoded about ``dataset bytes / window bytes`` times per
        epoch (``stream.summary().read_amplification`` tells before reading;
        ``prefetch=0``, the exact shuffle's default, gives the fewest reads).
        The decoded chunks in flight are counted in it (1/32 of a window's
        share, ``plan.budget.DECODE_SHARE``, at least one chunk); the
        allocator may keep more (``docs/benchmarks.md``).
    prefetch : int, optional
        Windows computed ahead of the one being consumed.  ``None`` (the
        default): ``DEFAULT_PREFETCH`` (2) with a shuffle buffer; 0 for the
        exact shuffle, whose windows would otherwise split ``memory_budget``
        and multiply the reads.
    return_sources : bool, default False
        As for [`batch_stream`][daskzarr_batches.batch_stream].
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
    """
    return BatchStream(
        StreamSpec(
            (array,),
            batch_size,
            shuffle=shuffle_mode(True, shuffle_buffer_size, shuffle_quality),
            seed=seed,
            shuffle_buffer_size=shuffle_buffer_size,
            shuffle_quality=shuffle_quality,
            drop_remainder=drop_remainder,
            epoch=epoch,
            memory_budget=memory_budget,
            prefetch=prefetch,
            **read_options(
                read,
                client=client,
                timeout=timeout,
                missing=missing,
                on_error=on_error,
                retries=retries,
                io_concurrency=io_concurrency,
                cache=cache,
                reader=reader,
            ).keywords(),
            return_sources=return_sources,
        )
    )


def paired_batch_stream(
    features: Any,
    labels: Any,
    batch_size: int,
    *,
    drop_remainder: bool = False,
    prefetch: int | None = None,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
    return_sources: bool = False,
    label_mixing: bool = False,
) -> BatchStream:
    """Stream ``(features_batch, labels_batch)`` pairs in order.

    Row ``i`` of both arrays of a pair is the same sample, also when the two
    arrays are chunked differently along axis 0.  Parameters are those of
    [`batch_stream`][daskzarr_batches.batch_stream]; ``features`` and ``labels`` must have the same
    length (else [`LengthMismatchError`][daskzarr_batches.LengthMismatchError]).  Chunk subsets
    must be
    ``subset[0], subset[1]`` of one split of the pair (``batch_stream(subset,
    ...)`` of that split streams the pair too).  ``label_mixing=True``: the
    labels are discrete, and ``stats.quality`` reports their mixing (as for
    [`paired_shuffled_batch_stream`][daskzarr_batches.paired_shuffled_batch_stream]).
    """
    return BatchStream(
        StreamSpec(
            (features, labels),
            batch_size,
            shuffle="none",
            drop_remainder=drop_remainder,
            prefetch=prefetch,
            window_bytes=window_bytes,
            **read_options(
                read,
                client=client,
                timeout=timeout,
                missing=missing,
                on_error=on_error,
                retries=retries,
                io_concurrency=io_concurrency,
                cache=cache,
                reader=reader,
            ).keywords(),
            return_sources=return_sources,
            labels="labels" if label_mixing else None,
        )
    )


def paired_shuffled_batch_stream(
    features: Any,
    labels: Any,
    batch_size: int,
    *,
    seed: int | None = 0,
    shuffle_buffer_size: int | str | None = None,
    shuffle_quality: float | None = None,
    drop_remainder: bool = False,
    epoch: int = 0,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    prefetch: int | None = None,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
    return_sources: bool = False,
    label_mixing: bool = False,
) -> BatchStream:
    """Stream shuffled ``(features_batch, labels_batch)`` pairs.

    Features and labels are drawn with the same sample indices, so row ``i``
    of both is the same sample.  Parameters are those of
    [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream], and ``label_mixing``
    (default False):
    ``labels`` are discrete (one class per sample), so ``stats.quality``
    reports how far each batch's label distribution is from the epoch's
    (``label_mixing``, ``label_distance``), and an epoch whose label mixing
    is below ``LABEL_MIXING_WARNING`` (0.85) ends with a
    ``ShuffleQualityWarning``.
    """
    return BatchStream(
        StreamSpec(
            (features, labels),
            batch_size,
            shuffle=shuffle_mode(True, shuffle_buffer_size, shuffle_quality),
            seed=seed,
            shuffle_buffer_size=shuffle_buffer_size,
            shuffle_quality=shuffle_quality,
            drop_remainder=drop_remainder,
            epoch=epoch,
            memory_budget=memory_budget,
            prefetch=prefetch,
            **read_options(
                read,
                client=client,
                timeout=timeout,
                missing=missing,
                on_error=on_error,
                retries=retries,
                io_concurrency=io_concurrency,
                cache=cache,
                reader=reader,
            ).keywords(),
            return_sources=return_sources,
            labels="labels" if label_mixing else None,
        )
    )


# --------------------------------------------------------------------------
# Stream iterators
