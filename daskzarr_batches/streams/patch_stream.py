r"""The patch stream constructor: ``patch_stream``, batches of patches cut from arrays.

Its arguments become ``PatchSource``\ s and a layout (``streams.patch``) and one
:class:`StreamSpec`, read by a :class:`BatchStream` like any batch stream.
Re-exported by ``streams.constructors``, where it was first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..store.cache import ChunkCache
from ..store.policy import MissingMode, OnError
from ..store.requests import ReaderFactory
from .batch import BatchStream
from .patch import patch_arguments
from .spec import (
    DEFAULT_MEMORY_BUDGET,
    DEFAULT_PATCH_WINDOW_BYTES,
    DEFAULT_PREFETCH,
    UNSET,
    ReadOptions,
    StreamSpec,
    read_options,
    shuffle_mode,
)

__all__ = ["patch_stream"]


def patch_stream(
    data: Any,
    input_dims: Mapping[Any, int],
    batch_size: int,
    *,
    input_overlap: Mapping[Any, int] | None = None,
    target_offset: Mapping[Any, int] | None = None,
    target_dims: Mapping[Any, int] | None = None,
    target_data: Any = None,
    shuffle: bool = False,
    seed: int | None = 0,
    epoch: int = 0,
    shuffle_buffer_size: int | str | None = None,
    shuffle_quality: float | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    window_bytes: int = DEFAULT_PATCH_WINDOW_BYTES,
    prefetch: int | None = None,
    drop_remainder: bool = False,
    return_origins: bool = False,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
) -> BatchStream:
    """Stream minibatches of N-D patches: spatial tiles, time windows, forecast pairs.

    A sample is a *patch*: the window of ``data`` of size ``input_dims[dim]``
    along each dim it names, whole along the others, at an *origin* every
    ``input_dims[dim] - input_overlap[dim]`` positions (patches that would
    run past the end are dropped).  The names and meanings are xbatcher's
    ``BatchGenerator``'s.  Sequential order is the C order of the origins;
    each stored chunk is decoded once per window however many patches it
    feeds (a patch that straddles chunks reads its neighbours in the same
    window), and ``stream.summary().read_amplification`` says how often each
    is decoded per epoch (1.00 when patches tile the chunks).

    Parameters
    ----------
    data : array, path, xarray.DataArray, tuple or dict of arrays, xarray.Dataset or ChunkSubset
        What the other streams accept.  Several arrays (a tuple, a dict of
        named arrays, a Dataset's data variables) are patched together: they
        share the patched dims (same length along each), and a batch is a
        tuple or dict of patch arrays.  A [`chunk_split`][daskzarr_batches.chunk_split] subset keeps
        every patch (and target) inside its usable positions.
    input_dims : dict
        Patch size per dim: a dim name (xarray's dims, a Zarr array's
        ``dimension_names``) or an axis number.  Dims not named are taken
        whole.
    batch_size : int
        Patches per batch; a batch is an array of shape
        ``(batch_size, *patch_shape)`` the caller owns.
    input_overlap : dict, optional
        Overlap per patched dim (``0 <= overlap < size``); default 0.
    target_offset : dict, optional
        Forecast targets: each item becomes a pair ``(x, y)`` where ``y`` is
        the window at ``x``'s origin shifted by ``target_offset[dim]`` along
        each dim it names (each must be patched); origins whose target runs
        off the array are dropped.  ``{"time": 1}`` with
        ``input_dims={"time": 1}`` gives (field at t, field at t + 1).
    target_dims : dict, optional
        The target's size along the shifted dims (default: the input's); its
        size elsewhere is the input's.
    target_data : optional
        Where targets are cut from (default ``data``), with the same patched
        dims; arrays shared with ``data`` are read once for both.
    shuffle : bool, default False
        Shuffle the patches: exactly (``shuffle_buffer_size=None``, windows
        sized by ``memory_budget``) or through a buffer of
        ``shuffle_buffer_size`` patches, rounded up to whole units (a unit:
        the patches whose origins share a stored chunk along a patched dim).
    seed : int or None, default 0
        The shuffle's entropy; ``None`` draws fresh entropy (``stream.seed``).
        Ignored without ``shuffle``.
    epoch : int, default 0
        As for [`shuffled_batch_stream`][daskzarr_batches.shuffled_batch_stream] and
        [`batch_stream`][daskzarr_batches.batch_stream], counted
        in patches and patch bytes.
    shuffle_buffer_size : int | str, optional
        See ``epoch``.
    shuffle_quality : float, optional
        See ``epoch``.
    memory_budget : int, default 1073741824
        See ``epoch``.
    prefetch : int, optional
        See ``epoch``.
    drop_remainder : bool, default False
        See ``epoch``.
    window_bytes : int, default 16 MiB
        Target bytes of patches of one sequential window (whole units; a unit
        may hold up to four windows' worth).  Half the row streams' default:
        a window's output and boxes then stay below the C allocator's limit
        for reusing freed memory (measured: about 18,000 page faults per epoch
        of 64 fields at 32 MiB, 30-2,300 at 16 MiB).
    return_origins : bool, default False
        Each item gets the patches' origins as its last element: an int64
        array of shape ``(batch, ndim)`` (the first array's axes), or, for
        xarray data, a dict of it (``"index"``) and the coordinate values of
        each patched dim at the origins.
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        As for [`batch_stream`][daskzarr_batches.batch_stream] (with ``on_error="skip"`` the patches
        touching a chunk that does not decode leave the epoch).

    Returns
    -------
    BatchStream
        Batches of patches, as an array, ``(x, y)``, a tuple or dict, with
        origins last if asked; ``len()``, ``.stats``, ``.summary()``.

    Examples
    --------
    >>> import numpy as np
    >>> field = np.arange(4 * 6 * 8, dtype="f4").reshape(4, 6, 8)
    >>> stream = patch_stream(field, {0: 1, 1: 3, 2: 4}, 8)
    >>> len(stream), next(stream).shape  # 4 x 2 x 2 patches
    (2, (8, 1, 3, 4))
    >>> pairs = patch_stream(field, {0: 2}, 2, target_offset={0: 1}, target_dims={0: 1})
    >>> x, y = next(pairs)
    >>> x.shape, y.shape, bool((y[:, 0] == x[:, 1]).all())
    ((2, 2, 6, 8), (2, 1, 6, 8), True)
    """
    args = patch_arguments(
        data, input_dims, input_overlap=input_overlap, target_offset=target_offset,
        target_dims=target_dims, target_data=target_data, return_origins=return_origins,
    )  # fmt: skip
    mode = shuffle_mode(shuffle, shuffle_buffer_size, shuffle_quality)
    return BatchStream(
        StreamSpec(
            args.sources,
            batch_size,
            shuffle=mode,
            seed=None if mode == "none" else seed,
            epoch=epoch,
            shuffle_buffer_size=shuffle_buffer_size,
            shuffle_quality=shuffle_quality,
            memory_budget=memory_budget,
            window_bytes=window_bytes,
            prefetch=prefetch if prefetch is not None or mode != "none" else DEFAULT_PREFETCH,
            drop_remainder=drop_remainder,
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
            roles=args.roles,
            layout=args.layout,
        )
    )
