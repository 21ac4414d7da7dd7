"""Per-chunk jobs: map a function over every stored chunk, reduce the results.

Both run on the chunk-stream machinery (:class:`ChunkStream`): the function is
applied inside the task that reads the chunk, so with a ``distributed`` client
it runs on the worker that decoded the chunk and only its (small) result
travels to the client.

Reduction is a *streaming pairwise tree* (:class:`PairwiseFold`)::

    r0   r1   r2   r3   r4   r5   r6        results, in chunk (C) order
     \\   /     \\   /     \\   /
     c(0,1)    c(2,3)    c(4,5)    r6      combined as soon as both halves exist
         \\       /
         c(0..3)                            ...

The shape of the tree depends only on the number of chunks, so the result is
bit-for-bit the same on every scheduler, concurrency and run; it equals the
left fold ``combine(combine(r0, r1), r2) ...`` whenever ``combine`` is
associative (up to rounding for floats, where the tree is also the more
accurate order).  At most ``log2(chunks)`` partial results are held.  Locally
the tree is folded on the caller as results arrive; on a ``distributed`` client
the same tree runs on the workers (``streams.chunk_jobs``: one fused task per
chunk, the combines as tasks, leaves sent in batches), and only the result
travels to the caller.

:class:`Moments` is a mergeable per-feature count / mean / variance (Chan et
al.'s parallel update of Welford's algorithm) for use with
:func:`reduce_chunks`; :func:`feature_moments` applies it to a whole array,
also when the array is chunked along its feature axes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from .errors import ArgumentTypeError, ArgumentValueError, renamed_keywords
from .store.cache import ChunkCache
from .store.policy import MissingMode, OnError
from .store.requests import ReaderFactory
from .streams.chunk import ChunkStream, build_chunk_stream
from .streams.chunk_jobs import PairwiseFold as _PairwiseFold
from .streams.chunk_jobs import reduce_on_cluster
from .streams.spec import UNSET, ChunkSpec, ReadOptions, read_options

__all__ = ["Moments", "feature_moments", "map_chunks", "reduce_chunks"]

R = TypeVar("R")


class _NoInitial:
    def __repr__(self) -> str:
        return "<no initial value>"


NO_INITIAL: Any = _NoInitial()


@renamed_keywords(concurrency="io_concurrency")
def map_chunks(
    func: Callable[[np.ndarray], Any],
    array: Any,
    *,
    client: Any = UNSET.client,
    ordered: bool = True,
    with_index: bool = False,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
) -> ChunkStream:
    """Stream ``func(chunk)`` for every stored chunk of ``array``.

    ``func`` runs where the chunk is read: on the local threads, or on a
    ``distributed`` worker, so only its result travels to the caller.

    Parameters
    ----------
    func : callable
        ``func(chunk) -> result``, called once per stored chunk with a numpy
        array the function may modify.  Edge chunks are cropped to the array.
        On a cluster it must be picklable (module-level functions, lambdas and
        ``functools.partial`` objects are, through cloudpickle).
    array : zarr.Array, dask.array.Array, numpy.ndarray, path or URL, or ChunkSubset
        Any number of dimensions >= 1.
    client : distributed.Client, optional
        Run on this cluster.  Default: the active client if dask's
        configuration points at one, else local threads.
    ordered : bool, default True
        ``True``: results in C order of the chunk grid.  ``False``: as they
        complete.
    io_concurrency : int, optional
        Reads in flight, as for [`chunk_stream`][daskzarr_batches.chunk_stream] (a sharded array
        is read
        one shard per read, ``func`` applied to each inner chunk); locally
        at most one ``func`` call per CPU runs at once, whatever the value.
        Default: one per CPU on a local store, 16 on others (fewer for large
        chunks or shards), twice the cluster's worker threads on a cluster
        (there, without it, ``CLUSTER_DEPTH`` (8) units per worker thread are kept
        in flight, sent half of them per graph).
        Its former name ``concurrency=`` (here, in ``reduce_chunks`` and
        ``feature_moments``) still works, with a ``DeprecationWarning``.
    with_index : bool, default False
        Yield ``(block_index, result)`` tuples.
    cache : ChunkCache, optional
        Decoded chunks served from (and kept in) this cache, as for
        [`chunk_stream`][daskzarr_batches.chunk_stream]: a second pass over the array reads it.
    timeout : float, optional
        Seconds to wait for one result before raising
        [`WindowTimeoutError`][daskzarr_batches.WindowTimeoutError].
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.
        The read policy, as for [`batch_stream`][daskzarr_batches.batch_stream]: chunks absent
        from the
        store, chunks that do not decode (with ``"skip"``, ``func`` does not
        see them), retries after transient faults.

    Returns
    -------
    ChunkStream
        Iterator of results with ``len()`` (number of stored chunks),
        ``close()``, context-manager use and ``.stats``.

    Raises
    ------
    WindowError
        From ``next()``, if ``func`` raised (its exception chained as
        ``__cause__``, the message naming the chunk) or the cluster gave up.

    Examples
    --------
    >>> import numpy as np, daskzarr_batches as dzb
    >>> x = np.arange(12.0).reshape(6, 2)
    >>> [float(m) for m in dzb.map_chunks(np.max, x)]
    [11.0]
    """
    if not callable(func):
        raise ArgumentTypeError(f"func must be callable, got {func!r}")
    options = read_options(
        read, client=client, timeout=timeout, missing=missing, on_error=on_error,
        retries=retries, io_concurrency=io_concurrency,
        cache=cache, reader=reader,
    )  # fmt: skip
    return build_chunk_stream(ChunkSpec(array, ordered, with_index, options), transform=func)


@renamed_keywords(concurrency="io_concurrency")
def reduce_chunks(
    func: Callable[[np.ndarray], R],
    combine: Callable[[R, R], R],
    array: Any,
    *,
    initial: Any = NO_INITIAL,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
) -> R:
    """Reduce ``func(chunk)`` over every stored chunk with ``combine``.

    ``func`` runs per chunk where the chunk is read (see
    [`map_chunks`][daskzarr_batches.map_chunks]);
    ``combine`` runs in a pairwise tree over the results in chunk order (on
    the caller, or on a cluster's workers, where only the result travels; see
    the module docstring), so the result is deterministic:
    the same for every scheduler and concurrency, and equal to a left fold
    whenever ``combine`` is associative.  It need not be commutative.

    Parameters
    ----------
    func : callable
        ``func(chunk) -> partial result``.
    combine : callable
        ``combine(left, right) -> partial result``, where ``left`` covers the
        chunks before ``right``'s.
    array : zarr.Array, dask.array.Array, numpy.ndarray, path or URL, or ChunkSubset
    initial : optional
        Placed before the first result, as in `functools.reduce`; it is
        also the result for an array without chunks.
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.

    Returns
    -------
    object
        The combined result.

    Raises
    ------
    ArgumentValueError
        ``array`` has no chunks (a zero-length axis) and no ``initial`` was
        given.
    WindowError, WindowTimeoutError
        As for [`map_chunks`][daskzarr_batches.map_chunks].

    Examples
    --------
    >>> import operator, numpy as np, daskzarr_batches as dzb
    >>> float(dzb.reduce_chunks(np.sum, operator.add, np.ones((10, 3))))
    30.0
    >>> edges = np.linspace(0, 1, 5)
    >>> def hist(chunk):
    ...     return np.histogram(chunk, bins=edges)[0]
    >>> dzb.reduce_chunks(hist, operator.add, np.full((8, 2), 0.3)).tolist()
    [0, 16, 0, 0]
    """
    if not callable(combine):
        raise ArgumentTypeError(f"combine must be callable, got {combine!r}")
    fold: _PairwiseFold[R] = _PairwiseFold(combine)
    with map_chunks(
        func,
        array,
        client=client,
        timeout=timeout,
        missing=missing,
        on_error=on_error,
        retries=retries,
        io_concurrency=io_concurrency,
        cache=cache,
        reader=reader,
        read=read,
    ) as results:
        name = results.source.name
        # on a cluster: combined on the workers in the same tree, only the result sent here
        reduced = reduce_on_cluster(results, combine)
        if reduced is not None:
            for value in reduced.values():
                fold.push(value)
        else:
            for result in results:
                fold.push(result)
    if fold.empty:
        if initial is NO_INITIAL:
            raise ArgumentValueError(
                f"array {name} has no chunks to reduce; pass initial= to reduce an empty array"
            )
        return initial
    value = fold.result()
    return value if initial is NO_INITIAL else combine(initial, value)


@dataclass(frozen=True)
class Moments:
    """Count, mean and sum of squared deviations of samples, per feature.

    Mergeable exactly: [`merge`][daskzarr_batches.Moments.merge] is Chan, Golub and LeVeque's
    pairwise
    update (the parallel form of Welford's algorithm), so partial moments of
    chunks computed anywhere combine into those of the whole array without a
    second pass and without the cancellation of ``E[x**2] - E[x]**2``.
    Statistics are accumulated in float64.  Complex data have a complex128
    mean and a real ``m2``, the sum of ``|x - mean|**2``, so ``variance()``
    is real and equals ``numpy.var``.

    Attributes
    ----------
    count : int
        Samples (rows of axis 0) seen.
    mean : numpy.ndarray
        Per-feature mean, shape ``array.shape[1:]``; float64, or complex128
        for complex data.
    m2 : numpy.ndarray
        Per-feature sum of squared deviations from the mean (of their squared
        moduli for complex data), float64.

    Examples
    --------
    >>> import numpy as np, daskzarr_batches as dzb
    >>> x = np.arange(20.0).reshape(10, 2)
    >>> m = dzb.reduce_chunks(dzb.Moments.from_chunk, dzb.Moments.merge, x)
    >>> m.mean.tolist(), m.variance().tolist()
    ([9.0, 10.0], [33.0, 33.0])
    """

    count: int
    mean: np.ndarray
    m2: np.ndarray

    @classmethod
    def from_chunk(cls, chunk: np.ndarray) -> Moments:
        """Moments of the rows of ``chunk`` (reduced over axis 0)."""
        data = np.asarray(chunk)
        if data.ndim == 0:
            raise ArgumentValueError(
                "Moments.from_chunk needs at least one dimension, got a 0-d array"
            )
        count = data.shape[0]
        mean_dtype = _mean_dtype(data.dtype)
        if count == 0:
            zeros = np.zeros(data.shape[1:], dtype=np.float64)
            return cls(0, zeros.astype(mean_dtype), zeros)
        mean = data.mean(axis=0, dtype=mean_dtype)
        m2 = _squared_modulus(data - mean).sum(axis=0, dtype=np.float64)
        return cls(count, mean, m2)

    def merge(self, other: Moments) -> Moments:
        """Moments of the samples of ``self`` followed by those of ``other``."""
        if self.mean.shape != other.mean.shape:
            raise ArgumentValueError(
                f"cannot merge moments of {self.mean.shape}-shaped samples with moments "
                f"of {other.mean.shape}-shaped samples"
            )
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + _squared_modulus(delta) * (self.count * other.count / count)
        return Moments(count, mean, m2)

    def variance(self, ddof: int = 0) -> np.ndarray:
        """Per-feature variance, ``m2 / (count - ddof)`` (NaN when undefined)."""
        if self.count <= ddof:
            return np.full_like(self.m2, np.nan)
        return self.m2 / np.float64(self.count - ddof)

    def std(self, ddof: int = 0) -> np.ndarray:
        """Per-feature standard deviation."""
        return np.sqrt(self.variance(ddof))


@renamed_keywords(concurrency="io_concurrency")
def feature_moments(
    array: Any,
    *,
    client: Any = UNSET.client,
    timeout: float | None = UNSET.timeout,
    missing: MissingMode = UNSET.missing,
    on_error: OnError = UNSET.on_error,
    retries: int = UNSET.retries,
    io_concurrency: int | None = UNSET.io_concurrency,
    cache: ChunkCache | None = UNSET.cache,
    reader: ReaderFactory | None = UNSET.reader,
    read: ReadOptions | None = None,
) -> Moments:
    """Per-feature count, mean and variance of ``array``'s samples, in one pass.

    Each chunk's [`Moments`][daskzarr_batches.Moments] is computed where the chunk is read; the
    client merges them (pairwise, deterministically) per block of features
    and joins the feature blocks, so arrays chunked along feature axes work
    too.

    Parameters
    ----------
    array : zarr.Array, dask.array.Array, numpy.ndarray, path or URL, or ChunkSubset
        Samples along axis 0, features along the other axes.
    read : ReadOptions, optional
        The read options as one value, to share one set across streams; or
        the flat read keywords ``client``, ``timeout``, ``missing``,
        ``on_error``, ``retries``, ``io_concurrency``, ``cache`` and ``reader``, each a
        field of [`ReadOptions`][daskzarr_batches.ReadOptions] (documented
        there once, with its default).  A flat one given beside ``read``
        must agree with it.

    Returns
    -------
    Moments
        ``.mean`` and ``.variance()`` have shape ``array.shape[1:]``.
        ``.count`` is ``array.shape[0]``, also when a feature axis has length
        0 (then the statistics are empty arrays).

    Examples
    --------
    >>> import numpy as np, daskzarr_batches as dzb
    >>> dzb.feature_moments(np.arange(8.0).reshape(4, 2)).mean.tolist()
    [3.0, 4.0]
    """
    folds: dict[tuple[int, ...], _PairwiseFold[Moments]] = {}
    with map_chunks(
        Moments.from_chunk,
        array,
        client=client,
        timeout=timeout,
        with_index=True,
        missing=missing,
        on_error=on_error,
        retries=retries,
        io_concurrency=io_concurrency,
        cache=cache,
        reader=reader,
        read=read,
    ) as results:
        source = results.source
        shape, dtype = source.shape, source.dtype
        # a collection's members may tile the features differently: fold per member
        members = source.member_sources

        def fold_of(block: tuple[int, ...]) -> tuple[int, ...]:
            member, _ = source.member_block(block)
            return (member, *block[1:])

        # on a cluster: each fold's tree run on the workers, only its result sent here
        reduced = reduce_on_cluster(results, Moments.merge, fold_of)
        if reduced is not None:
            for group, moments in reduced.items():
                key = cast(tuple[int, ...], group)
                folds.setdefault(key, _PairwiseFold(Moments.merge)).push(moments)
        else:
            for block, moments in results:
                folds.setdefault(fold_of(block), _PairwiseFold(Moments.merge)).push(moments)
    if not folds:
        # No non-empty chunk: either no samples, or samples without features
        # (a zero-length feature axis), which still count.
        empty = np.zeros(shape[1:], dtype=np.float64)
        return Moments(shape[0], empty.astype(_mean_dtype(dtype)), empty)
    per_member: dict[int, dict[tuple[int, ...], Moments]] = {}
    for (member, *where), fold in folds.items():
        per_member.setdefault(member, {})[tuple(where)] = fold.result()
    total = _PairwiseFold(Moments.merge)
    for member in sorted(per_member):
        tiles = per_member[member]
        if len(tiles) == 1:
            total.push(next(iter(tiles.values())))
            continue
        layout = tuple(len(sizes) for sizes in members[member].chunks[1:])
        count = next(iter(tiles.values())).count
        total.push(Moments(count, _join(layout, tiles, "mean"), _join(layout, tiles, "m2")))
    return total.result()


def _mean_dtype(dtype: np.dtype[Any]) -> np.dtype[Any]:
    """float64, or complex128 for complex data (a float64 mean would drop the imaginary part)."""
    return np.dtype(np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64)


def _squared_modulus(values: np.ndarray) -> np.ndarray:
    """``|values|**2``, real: ``values**2``, or ``re**2 + im**2`` for complex values."""
    if np.iscomplexobj(values):
        return np.square(values.real) + np.square(values.imag)
    return np.square(values)


def _join(layout: tuple[int, ...], tiles: dict[tuple[int, ...], Moments], field: str) -> np.ndarray:
    """Assemble per-feature-block statistics into one array (like ``np.block``)."""

    def nest(prefix: tuple[int, ...]) -> Any:
        depth = len(prefix)
        if depth == len(layout):
            return getattr(tiles[prefix], field)
        return [nest((*prefix, i)) for i in range(layout[depth])]

    return np.block(nest(()))
