"""What an epoch would read and yield, without reading: ``plan_epoch``, ``count_batches``.

Both validate their arguments as the stream constructors do (a
:class:`StreamSpec`, ``streams.spec``) and read no data.  Re-exported by
``streams.constructors``, where they were first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import ArgumentValueError
from ..plan.batching import count_batches as _count
from ..plan.summary import PlanSummary
from ..store.cache import ChunkCache
from ..store.collections import Mixture
from .batch import _summary
from .patch import patch_arguments
from .spec import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PATCH_WINDOW_BYTES,
    DEFAULT_WINDOW_BYTES,
    StreamSpec,
    flag,
    row_source,
    sample_count,
    shuffle_mode,
)

__all__ = ["count_batches", "plan_epoch"]


def count_batches(array: Any, batch_size: int, *, drop_remainder: bool = False) -> int:
    """Number of batches a batch stream over ``array`` yields.

    Parameters
    ----------
    array : zarr, dask or numpy array, path or URL, Collection, Mixture or ChunkSubset
        Samples along axis 0 (a mixture: the samples it draws per epoch).
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
    size = sample_count("batch_size", batch_size)
    drop = flag("drop_remainder", drop_remainder)
    if isinstance(array, Mixture):  # an epoch of draws, not the joined length
        return _count(len(array), size, drop)
    return _count(row_source(array, "array").n_samples, size, drop)


def plan_epoch(
    array: Any,
    batch_size: int,
    *,
    labels: Any = None,
    shuffle: bool = False,
    seed: int | None = 0,
    shuffle_buffer_size: int | str | None = None,
    shuffle_quality: float | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    window_bytes: int | None = None,
    prefetch: int | None = None,
    drop_remainder: bool = False,
    epoch: int = 0,
    input_dims: Mapping[Any, int] | None = None,
    input_overlap: Mapping[Any, int] | None = None,
    target_offset: Mapping[Any, int] | None = None,
    target_dims: Mapping[Any, int] | None = None,
    target_data: Any = None,
    cache: ChunkCache | None = None,
) -> PlanSummary:
    """What an epoch would read and yield, without reading any data.

    Takes the arguments of the stream constructors and returns the plan the
    matching stream would follow (``stream.summary()`` gives the same for a
    stream that exists).  Use it to choose a shuffle buffer or a memory
    budget before a long run.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array, numpy.ndarray, path or URL, Collection or ChunkSubset
        Samples along axis 0 (the features of a paired stream).
    batch_size : int
        Samples per batch.
    labels : array, optional
        Second array of a paired stream.
    shuffle : bool, default False
        ``False``: the plan of [`batch_stream`][daskzarr_batches.batch_stream] (``window_bytes``);
        ``True``: that of [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream]
        (``seed``,
        ``shuffle_buffer_size``, ``memory_budget``).
    seed : int or None, default 0
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream]
        (0, as everywhere; ``None``: a random draw); a sequential plan ignores it.
    shuffle_buffer_size : int or str, optional
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    shuffle_quality : float, optional
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    memory_budget : int, default DEFAULT_MEMORY_BUDGET
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
    window_bytes : int, optional
        ``None``: the stream's default (32 MiB, 16 MiB for patches).
    prefetch : int, optional
        As for the streams; it matters to the exact shuffle, whose windows
        share ``memory_budget`` with the windows prefetched.
    drop_remainder : bool, default False
        As for [`batch_stream`][daskzarr_batches.batch_stream].
    epoch : int, default 0
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream].
        Every argument is validated exactly as the streams validate it
        (whatever the mode uses).
    input_dims : Mapping[Any, int], optional
        The plan of [`patch_stream`][daskzarr_batches.patch_stream] (``array`` is its ``data``; no
        ``labels``): samples are patches, and ``read_amplification`` is how
        often each stored chunk the epoch needs is decoded.
    input_overlap : Mapping[Any, int], optional
        See ``input_dims``.
    target_offset : Mapping[Any, int], optional
        See ``input_dims``.
    target_dims : Mapping[Any, int], optional
        See ``input_dims``.
    target_data : Any, optional
        See ``input_dims``.
    cache : ChunkCache, optional
        The cache the stream would read through: each window's
        ``chunks_cached`` (and the total, ``PlanSummary.chunks_cached``) says
        how many of its chunk reads the cache holds now, looked up without
        reading them (memory, and file names in its directory).  The plan,
        and so the order, is the same with a cache or without.

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
    arrays: tuple[Any, ...] = (array,) if labels is None else (array, labels)
    roles: tuple[str, ...] = ()
    if input_dims is not None:
        if labels is not None:
            raise ArgumentValueError(
                "a patch plan takes no labels: pass several arrays as a tuple or dict in "
                "array, or targets with target_offset"
            )
        patches = patch_arguments(
            array, input_dims, input_overlap=input_overlap, target_offset=target_offset,
            target_dims=target_dims, target_data=target_data,
        )  # fmt: skip
        arrays, roles = patches.sources, patches.roles
    if window_bytes is None:  # the stream's own default
        window_bytes = DEFAULT_WINDOW_BYTES if input_dims is None else DEFAULT_PATCH_WINDOW_BYTES
    mode = shuffle_mode(shuffle, shuffle_buffer_size, shuffle_quality)
    spec = StreamSpec(
        arrays,
        batch_size,
        roles=roles,
        shuffle=mode,
        seed=None if mode == "none" else seed,
        epoch=epoch,
        shuffle_buffer_size=shuffle_buffer_size,
        shuffle_quality=shuffle_quality,
        memory_budget=memory_budget,
        window_bytes=window_bytes,
        prefetch=prefetch,
        drop_remainder=drop_remainder,
        cache=cache,
    )
    return _summary(spec)
