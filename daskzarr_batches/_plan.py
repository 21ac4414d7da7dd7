"""Epoch planning: pure index math, no I/O, no dask, no zarr.

An *epoch* delivers samples (rows of axis 0) in some order, cut into batches.
The plan splits that order into *windows*.  A window is the unit of work the
read layer turns into one dask graph: it reads a set of stored axis-0 chunks
(each at most once) and gathers their rows into the window's output order.
Batches are cut from the concatenation of window outputs, so a batch may
straddle two windows while every chunk is still decoded once.

Three orders exist:

``"none"``
    Samples in index order; a window is a run of consecutive chunks.
``"buffer"``
    The order of *units* (chunks, or blocks of chunks shared by every paired
    array) is permuted; consecutive units are grouped into windows of at least
    ``window_rows`` samples (the shuffle buffer, rounded up to whole units) and
    the rows inside each window are permuted.  One read per chunk.
``"exact"``
    A uniform permutation of all samples, split into windows of
    ``window_rows`` samples.  A window touches almost every chunk, so the data
    is read about ``ceil(n / window_rows)`` times per epoch.

Everything here is deterministic given ``(seed, epoch)``, and independent of
prefetch, concurrency and scheduler.  This module is the single source of truth
for "every sample exactly once".
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

ShuffleMode = Literal["none", "buffer", "exact"]
IndexArray = npt.NDArray[np.int64]
Selector = slice | IndexArray

__all__ = [
    "ChunkPiece",
    "EpochPlan",
    "ShuffleMode",
    "Window",
    "chunk_offsets",
    "count_batches",
    "pieces_for",
    "sample_units",
]


def count_batches(n_samples: int, batch_size: int, drop_remainder: bool) -> int:
    """Number of batches an epoch of ``n_samples`` yields."""
    if drop_remainder:
        return n_samples // batch_size
    return -(-n_samples // batch_size)


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
        return np.unique(offsets[0])
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
        Positions of those rows in the window's output.
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
    samples: range | IndexArray
    pieces: tuple[tuple[ChunkPiece, ...], ...]

    @property
    def size(self) -> int:
        """Number of samples the window yields."""
        return len(self.samples)

    def batch_range(self, batch_size: int) -> range:
        """Indices of the batches that contain samples of this window."""
        first = self.position // batch_size
        last = (self.position + self.size - 1) // batch_size
        return range(first, last + 1)


def pieces_for(samples: range | IndexArray, offsets: IndexArray) -> list[ChunkPiece]:
    """Map global sample ids (in output order) to reads of whole chunks.

    Each chunk that holds at least one of ``samples`` appears exactly once.
    """
    if isinstance(samples, range):
        return _pieces_for_range(samples, offsets)
    if len(samples) == 0:
        return []
    order = _sorting_order(samples)
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


def _sorting_order(samples: IndexArray) -> IndexArray:
    """``argsort(samples)`` for distinct ids; O(span) when the ids are dense.

    Windows hold distinct sample ids, usually spread over a span not much
    larger than their count, where marking positions beats sorting.
    """
    low, high = int(samples.min()), int(samples.max())
    span = high - low + 1
    if span > 4 * len(samples):
        return np.argsort(samples, kind="stable")
    positions = np.full(span, -1, dtype=np.int64)
    positions[samples - low] = np.arange(len(samples), dtype=np.int64)
    order = positions[positions >= 0]
    if len(order) != len(samples):  # repeated ids: fall back to a stable sort
        return np.argsort(samples, kind="stable")
    return order


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


def _as_selector(index: IndexArray) -> Selector:
    """A slice when ``index`` is a run of consecutive integers, else itself."""
    spans_run = len(index) and int(index[-1]) - int(index[0]) + 1 == len(index)
    if spans_run and (len(index) == 1 or bool(np.all(np.diff(index) == 1))):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index.astype(np.int64, copy=False)


@dataclass(frozen=True)
class EpochPlan:
    """The complete, deterministic plan of one epoch.

    Parameters
    ----------
    n_samples : int
        Length of axis 0 (shared by every array of the stream).
    offsets : tuple of ndarray
        Axis-0 chunk offsets of each array (see :func:`chunk_offsets`).
    batch_size : int
        Samples per batch.
    drop_remainder : bool
        Whether the short last batch is dropped (its samples are then not
        read at all where whole chunks can be skipped).
    shuffle : {"none", "buffer", "exact"}
        Sample order, see the module docstring.
    window_rows : int
        Samples per window: the target for ``"none"`` (whole units), the
        shuffle buffer for ``"buffer"`` (rounded up to whole units) and the
        exact window for ``"exact"``.
    seed : int
        Entropy of the shuffle; ignored for ``"none"``.
    epoch : int
        Epoch number mixed into the seed, so epochs differ but repeat.
    """

    n_samples: int
    offsets: tuple[IndexArray, ...]
    batch_size: int
    drop_remainder: bool
    shuffle: ShuffleMode
    window_rows: int
    seed: int = 0
    epoch: int = 0
    units: IndexArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        units = sample_units(self.offsets, max(self.window_rows, 1))
        object.__setattr__(self, "units", units)

    @property
    def n_batches(self) -> int:
        """Batches the epoch yields."""
        return count_batches(self.n_samples, self.batch_size, self.drop_remainder)

    @property
    def n_used(self) -> int:
        """Samples the epoch yields (all of them unless ``drop_remainder``)."""
        if self.drop_remainder:
            return self.n_batches * self.batch_size
        return self.n_samples

    def rng(self) -> np.random.Generator:
        """The generator behind this epoch's shuffle."""
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.epoch,)))

    def windows(self) -> Iterator[Window]:
        """Yield the epoch's windows in delivery order (lazily)."""
        orders: Iterator[range | IndexArray]
        if self.shuffle == "none":
            orders = self._sequential_orders()
        elif self.shuffle == "buffer":
            orders = self._buffered_orders()
        elif self.shuffle == "exact":
            orders = self._exact_orders()
        else:  # pragma: no cover - guarded by the public API
            raise ValueError(f"unknown shuffle mode {self.shuffle!r}")
        position = 0
        for index, samples in enumerate(self._truncate(orders)):
            pieces = tuple(tuple(pieces_for(samples, off)) for off in self.offsets)
            yield Window(index, position, samples, pieces)
            position += len(samples)

    def _truncate(self, orders: Iterator[range | IndexArray]) -> Iterator[range | IndexArray]:
        remaining = self.n_used
        for samples in orders:
            if remaining <= 0:
                return
            if len(samples) > remaining:
                samples = samples[:remaining]
            remaining -= len(samples)
            if len(samples):
                yield samples

    def _unit_groups(self, unit_ids: Iterable[int]) -> Iterator[list[int]]:
        """Group units (in the given order) into windows of >= window_rows."""
        sizes = np.diff(self.units)
        group: list[int] = []
        rows = 0
        for unit in unit_ids:
            group.append(int(unit))
            rows += int(sizes[unit])
            if rows >= self.window_rows:
                yield group
                group, rows = [], 0
        if group:
            yield group

    def _sequential_orders(self) -> Iterator[range]:
        # Consecutive units whose total stays within window_rows (at least one).
        sizes = np.diff(self.units)
        start = 0
        unit = 0
        while unit < len(sizes):
            stop = unit + 1
            rows = int(sizes[unit])
            while stop < len(sizes) and rows + int(sizes[stop]) <= self.window_rows:
                rows += int(sizes[stop])
                stop += 1
            end = start + rows
            if end > start:
                yield range(start, end)
            start, unit = end, stop

    def _buffered_orders(self) -> Iterator[IndexArray]:
        rng = self.rng()
        unit_order = rng.permutation(len(self.units) - 1)
        for group in self._unit_groups(unit_order.tolist()):
            samples = np.concatenate([np.arange(self.units[u], self.units[u + 1]) for u in group])
            yield rng.permutation(samples)

    def _exact_orders(self) -> Iterator[IndexArray]:
        order = self.rng().permutation(self.n_samples)[: self.n_used]
        step = max(self.window_rows, 1)
        for lo in range(0, len(order), step):
            yield order[lo : lo + step]
