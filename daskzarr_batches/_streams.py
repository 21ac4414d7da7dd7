"""The public stream constructors: validate, plan, and hand over to delivery."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _arguments as check
from ._deliver import BatchStream, ChunkStream, make_runner, resolve_client
from ._errors import ArgumentValueError, LengthMismatchError
from ._plan import EpochPlan, PlanSummary, ShuffleMode, chunk_offsets
from ._plan import count_batches as _count
from ._read import count_tasks
from ._sources import SliceSource, Source, as_source

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "DEFAULT_PREFETCH",
    "DEFAULT_WINDOW_BYTES",
    "batch_stream",
    "chunk_stream",
    "count_batches",
    "paired_batch_stream",
    "paired_shuffled_batch_stream",
    "plan_epoch",
    "shuffled_batch_stream",
]

#: Windows computed ahead of the one being consumed.
DEFAULT_PREFETCH = 2
#: Target decoded bytes of one sequential window (rounded to whole chunks).
DEFAULT_WINDOW_BYTES = 32 * 2**20
#: Memory an exact shuffle may use for windows in flight (bytes).
DEFAULT_MEMORY_BUDGET = 2**30


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
    size = check.positive_int("batch_size", batch_size)
    drop = check.flag("drop_remainder", drop_remainder)
    return _count(as_source(array).n_samples, size, drop)


def chunk_stream(
    array: Any,
    *,
    concurrency: int | None = None,
    ordered: bool = True,
    with_index: bool = False,
    client: Any = None,
    timeout: float | None = None,
) -> ChunkStream:
    """Stream one numpy array per stored chunk, over the whole chunk grid.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array or numpy.ndarray
        Any number of dimensions >= 1.  Numpy arrays are split along axis 0
        into blocks of dask's default chunk size.
    concurrency : int, optional
        Chunks read at once (at most this many in flight).  Defaults to the
        number of CPUs (local) or twice the cluster's worker threads.
    ordered : bool, default True
        ``True``: C order of block index.  ``False``: as reads complete.
    with_index : bool, default False
        Yield ``(block_index, chunk)`` tuples instead of bare arrays.
    client : distributed.Client, optional
        Compute on this cluster; default: dask's active scheduler.
    timeout : float, optional
        Seconds to wait for one chunk before raising
        :class:`WindowTimeoutError`.

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
        ordered=ordered,
        with_index=with_index,
        client=client,
        timeout=timeout,
    )


def build_chunk_stream(
    array: Any,
    *,
    concurrency: object,
    ordered: object,
    with_index: object,
    client: Any,
    timeout: object,
    transform: Callable[[np.ndarray], Any] | None = None,
) -> ChunkStream:
    """Validate and build a :class:`ChunkStream` (shared with ``map_chunks``)."""
    source = as_source(array)
    client = resolve_client(client)
    if concurrency is None:
        concurrency = _default_concurrency(client)
    in_flight = check.positive_int("concurrency", concurrency)
    return ChunkStream(
        source,
        concurrency=in_flight,
        ordered=check.flag("ordered", ordered),
        with_index=check.flag("with_index", with_index),
        runner=make_runner(client, in_flight=in_flight),
        timeout=check.optional_timeout(timeout),
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
        Zarr call, which decodes them concurrently; windows of 16-64 MiB
        measured equally fast, 8 and 128 MiB slower (``docs/benchmarks.md``).
    client : distributed.Client, optional
        Compute windows on this cluster.  Default: a ``distributed`` client if
        dask's configuration points at one, else the local threaded scheduler.
    timeout : float, optional
        Seconds to wait for one window before raising
        :class:`WindowTimeoutError`.

    Returns
    -------
    BatchStream
        Iterator of owned ``numpy.ndarray`` batches with ``len()``,
        ``close()``, context-manager use, ``.stats`` and ``.plan``.
    """
    return _stream(
        (array,),
        batch_size,
        shuffle="none",
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        window_bytes=window_bytes,
        client=client,
        timeout=timeout,
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
        those in the same buffer: a larger buffer shuffles better.
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
    client, timeout
        As for :func:`batch_stream`.
    """
    return _stream(
        (array,),
        batch_size,
        shuffle=_mode(shuffle_buffer_size),
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        drop_remainder=drop_remainder,
        epoch=epoch,
        memory_budget=memory_budget,
        prefetch=prefetch,
        client=client,
        timeout=timeout,
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
) -> BatchStream:
    """Stream ``(features_batch, labels_batch)`` pairs in order.

    Row ``i`` of both arrays of a pair is the same sample, also when the two
    arrays are chunked differently along axis 0.  Parameters are those of
    :func:`batch_stream`; ``features`` and ``labels`` must have the same
    length (else :class:`LengthMismatchError`).
    """
    return _stream(
        (features, labels),
        batch_size,
        shuffle="none",
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        window_bytes=window_bytes,
        client=client,
        timeout=timeout,
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
) -> BatchStream:
    """Stream shuffled ``(features_batch, labels_batch)`` pairs.

    Features and labels are drawn with the same sample indices, so row ``i``
    of both is the same sample.  Parameters are those of
    :func:`shuffled_batch_stream`.
    """
    return _stream(
        (features, labels),
        batch_size,
        shuffle=_mode(shuffle_buffer_size),
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        drop_remainder=drop_remainder,
        epoch=epoch,
        memory_budget=memory_budget,
        prefetch=prefetch,
        client=client,
        timeout=timeout,
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
        As for the stream constructors.  ``prefetch`` matters to the exact
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
    if not shuffle and (shuffle_buffer_size is not None or seed is not None):
        raise ArgumentValueError(
            f"shuffle=False but seed={seed!r} / shuffle_buffer_size={shuffle_buffer_size!r} "
            "were given; pass shuffle=True for a shuffled plan"
        )
    arrays = (array,) if labels is None else (array, labels)
    sources, plan, _, _ = _plan(
        arrays,
        batch_size,
        shuffle=_mode(shuffle_buffer_size) if check.flag("shuffle", shuffle) else "none",
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        epoch=epoch,
        window_bytes=window_bytes,
        memory_budget=memory_budget,
    )
    return plan.summary(task_count=lambda window: count_tasks(sources, window))


def _mode(shuffle_buffer_size: object) -> ShuffleMode:
    return "exact" if shuffle_buffer_size is None else "buffer"


def _stream(
    arrays: tuple[Any, ...],
    batch_size: object,
    *,
    shuffle: ShuffleMode,
    drop_remainder: object,
    prefetch: object,
    client: Any,
    timeout: object,
    seed: object = None,
    shuffle_buffer_size: object = None,
    epoch: object = 0,
    window_bytes: object = DEFAULT_WINDOW_BYTES,
    memory_budget: object = DEFAULT_MEMORY_BUDGET,
) -> BatchStream:
    sources, plan, ahead, seed_value = _plan(
        arrays,
        batch_size,
        shuffle=shuffle,
        drop_remainder=drop_remainder,
        prefetch=prefetch,
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        epoch=epoch,
        window_bytes=window_bytes,
        memory_budget=memory_budget,
    )
    wait = check.optional_timeout(timeout)
    # One task per array and window (SliceSource), each decoding its chunks
    # concurrently inside Zarr: read two windows at a time, in order.
    one_task_each = all(isinstance(source, SliceSource) for source in sources)
    return BatchStream(
        sources,
        plan,
        paired=len(sources) > 1,
        prefetch=ahead,
        runner=make_runner(
            resolve_client(client),
            in_flight=ahead + 1,
            read_workers=2 * len(sources) if one_task_each else None,
        ),
        timeout=wait,
        seed=seed_value,
    )


def _plan(
    arrays: tuple[Any, ...],
    batch_size: object,
    *,
    shuffle: ShuffleMode,
    drop_remainder: object,
    prefetch: object,
    seed: object,
    shuffle_buffer_size: object,
    epoch: object,
    window_bytes: object,
    memory_budget: object,
) -> tuple[list[Source], EpochPlan, int, int | None]:
    """Validate arguments and plan the epoch: (sources, plan, prefetch, seed)."""
    roles = ("array",) if len(arrays) == 1 else ("features", "labels")
    sources = [as_source(array, role) for array, role in zip(arrays, roles, strict=True)]
    _check_lengths(sources, roles)
    size = check.positive_int("batch_size", batch_size)
    drop = check.flag("drop_remainder", drop_remainder)
    ahead = _prefetch(prefetch, shuffle)
    epoch_number = check.non_negative_int("epoch", epoch)
    seed_value = check.seed_value(seed)
    row_bytes = max(sum(source.row_bytes for source in sources), 1)
    if shuffle == "buffer":
        window_rows = check.positive_int("shuffle_buffer_size", shuffle_buffer_size)
    elif shuffle == "exact":
        budget = check.positive_int("memory_budget", memory_budget)
        # prefetch + 1 windows are alive at once, each holding its samples;
        # decoding adds about 1/16 of a window (see _read.read_window).
        window_rows = max(1, budget // (row_bytes * (ahead + 1)))
    else:
        window_rows = max(1, check.positive_int("window_bytes", window_bytes) // row_bytes)
    if shuffle != "none" and seed_value is None:
        seed_value = int(np.random.SeedSequence().entropy)  # type: ignore[arg-type]
    plan = EpochPlan(
        n_samples=sources[0].n_samples,
        offsets=tuple(chunk_offsets(source.chunks[0]) for source in sources),
        batch_size=size,
        drop_remainder=drop,
        shuffle=shuffle,
        window_rows=window_rows,
        seed=seed_value or 0,
        epoch=epoch_number,
        row_bytes=tuple(source.row_bytes for source in sources),
    )
    return sources, plan, ahead, seed_value


def _prefetch(prefetch: object, shuffle: ShuffleMode) -> int:
    """Validate ``prefetch``; ``None`` picks the default of the shuffle mode.

    An exact shuffle spends ``memory_budget`` on windows, and each window in
    flight divides it: measured at a quarter-dataset budget, prefetch 0 reads
    the data 4 times at 0.28x L0, prefetch 2 reads it 12 times at 0.13x L0
    (docs/benchmarks.md).  So the exact shuffle prefetches nothing by default
    and the other modes prefetch ``DEFAULT_PREFETCH`` windows.
    """
    if prefetch is None:
        return 0 if shuffle == "exact" else DEFAULT_PREFETCH
    return check.non_negative_int("prefetch", prefetch)


def _check_lengths(sources: list[Source], roles: tuple[str, ...]) -> None:
    lengths = [source.n_samples for source in sources]
    if len(set(lengths)) > 1:
        described = " but ".join(
            f"{role} has {n} samples (shape {source.shape})"
            for role, n, source in zip(roles, lengths, sources, strict=True)
        )
        raise LengthMismatchError(f"paired arrays must have the same length: {described}")


def _default_concurrency(client: Any) -> int:
    if client is None:
        return os.cpu_count() or 1
    threads = sum(client.nthreads().values())
    return max(2 * threads, 1)
