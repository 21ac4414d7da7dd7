"""The public write jobs: ``map_to_zarr``, ``write_shuffled`` and ``shuffle_order``.

Each checks every argument before an output is created (``writes.outputs``),
finds what a resume may skip (``writes.resume``), and runs one task per
incomplete write unit (``writes.tasks``).  See the package's docstring for the
write units and resume.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import ArgumentTypeError, ArgumentValueError, WindowError
from ..plan.budget import exact_budget
from ..plan.epoch import permutation
from ..store.cache import ChunkCache
from ..store.policy import MissingMode, OnError
from ..store.requests import ReaderFactory
from ..store.sources import _check_dtype
from ..streams.spec import UNSET, ReadOptions, byte_size, non_negative_int, read_options
from .aliasing import check_not_input, lazy_xarray_arrays
from .outputs import (
    _check_shards,
    _normal_grid,
    _open_output,
    _output_dtype,
    _sample_shape,
    output_store,
)
from .resume import _complete_units, _existing, _func_fingerprint, _qualname
from .tasks import (
    WriteStats,
    _chunk_rows,
    _inputs,
    _read_rows,
    _run,
    _Task,
    _units,
    _WriteJob,
)

__all__ = ["DEFAULT_WRITE_BUDGET", "map_to_zarr", "shuffle_order", "write_shuffled"]

#: ``write_shuffled``'s default ``memory_budget``
DEFAULT_WRITE_BUDGET = 256 * 2**20
#: windows of ``write_shuffled`` in flight locally: one, as the exact shuffle (two measured
#: 1.4x slower at a quarter-dataset budget: half-size windows read every chunk twice as often)
_SHUFFLE_WINDOWS = 1
#: ``map_to_zarr``'s units in flight per worker thread on a cluster (issue 40): a unit's
#: input is decoded only while its task runs, so queued units cost no memory, and two per
#: thread left the workers idle between round trips (as ``streams.chunk.CLUSTER_DEPTH``)
_MAP_DEPTH = 8


def map_to_zarr(
    func: Callable[[Any], Any],
    data: Any,
    out: Any,
    *,
    dtype: Any = None,
    sample_shape: Sequence[int] | None = None,
    chunks: int | Sequence[int] | None = None,
    shards: int | Sequence[int] | None = None,
    compressors: Any = "auto",
    overwrite: bool = False,
    resume: bool = True,
    job_id: str | None = None,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    stats: WriteStats | None = None,
) -> zarr.Array:
    """Write ``func`` of every chunk of samples of ``data`` as a new Zarr array.

    ``func`` maps the samples of one output chunk (or shard), shape
    ``(c, *sample)``, to ``(c, *out_sample)``: the same number of rows.  Each
    output chunk (or shard) is computed and written by one task, where the
    input rows are read (on a ``distributed`` worker with a client), so only a
    small report travels back.  Resumable: see the module docstring.

    Parameters
    ----------
    func : callable
        ``func(rows) -> rows``; with a dict (tuple) of arrays as ``data``, it
        receives a dict (tuple) of the same rows of each.  Picklable on a
        cluster.  Its result is cast to ``dtype``.
    data : array, path, URL, Collection or ChunkSubset, or a dict or tuple of them
        A ``zarr.Array``, ``dask.array.Array`` or ``numpy.ndarray`` (or what
        opens as one).  Samples along axis 0 (the arrays of a dict or tuple of equal length).
    out : path, URL or zarr store
        Where the output array is written (the root of ``out``).
    dtype : Any, optional
        The output's dtype and sample shape; either missing, ``func`` is
        called once on the first two samples to find it.
    sample_shape : Sequence[int], optional
        See ``dtype``.
    chunks : int or tuple of int, optional
        The output's chunk shape (an int: rows per chunk, the whole sample
        per chunk).  Default: the input's chunk rows along axis 0 (of the
        first array of a dict or tuple), whole samples.
    shards : int or tuple of int, optional
        Shard shape (an int: rows per shard); each shard is one task.
    compressors : default "auto"
        As for ``zarr.create_array``.
    overwrite : bool, default False
        Start over: an existing output is replaced.
    resume : bool, default True
        Complete an existing output written by the same job (same fingerprint):
        only chunks not complete are computed.  ``False``: an existing output is
        an error.
    job_id : str, optional
        Names the job in the fingerprint (default: ``func``'s qualified name),
        and ``func``'s version: with a ``job_id``, ``func``'s own fingerprint
        (its code, constants, defaults, closure and globals) is not checked on a
        resume, so change it whenever ``func`` changes.  Without one, a resume
        with a changed ``func`` is refused (and one whose ``func`` cannot be
        fingerprinted, holding a lock say, warns and cannot resume).
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        As for [`map_chunks`][daskzarr_batches.map_chunks]; the read policy applies to the input.
        With
        ``on_error="skip"`` a chunk that touches an undecodable input chunk is
        left unwritten (a later run writes it).
    cache : ChunkCache, optional
        Decoded input chunks served from (and kept in) this cache, as for
        the streams (on a cluster, as cluster futures).
    progress : bool, default False
        A ``tqdm`` progress bar of the tasks.
    storage_options : dict, optional
        For an ``out`` URL (``s3://``, ``gs://``, ...): the options
        [`open_array`][daskzarr_batches.open_array] takes (credentials, endpoint), translated for
        the
        backend as when reading.
    backend : {"auto", "obstore", "fsspec"}, default "auto"
        The store an ``out`` URL is written through, as
        [`open_array`][daskzarr_batches.open_array]'s.
    stats : WriteStats, optional
        Filled with what this call did.

    Returns
    -------
    zarr.Array
        The output array.

    Raises
    ------
    ArgumentValueError
        ``out`` is where an input array is stored, the group holding one or
        a node inside one (however either is spelled: relative or absolute,
        a symlink, a URL through either backend, a store object, a
        collection's member, the Zarr array a dask or xarray array reads);
        the message names both, and nothing is created or deleted.
    ResumeMismatchError
        ``out`` holds an array of another job, ``func``, input (name, shape,
        dtype or contents), shape, dtype or grid.
    WindowError
        A task failed; ``func``'s exception (or the wrong shape it returned)
        chained, the message naming the output rows.

    Examples
    --------
    >>> import numpy as np, zarr, daskzarr_batches as dzb
    >>> x = zarr.create_array(zarr.storage.MemoryStore(), shape=(6, 2), chunks=(3, 2), dtype="f4")
    >>> x[:] = np.arange(12).reshape(6, 2)
    >>> y = dzb.map_to_zarr(lambda rows: rows * 2, x, zarr.storage.MemoryStore())
    >>> y[:, 0].tolist(), y.chunks
    ([0.0, 4.0, 8.0, 12.0, 16.0, 20.0], (3, 2))
    """
    if not callable(func):
        raise ArgumentTypeError(f"func must be callable, got {func!r}")
    stats = WriteStats() if stats is None else stats
    read = read_options(
        read, client=client, timeout=timeout, missing=missing, on_error=on_error,
        retries=retries, io_concurrency=io_concurrency, cache=cache, reader=reader,
    )  # fmt: skip
    lazy = list(lazy_xarray_arrays(data))  # before _inputs loads them
    inputs = _inputs(data)
    rows = inputs.rows
    dtype = None if dtype is None else _output_dtype(dtype)
    sample_shape = None if sample_shape is None else _sample_shape(sample_shape)
    given, out = out, output_store(out, storage_options, backend)
    check_not_input("map_to_zarr", given, out, [None], inputs.described(), lazy)
    existing = None if overwrite else _existing(out, None)
    if existing is not None:  # a resume: its dtype and sample shape, func not called
        dtype = existing.dtype if dtype is None else dtype
        sample_shape = existing.shape[1:] if sample_shape is None else sample_shape
    readers = read.policy.readers  # one hook for the probe and the tasks: one factory call
    if dtype is None or sample_shape is None:
        probe = _read_rows(inputs, min(rows, 2), read, readers)
        try:
            result = np.asarray(func(inputs.pack(probe)))
        except Exception as exc:
            raise WindowError(
                f"map_to_zarr({_qualname(func)}): func raised {type(exc).__name__}: {exc} on "
                f"samples 0:{min(rows, 2)}, the call that finds the output's dtype and sample "
                "shape (pass dtype= and sample_shape= to skip it)"
            ) from exc
        stats.func_calls += 1
        if result.ndim == 0 or result.shape[0] != min(rows, 2):
            raise ArgumentValueError(
                f"func returned shape {result.shape} for samples 0:{min(rows, 2)}: it must return "
                "the same number of rows as it is given"
            )
        if dtype is None:
            _check_dtype(f"func's result for samples 0:{min(rows, 2)}", result.dtype)
            dtype = result.dtype
        sample_shape = result.shape[1:] if sample_shape is None else sample_shape
    shape = (rows, *(int(n) for n in sample_shape))
    first = inputs.sources[0]
    grid = _normal_grid("chunks", chunks, shape) or (_chunk_rows(first), *shape[1:])
    grid = tuple(max(1, g) for g in grid)
    shard = _normal_grid("shards", shards, shape)
    if shard is not None:
        _check_shards(shard, grid, shards)
    fingerprint = {"job": job_id or _qualname(func), "kind": "map_to_zarr",
                   "inputs": inputs.identity(), "contents": inputs.contents()}  # fmt: skip
    if job_id is None:  # an explicit job_id names func's version instead
        fingerprint["func"] = _func_fingerprint(func, existing is None)
    array = _open_output(out, None, shape, np.dtype(dtype), grid, shard, compressors,
                         fingerprint, overwrite, resume)  # fmt: skip
    units = _units(rows, (shard or grid)[0])
    done = set() if overwrite else _complete_units([array], units, read.io_concurrency or 4)
    stats.units, stats.units_skipped = len(units), len(done)
    tasks = [
        _Task(n, range(a, b), np.array([[a, b]], dtype=np.int64))
        for n, (a, b) in enumerate(units)
        if n not in done
    ]
    in_flight = _in_flight(read, _MAP_DEPTH)
    _run(tasks, inputs, _WriteJob(func, inputs, (array,)), read, in_flight, stats, progress,
         None, f"map_to_zarr({_qualname(func)})", readers)  # fmt: skip
    return array


def _in_flight(read: ReadOptions, per_thread: int = 2) -> int:
    """Units in flight: on a cluster ``per_thread`` per worker thread, else one per CPU."""
    if read.client is not None:
        return max(per_thread * sum(read.client.nthreads().values()), 1)
    return read.io_concurrency or (os.cpu_count() or 1)


def write_shuffled(
    data: Any,
    out: Any,
    *,
    seed: int = 0,
    memory_budget: int | str = DEFAULT_WRITE_BUDGET,
    chunks: int | None = None,
    shards: int | None = None,
    compressors: Any = "auto",
    overwrite: bool = False,
    resume: bool = True,
    job_id: str | None = None,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    backend: str = "auto",
    stats: WriteStats | None = None,
) -> Any:
    """Write an exact seeded permutation of ``data``'s samples as new Zarr array(s).

    Output row ``i`` is input sample ``order[i]``, ``order`` the permutation
    of ``seed`` ([`shuffle_order`][daskzarr_batches.shuffle_order]); the arrays of a dict or tuple
    are
    permuted together, rows aligned.  Out of core: the permutation is cut
    into windows of whole output chunks (or shards) that fit
    ``memory_budget`` (as for the exact shuffle, whose read amplification
    it has), each read once and written by one task, so every output chunk
    is written exactly once.  Resumable as [`map_to_zarr`][daskzarr_batches.map_to_zarr]; training
    then
    reads the output with a sequential stream (read amplification 1).

    Parameters
    ----------
    data : array, path or URL, Collection, or a dict or tuple of them
        As for [`map_to_zarr`][daskzarr_batches.map_to_zarr].
    out : path, URL or zarr store
        A single array is written at the root of ``out``; a dict's arrays
        under their names, a tuple's under ``"0"``, ``"1"``, ...
    seed : int, default 0
    memory_budget : int or str, default 256 MiB
        Bytes of samples and decoded chunks of the windows in flight (one
        locally; on a cluster, as many as its threads, sharing it).  A
        window holds at least one output chunk (or shard).
    chunks : int, optional
        Rows per output chunk / shard (whole samples).  Default: the first
        array's chunk rows.
    shards : int, optional
        See ``chunks``.
    compressors : Any, default "auto"
        As for [`map_to_zarr`][daskzarr_batches.map_to_zarr] (``out`` may be a URL).
    overwrite : bool, default False
        See ``compressors``.
    resume : bool, default True
        See ``compressors``.
    job_id : str, optional
        See ``compressors``.
    progress : bool, default False
        See ``compressors``.
    stats : WriteStats, optional
        See ``compressors``.
    storage_options : dict[str, Any], optional
        See ``compressors``.
    backend : str, default "auto"
        See ``compressors``.
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        As for [`map_to_zarr`][daskzarr_batches.map_to_zarr] (``job_id`` defaults to
        ``"write_shuffled"``).
    cache : ChunkCache, optional
        Decoded input chunks served from (and kept in) this cache.  Every
        window of a shuffle touches nearly every input chunk, so with a cache
        that holds the input each stored chunk is read from the store once
        over the whole job (read amplification 1) instead of once per window.

    Returns
    -------
    zarr.Array, dict or tuple of zarr.Array
        Shaped as ``data``.

    Raises
    ------
    ArgumentValueError
        An output array is where an input array is stored, the group holding
        one or a node inside one, as for
        [`map_to_zarr`][daskzarr_batches.map_to_zarr]; nothing is created or
        deleted.

    Examples
    --------
    >>> import numpy as np, zarr, daskzarr_batches as dzb
    >>> y = dzb.write_shuffled(np.arange(6), zarr.storage.MemoryStore(), seed=1)
    >>> sorted(y[:].tolist()), y[:].tolist() == dzb.shuffle_order(6, 1).tolist()
    ([0, 1, 2, 3, 4, 5], True)
    """
    stats = WriteStats() if stats is None else stats
    read = read_options(
        read, client=client, timeout=timeout, missing=missing, on_error=on_error,
        retries=retries, io_concurrency=io_concurrency, cache=cache, reader=reader,
    )  # fmt: skip
    lazy = list(lazy_xarray_arrays(data))  # before _inputs loads them
    inputs = _inputs(data)
    rows = inputs.rows
    seed = non_negative_int("seed", seed)
    budget = byte_size("memory_budget", memory_budget)
    first = inputs.sources[0]
    step = _rows_arg("chunks", chunks) or _chunk_rows(first)
    shard_rows = _rows_arg("shards", shards)
    if shard_rows is not None and shard_rows % step:
        raise ArgumentValueError(
            f"shards={shards!r} is not a multiple of the {step} rows of an output chunk "
            f"(chunks={chunks!r}{', the input chunk rows' if chunks is None else ''}); a shard "
            "holds whole chunks: pass shards that are a multiple of chunks"
        )
    fingerprint = {"job": job_id or "write_shuffled", "kind": "write_shuffled",
                   "seed": int(seed), "inputs": inputs.identity(),
                   "contents": inputs.contents()}  # fmt: skip
    given, out = out, output_store(out, storage_options, backend)
    names = [None] if inputs.kind == "single" else list(inputs.names)
    check_not_input("write_shuffled", given, out, names, inputs.described(), lazy)
    outs = []
    for name, source in zip(inputs.names, inputs.sources, strict=True):
        sample = tuple(source.shape[1:])
        outs.append(
            _open_output(
                out, None if inputs.kind == "single" else name, tuple(source.shape),
                source.dtype, (step, *sample), None if shard_rows is None else
                (shard_rows, *sample), compressors, fingerprint, overwrite, resume,
            )
        )  # fmt: skip
    unit_rows = shard_rows or step
    units = _units(rows, unit_rows)
    done = set() if overwrite else _complete_units(outs, units, read.io_concurrency or 4)
    stats.units, stats.units_skipped = len(units), len(done)
    in_flight = _SHUFFLE_WINDOWS if read.client is None else _in_flight(read)
    row_bytes = sum(s.dtype.itemsize * math.prod(s.shape[1:]) for s in inputs.sources)
    plan = exact_budget(budget, max(row_bytes, 1), in_flight - 1)
    per_window = max(1, plan.window_rows // unit_rows)
    order = shuffle_order(rows, int(seed))
    tasks = []
    for number, first_unit in enumerate(range(0, len(units), per_window)):
        todo = [u for u in range(first_unit, min(first_unit + per_window, len(units)))
                if u not in done]  # fmt: skip
        if not todo:
            continue
        ranges = np.array([units[u] for u in todo], dtype=np.int64)
        samples = np.concatenate([order[a:b] for a, b in ranges.tolist()])
        tasks.append(_Task(number, samples, ranges))
    # the write reuses the window's decode allowance (its reads are done by then) for the
    # chunk buffers Zarr encodes from
    write_rows = max(unit_rows, plan.decode_bytes // max(row_bytes, 1) // unit_rows * unit_rows)
    job = _WriteJob(None, inputs, tuple(outs), write_rows)
    _run(tasks, inputs, job, read, in_flight, stats, progress, plan.decode_bytes,
         "write_shuffled")  # fmt: skip
    if inputs.kind == "single":
        return outs[0]
    if inputs.kind == "dict":
        return dict(zip(inputs.names, outs, strict=True))
    return tuple(outs)


def shuffle_order(rows: int, seed: int = 0) -> np.ndarray:
    """The permutation ``write_shuffled(..., seed=seed)`` writes: output row i is sample [i].

    Parameters
    ----------
    rows : int
        Samples of the array written.
    seed : int, default 0
        The seed given to ``write_shuffled`` (whose default is 0 too).

    Returns
    -------
    numpy.ndarray
        A permutation of ``range(rows)``.

    Raises
    ------
    ArgumentTypeError, ArgumentValueError
        ``rows`` or ``seed`` is not a non-negative integer.
    """
    rows = non_negative_int("rows", rows)
    seed = non_negative_int("seed", seed)
    return permutation(np.random.default_rng(np.random.SeedSequence(seed)), rows)


def _rows_arg(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise ArgumentValueError(f"{name} must be a positive int (rows), got {value!r}")
    return int(value)
