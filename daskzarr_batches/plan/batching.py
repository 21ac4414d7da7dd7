"""Batching: every piece of batch arithmetic, and cutting windows into batches.

An epoch yields its samples in plan order; batch ``k`` is epoch positions
``[k * batch_size, (k + 1) * batch_size)``.  Windows are cut by chunks, not by
batches, so a batch may start in one window and end in the next.  This module
owns the arithmetic (how many batches, which samples an epoch uses, which
batches a window touches or completes) and :class:`Batcher`, which cuts a
sequence of window outputs into batches the caller owns, carrying a batch that
straddles two windows.

``drop_remainder`` is applied by :func:`samples_used`: the plan never reads
the samples of a dropped short batch.  The batcher drops a short last batch
too, which it only meets when chunks that do not decode were skipped.  Pure
numpy: no dask, no zarr, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "Batcher",
    "batches_completed",
    "batches_touching",
    "complement",
    "count_batches",
    "is_sparse",
    "join_rows",
    "positions_between",
    "row_count",
    "rows_nbytes",
    "samples_used",
    "share",
    "skip",
    "take_rows",
    "worker_part",
]

Batch = tuple[np.ndarray, ...]


def count_batches(n_samples: int, batch_size: int, drop_remainder: bool) -> int:
    """Number of batches an epoch of ``n_samples`` yields."""
    if drop_remainder:
        return n_samples // batch_size
    return -(-n_samples // batch_size)


def samples_used(n_samples: int, batch_size: int, drop_remainder: bool) -> int:
    """Samples an epoch yields: all of them, or whole batches only."""
    if drop_remainder:
        return n_samples // batch_size * batch_size
    return n_samples


def batches_touching(position: int, size: int, batch_size: int) -> range:
    """Indices of the batches holding any of positions ``[position, position + size)``."""
    first = position // batch_size
    last = (position + size - 1) // batch_size
    return range(first, last + 1)


def batches_completed(position: int, size: int, batch_size: int, n_used: int) -> int:
    """Batches completed by positions ``[position, position + size)``.

    A batch straddling two windows counts in the second; the short last batch
    counts in the window holding the epoch's last used sample (``n_used``).
    """
    end = position + size
    completed = end // batch_size - position // batch_size
    if end == n_used and end % batch_size:
        completed += 1
    return completed


def is_sparse(rows: object) -> bool:
    """Whether ``rows`` is a CSR matrix of rows (``scipy.sparse``: a CSR source's window or batch).

    Told by its attributes: the plan imports no scipy.
    """
    return not isinstance(rows, np.ndarray) and getattr(rows, "format", None) == "csr"


def row_count(rows: Any) -> int:
    """Rows of a window output or batch: a numpy array's length, a sparse matrix's rows."""
    return int(rows.shape[0])


def take_rows(rows: Any, where: npt.NDArray[np.int64]) -> Any:
    """Rows ``where`` of ``rows``, a copy (``np.take`` for numpy, row indexing for sparse)."""
    if isinstance(rows, np.ndarray):
        # np.take copies whole rows of a 2-d+ array faster than fancy indexing
        return np.take(rows, where, axis=0) if rows.ndim > 1 else rows[where]
    return rows[where]


def rows_nbytes(rows: Any) -> int:
    """Bytes a batch holds: a sparse matrix's values, column indices and row pointers."""
    if isinstance(rows, np.ndarray):
        return rows.nbytes
    if is_sparse(rows):
        return int(rows.data.nbytes + rows.indices.nbytes + rows.indptr.nbytes)
    return int(rows.nbytes)


def join_rows(parts: Sequence[Any]) -> Any:
    """Concatenate ``parts`` along axis 0 with exactly the first part's dtype.

    ``np.concatenate`` would canonicalise the dtype (``>i4`` becomes native
    ``int32``; padded structured dtypes lose their padding); a batch must
    have the source's dtype.  Sparse matrices are stacked as CSR
    (``scipy.sparse.vstack``).
    """
    first = parts[0]
    if len(parts) == 1:
        return first
    if is_sparse(first):
        return _join_csr(parts)
    out = np.empty((sum(len(part) for part in parts), *first.shape[1:]), dtype=first.dtype)
    at = 0
    for part in parts:
        out[at : at + len(part)] = part
        at += len(part)
    return out


def _join_csr(parts: Sequence[Any]) -> Any:
    """CSR matrices stacked by rows: their values, columns and shifted row pointers joined."""
    first = parts[0]
    data = np.concatenate([part.data for part in parts])
    indices = np.concatenate([part.indices for part in parts])
    nnz = np.cumsum([0] + [part.indptr[-1] for part in parts[:-1]])
    index_dtype = np.int64 if len(data) >= 2**31 else indices.dtype
    pointers = [np.zeros(1, dtype=index_dtype)]
    pointers += [
        part.indptr[1:].astype(index_dtype) + at for part, at in zip(parts, nnz, strict=True)
    ]
    rows = sum(part.shape[0] for part in parts)
    return type(first)((data, indices, np.concatenate(pointers)), shape=(rows, first.shape[1]))


class Batcher:
    """Cuts window outputs, in epoch order, into batches of ``batch_size`` rows.

    Every batch is an array the caller owns, with the dtype of the window
    outputs: a copy, or with ``views=True`` a batch that lies wholly in one
    window (rows in plan order, ``order=None``) is a view of the window's
    output, which must then be a fresh array nobody else holds or reuses
    (never a pooled buffer); a batch straddling two windows is always
    joined.  Rows left at the end of a window are carried into the next
    window's first batch; :meth:`finish` returns the short last batch.

    Parameters
    ----------
    batch_size : int
        Rows per batch (>= 1).
    drop_remainder : bool, default False
        Whether :meth:`finish` drops a short last batch.  The plan already
        leaves out the samples of a short last batch (it never reads them);
        the batcher sees one only when chunks were skipped.
    views : bool, default False
        Whether a batch lying wholly in one window is a view of the window's
        numpy output rather than a copy (the outputs handed to :meth:`feed`
        are then the caller's: fresh, not pooled, written by nobody after).
    """

    def __init__(
        self, batch_size: int, *, drop_remainder: bool = False, views: bool = False
    ) -> None:
        self.batch_size = batch_size
        self.views = views
        self.drop_remainder = drop_remainder
        self._carry: list[Batch] = []
        self._carried = 0

    def feed(self, outputs: Batch, order: npt.NDArray[np.int64] | None = None) -> Iterator[Batch]:
        """Yield every batch completed by one window's ``outputs``.

        Parameters
        ----------
        outputs : tuple of ndarray
            The window's rows, one array per array of the stream, all of the
            same length.
        order : ndarray, optional
            Row ``order[i]`` of ``outputs`` is the window's ``i``-th sample in
            plan order (``Window.gather_index()``, or a part of it: only the
            rows it names are cut); ``None``: every row, already in order.
        """
        size = row_count(outputs[0]) if order is None else len(order)
        position = 0
        views = self.views and order is None and _distinct(outputs)
        if self._carry:
            position = min(self.batch_size - self._carried, size)
            self._carry.append(_rows(outputs, order, 0, position))
            self._carried += position
            if self._carried == self.batch_size:
                yield self._join()
        while size - position >= self.batch_size:
            end = position + self.batch_size
            if views:  # the window's own rows: no second copy
                yield tuple(part[position:end] for part in outputs)
            else:
                yield _rows(outputs, order, position, end)
            position = end
        if position < size:
            self._carry.append(_rows(outputs, order, position, size))
            self._carried += size - position

    def finish(self) -> Batch | None:
        """The short last batch, if rows are left over (and not dropped)."""
        if not self._carry:
            return None
        batch = self._join()
        return None if self.drop_remainder else batch

    def _join(self) -> Batch:
        parts = list(zip(*self._carry, strict=True))
        self._carry, self._carried = [], 0
        return tuple(join_rows(p) for p in parts)


def _distinct(outputs: Batch) -> bool:
    """Whether the outputs are numpy arrays of which no two share a buffer (views of them
    are batches independent of each other)."""
    bases = []
    for part in outputs:
        if not isinstance(part, np.ndarray):
            return False
        bases.append(id(part if part.base is None else part.base))
    return len(set(bases)) == len(bases)


def _rows(outputs: Batch, order: npt.NDArray[np.int64] | None, start: int, stop: int) -> Batch:
    """Plan positions ``start:stop`` of every output, as owned copies."""
    if order is None:
        if len(outputs) == 1:  # the common case, without a generator per batch
            return (_slice_rows(outputs[0], start, stop),)
        return tuple(_slice_rows(part, start, stop) for part in outputs)
    where = order[start:stop]
    return tuple(take_rows(part, where) for part in outputs)


def _slice_rows(rows: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop``, a copy (a CSR matrix's cut from its arrays: scipy's row slice
    goes through its general submatrix code, 3x slower)."""
    if isinstance(rows, np.ndarray):
        return rows[start:stop].copy()
    if not is_sparse(rows):
        return rows[start:stop]
    lo, hi = int(rows.indptr[start]), int(rows.indptr[stop])
    indptr = rows.indptr[start : stop + 1] - lo
    return type(rows)(
        (rows.data[lo:hi].copy(), rows.indices[lo:hi].copy(), indptr),
        shape=(stop - start, rows.shape[1]),
    )


Ranges = list[tuple[int, int]]


def share(ranges: Ranges, rank: int, world_size: int, even: bool) -> Ranges:
    """Rank ``rank``'s equal, contiguous share of the epoch positions in ``ranges``.

    The positions of ``ranges`` (in order) are cut into ``world_size``
    consecutive shares of ``m`` positions each: ``ceil(total / world_size)``
    with ``even=True`` (the last shares wrap around to the first positions,
    repeating samples so every rank has as many), ``total // world_size``
    with ``even=False`` (the tail is dropped).  Consecutive positions keep
    each rank on its own chunks.
    """
    total = sum(stop - start for start, stop in ranges)
    if total == 0:
        return []
    per_rank = -(-total // world_size) if even else total // world_size
    return positions_between(ranges, rank * per_rank, (rank + 1) * per_rank)


def positions_between(ranges: Ranges, first: int, end: int) -> Ranges:
    """Positions ``first:end`` of the concatenation of ``ranges``, wrapping around."""
    total = sum(stop - start for start, stop in ranges)
    out: Ranges = []
    at = first
    while at < end and total:
        offset = at % total
        for start, stop in ranges:
            length = stop - start
            if offset < length:
                take = min(length - offset, end - at)
                out.append((start + offset, start + offset + take))
                at += take
                break
            offset -= length
    return out


def worker_part(ranges: Ranges, batch_size: int, worker: int, workers: int) -> Ranges:
    """Worker ``worker``'s contiguous part of ``ranges``, of whole batches but the last.

    The positions of ``ranges`` are cut into ``workers`` consecutive parts
    at batch boundaries, as evenly as whole batches allow (the parts of the
    first workers may be one batch shorter); only the last part may end in
    a short batch.  Together they are ``ranges``, each position once.
    """
    total = sum(stop - start for start, stop in ranges)
    batches = -(-total // batch_size)
    first = worker * batches // workers * batch_size
    end = min((worker + 1) * batches // workers * batch_size, total)
    return positions_between(ranges, first, end) if first < end else []


def skip(ranges: Ranges, count: int) -> Ranges:
    """``ranges`` without their first ``count`` positions."""
    total = sum(stop - start for start, stop in ranges)
    return positions_between(ranges, count, total) if count < total else []


def complement(ranges: Ranges, n: int) -> Ranges:
    """The positions of ``[0, n)`` in none of ``ranges``, in order."""
    out: Ranges = []
    at = 0
    for start, stop in sorted(ranges):
        if start > at:
            out.append((at, start))
        at = max(at, stop)
    if at < n:
        out.append((at, n))
    return out
