r"""Windows and chunk pieces: what one unit of work reads, and where its rows go.

A :class:`Window` holds consecutive epoch positions; its :class:`ChunkPiece`\ s say,
per array, which rows of which stored axis-0 chunk to decode and keep.  Also the
units samples are grouped in (:func:`sample_units`) and the fast-start ramp
(:func:`ramp_split`).  Pure numpy."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from .batching import batches_touching

__all__ = [
    "RAMP_START_UNITS",
    "ChunkPiece",
    "IndexArray",
    "RunIndex",
    "SampleIds",
    "Selector",
    "ShuffleMode",
    "Window",
    "chunk_offsets",
    "pieces_for",
    "ramp_split",
    "sample_units",
    "sorting_order",
]


ShuffleMode = Literal["none", "buffer", "exact"]


IndexArray = npt.NDArray[np.int64]


#: sample ids: int32 for the exact shuffle's permutation when it fits (half the memory)
SampleIds = npt.NDArray[np.int32] | npt.NDArray[np.int64]


Selector = slice | IndexArray


#: Units (chunks, or blocks of chunks shared by paired arrays) of the first window.
RAMP_START_UNITS = 1


def ramp_split(units: int, start: int = RAMP_START_UNITS) -> list[int]:
    """How the ramp cuts an epoch's first window of ``units`` units: ``1, 1, 2, 4, ...``.

    Windows ``start, start, 2 * start, 4 * start, ...`` units, the last one cut
    to what is left (and put in its place in ascending order), so the pieces
    fill exactly the first window the mode would make without the ramp, and
    every later window is unchanged (its boundaries, hence what ranks and
    shards see, do not move).  The first batch then waits
    for ``start`` units' read instead of a whole window's, at the cost of about
    ``log2(units / start)`` extra windows per epoch.  The rule counts units
    only, so any grouping of units into windows (chunks, shards, blocks of
    paired chunks) can follow it.

    Parameters
    ----------
    units : int
        Units of the first window without the ramp (>= 0).
    start : int, default ``RAMP_START_UNITS``
        Units of the first two pieces (>= 1).

    Returns
    -------
    list of int
        Units per window, nondecreasing, summing to ``units``.

    Examples
    --------
    >>> ramp_split(16), ramp_split(6), ramp_split(5), ramp_split(1), ramp_split(0)
    ([1, 1, 2, 4, 8], [1, 1, 2, 2], [1, 1, 1, 2], [1], [])
    """
    sizes: list[int] = []
    left = units
    while left > 0:
        size = min(left, start if len(sizes) < 2 else sum(sizes))
        sizes.append(size)
        left -= size
    return sorted(sizes)  # a short rest goes first: sizes never shrink


class RunIndex:
    """Which of consecutive runs holds each sample id: ``searchsorted(offsets, ids) - 1``, fast.

    ``offsets`` are the runs' starts, then the end (a collection's members:
    empty ones allowed).  ``np.searchsorted`` costs about 25 ns for each id
    out of order (a shuffled window's: 25 ms an epoch of a million samples,
    per use, on the consumer's thread); a table over buckets of ``2**shift``
    ids (at most ``2**16`` buckets) gives the run of every id in a bucket
    that no run starts inside, and only the others are searched.
    """

    __slots__ = ("_first", "_mixed", "offsets", "shift")

    def __init__(self, offsets: npt.ArrayLike) -> None:
        self.offsets = np.asarray(offsets, dtype=np.int64)
        n = max(int(self.offsets[-1]), 1)
        self.shift = max(0, (n - 1).bit_length() - 16)
        starts = np.arange(0, n, 1 << self.shift, dtype=np.int64)
        last = np.minimum(starts + (1 << self.shift) - 1, n - 1)
        self._first = np.searchsorted(self.offsets, starts, side="right") - 1
        self._mixed = self._first != np.searchsorted(self.offsets, last, side="right") - 1

    def __call__(self, ids: npt.ArrayLike) -> IndexArray:
        """The run of each of ``ids`` (each within ``[0, offsets[-1])``), as int64."""
        ids = np.asarray(ids, dtype=np.int64)
        buckets = ids >> self.shift
        runs = self._first[buckets]
        mixed = np.flatnonzero(self._mixed[buckets])
        if len(mixed):
            runs[mixed] = np.searchsorted(self.offsets, ids[mixed], side="right") - 1
        return runs

    def counts(self, lo: int, hi: int) -> IndexArray:
        """How many of the ids ``lo:hi`` each run holds (int64, one per run)."""
        ends = np.minimum(self.offsets[1:], hi)
        return np.maximum(ends - np.maximum(self.offsets[:-1], lo), 0)


def chunk_offsets(chunk_rows: Sequence[int]) -> IndexArray:
    """Start offsets of each chunk plus the end: ``[0, c0, c0 + c1, ..., n]``."""
    return np.concatenate([[0], np.cumsum(np.asarray(chunk_rows, dtype=np.int64))])


def sample_units(offsets: Sequence[IndexArray], max_rows: int) -> IndexArray:
    """Split ``[0, n)`` into units that are read together.

    For one array the units are its chunks.  For paired arrays they are the
    blocks between boundaries shared by every array, so that a unit covers
    whole chunks of each array and no chunk is split between windows.  If
    such blocks would exceed ``max_rows`` samples (chunk grids that rarely
    line up), units fall back to the pieces between *any* two boundaries:
    memory stays bounded and the extra reads show up in ``read_amplification``.
    """
    if len(offsets) == 1:
        only = np.asarray(offsets[0])
        if only.ndim == 1 and (only[1:] > only[:-1]).all():  # already unique and sorted
            return only
        return np.unique(only)
    common = functools.reduce(np.intersect1d, offsets)
    if len(common) < 2 or np.diff(common).max(initial=0) <= max_rows:
        return common
    return functools.reduce(np.union1d, offsets)


@dataclass(frozen=True)
class ChunkPiece:
    """The rows one window takes from one stored axis-0 chunk of one array.

    Attributes
    ----------
    chunk : int
        Axis-0 chunk index in that array's chunk grid.
    start, stop : int
        Global sample range the chunk holds (edge chunks are cropped).
    take : slice or ndarray
        Rows of the chunk to keep, local to the chunk and ascending.
    dest : slice or ndarray
        Positions of those rows in the window's plan order (the order its
        batches are cut in).  The read layer returns rows in ascending sample
        order; ``Window.gather_index()`` applies the plan order.
    """

    chunk: int
    start: int
    stop: int
    take: Selector
    dest: Selector

    @property
    def rows(self) -> int:
        """Number of samples the chunk holds (all of it is decoded)."""
        return self.stop - self.start


@dataclass(frozen=True)
class Window:
    """One unit of read work: which chunks to read and how to order rows.

    Attributes
    ----------
    index : int
        Position of the window in the epoch.
    position : int
        Epoch position of the window's first sample (batches are cut at
        multiples of the batch size of these positions).
    samples : range or ndarray
        Global sample ids in output order.
    pieces : tuple of tuple of ChunkPiece
        For each array of the stream, the chunks read, each exactly once.
    """

    index: int
    position: int
    samples: range | SampleIds
    pieces: tuple[tuple[ChunkPiece, ...], ...]

    @property
    def size(self) -> int:
        """Number of samples the window yields."""
        return len(self.samples)

    def gather_index(self) -> IndexArray | None:
        """Where each output row sits among the window's samples sorted by id.

        The read layer returns a window's rows in ascending sample order;
        output row ``i`` is sorted row ``gather_index()[i]`` (the inverse of
        the pieces' ``dest``, read off them without a sort).  ``None`` when
        the window is a run in order (sequential windows).
        """
        if isinstance(self.samples, range):
            return None
        index = np.empty(self.size, dtype=np.int64)
        rank = 0
        for piece in self.pieces[0]:  # ascending chunks, ascending rows in each
            taken = (
                len(range(piece.rows)[piece.take])
                if isinstance(piece.take, slice)
                else len(piece.take)
            )
            index[piece.dest] = np.arange(rank, rank + taken, dtype=np.int64)
            rank += taken
        return index

    def batch_range(self, batch_size: int) -> range:
        """Indices of the batches that contain samples of this window."""
        return batches_touching(self.position, self.size, batch_size)


def pieces_for(
    samples: range | SampleIds, offsets: IndexArray, order: IndexArray | None = None
) -> list[ChunkPiece]:
    """Map global sample ids (in output order) to reads of whole chunks.

    Each chunk that holds at least one of ``samples`` appears exactly once.
    """
    if isinstance(samples, range):
        return _pieces_for_range(samples, offsets)
    if len(samples) == 0:
        return []
    if order is None:
        order = sorting_order(samples)
    ordered = samples[order]
    chunk_ids = np.searchsorted(offsets, ordered, side="right") - 1
    cuts = np.flatnonzero(np.diff(chunk_ids)) + 1
    bounds = np.concatenate([[0], cuts, [len(ordered)]])
    pieces = []
    for lo, hi in itertools.pairwise(bounds.tolist()):
        chunk = int(chunk_ids[lo])
        start = int(offsets[chunk])
        local = ordered[lo:hi] - start
        pieces.append(
            ChunkPiece(
                chunk=chunk,
                start=start,
                stop=int(offsets[chunk + 1]),
                take=_as_selector(local),
                dest=_as_selector(order[lo:hi]),
            )
        )
    return pieces


def sorting_order(samples: SampleIds) -> IndexArray:
    """``argsort(samples, kind="stable")``, faster for the ids windows hold.

    Dense distinct ids (span <= 4x their count) are placed by marking
    positions, O(span); others by two stable 16-bit radix passes (numpy sorts
    16-bit integers by radix), O(n), up to a span of 2**32; else argsort.
    """
    if len(samples) == 0:
        return np.empty(0, dtype=np.int64)
    low, high = int(np.min(samples)), int(np.max(samples))
    span = high - low + 1
    if span > 4 * len(samples):
        if span > 2**32:
            return np.argsort(samples, kind="stable")
        relative = samples - low
        first = np.argsort((relative & 0xFFFF).astype(np.uint16), kind="stable")
        second = np.argsort((relative[first] >> 16).astype(np.uint16), kind="stable")
        return first[second]
    positions = np.full(span, -1, dtype=np.int64)
    positions[samples - low] = np.arange(len(samples), dtype=np.int64)
    order = positions[positions >= 0]
    if len(order) != len(samples):  # repeated ids: fall back to a stable sort
        return np.argsort(samples, kind="stable")
    return order.astype(np.int64, copy=False)


def _pieces_for_range(samples: range, offsets: IndexArray) -> list[ChunkPiece]:
    if len(samples) == 0:
        return []
    first, end = samples.start, samples.stop
    chunk = int(np.searchsorted(offsets, first, side="right")) - 1
    pieces = []
    while chunk < len(offsets) - 1 and offsets[chunk] < end:
        start, stop = int(offsets[chunk]), int(offsets[chunk + 1])
        if stop > start:
            lo, hi = max(first, start), min(end, stop)
            pieces.append(
                ChunkPiece(
                    chunk=chunk,
                    start=start,
                    stop=stop,
                    take=slice(lo - start, hi - start),
                    dest=slice(lo - first, hi - first),
                )
            )
        chunk += 1
    return pieces


def _as_selector(index: SampleIds) -> Selector:
    """A slice when ``index`` is a run of consecutive integers, else itself."""
    spans_run = len(index) and int(index[-1]) - int(index[0]) + 1 == len(index)
    if spans_run and (len(index) == 1 or bool(np.all(np.diff(index) == 1))):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index.astype(np.int64, copy=False)
