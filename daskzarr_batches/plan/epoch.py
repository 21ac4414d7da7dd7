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

Both start small (:func:`ramp_split`): the first window is read as windows of
1, 1, 2, 4, ... units, so the first batch waits for one unit's read, not a
whole window's; later windows are as without the ramp.
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
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from .batching import batches_completed, batches_touching, count_batches, samples_used

ShuffleMode = Literal["none", "buffer", "exact"]
IndexArray = npt.NDArray[np.int64]
#: sample ids: int32 for the exact shuffle's permutation when it fits (half the memory)
SampleIds = npt.NDArray[np.int32] | npt.NDArray[np.int64]
Selector = slice | IndexArray

#: Bytes of index arrays per sample of an exact-shuffle window, counted in
#: ``memory_budget``: the pieces' ``take`` and ``dest`` and the gather index
#: (int64 each) held while the window is read and cut, with room for the
#: temporaries of planning it (``sorting_order``, ``pieces_for``).
INDEX_BYTES_PER_SAMPLE = 32
#: An exact-shuffle window may have ``1 / DECODE_SHARE`` of its share of the
#: budget in decoded chunks in flight (at least one chunk) ...
DECODE_SHARE = 32
#: ... each costing about this many times its decoded bytes while it is read
#: (the stored bytes, the decoded chunk and Zarr's copy of it).
DECODE_COPIES = 3

__all__ = [
    "DECODE_COPIES",
    "DECODE_SHARE",
    "INDEX_BYTES_PER_SAMPLE",
    "ChunkPiece",
    "EpochPlan",
    "ExactBudget",
    "PlanSummary",
    "ShardLayout",
    "ShuffleMode",
    "Window",
    "WindowSummary",
    "chunk_offsets",
    "exact_budget",
    "permutation",
    "pieces_for",
    "ramp_split",
    "read_amplification",
    "reads_whole_shard",
    "sample_units",
    "shard_requests",
    "sorting_order",
]


def read_amplification(bytes_read: int, bytes_yielded: int) -> float:
    """How often the yielded data was decoded: ``bytes_read / bytes_yielded``.

    The one rule for plans (:class:`PlanSummary`) and streams (``StreamStats``).

    Parameters
    ----------
    bytes_read : int
        Decoded bytes of the chunks read.
    bytes_yielded : int
        Bytes handed (or to be handed) to the caller.

    Returns
    -------
    float
        ``bytes_read / bytes_yielded``; ``0.0`` when nothing was yielded nor
        read, ``inf`` when bytes were read but nothing yielded.

    Examples
    --------
    >>> read_amplification(800, 400), read_amplification(0, 0), read_amplification(8, 0)
    (2.0, 0.0, inf)
    """
    if bytes_yielded == 0:
        return 0.0 if bytes_read == 0 else math.inf
    return bytes_read / bytes_yielded


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


def chunk_offsets(chunk_rows: Sequence[int]) -> IndexArray:
    """Start offsets of each chunk plus the end: ``[0, c0, c0 + c1, ..., n]``."""
    return np.concatenate([[0], np.cumsum(np.asarray(chunk_rows, dtype=np.int64))])


@dataclass(frozen=True)
class ExactBudget:
    """How an exact shuffle spends ``memory_budget`` (see :func:`exact_budget`).

    Attributes
    ----------
    window_rows : int
        Samples per window.
    decode_bytes : int
        Decoded bytes of stored chunks one window read may have in flight
        (the read layer allows at least one chunk).
    """

    window_rows: int
    decode_bytes: int


def exact_budget(memory_budget: int, row_bytes: int, prefetch: int) -> ExactBudget:
    """Split ``memory_budget`` between an exact shuffle's windows and their reads.

    The ``prefetch + 1`` windows alive at once share the budget equally.  Of
    one window's share, ``1 / DECODE_SHARE`` is decoded chunks in flight
    (charged ``DECODE_COPIES`` times), and the rest holds the window's
    samples at ``row_bytes + INDEX_BYTES_PER_SAMPLE`` bytes each, so
    ``window_rows * (row_bytes + INDEX_BYTES_PER_SAMPLE) + DECODE_COPIES *
    decode_bytes <= memory_budget / (prefetch + 1)`` whenever the share holds
    one sample (``window_rows`` is at least 1).  The epoch's permutation
    (:func:`permutation`, 4 bytes per sample) and one chunk being decoded
    when a chunk is larger than ``decode_bytes`` are not in the budget.

    Examples
    --------
    >>> exact_budget(2**20, 256, 0)
    ExactBudget(window_rows=2958, decode_bytes=65536)
    """
    share = memory_budget // (prefetch + 1)
    decode = share // DECODE_SHARE
    rows = (share - DECODE_COPIES * decode) // (row_bytes + INDEX_BYTES_PER_SAMPLE)
    return ExactBudget(window_rows=max(1, rows), decode_bytes=decode)


def permutation(rng: np.random.Generator, n: int) -> SampleIds:
    """``rng.permutation(n)``, as int32 when ``n < 2**31`` (half the memory).

    ``Generator.permutation(n)`` shuffles ``arange(n)``; shuffling an int32
    ``arange`` makes the same swaps, so the order of a seed is unchanged.
    """
    if n >= 2**31:
        return rng.permutation(n)
    ids = np.arange(n, dtype=np.int32)
    rng.shuffle(ids)
    return ids


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
class ShardLayout:
    """How one stored array groups its axis-0 chunks into objects of the store.

    Attributes
    ----------
    chunks : int
        Axis-0 chunks per shard (1: unsharded, each chunk its own object).
    keys : int
        Stored objects per axis-0 shard (or chunk) row: more than one when the
        array is also split along other axes.
    inner : int
        Chunks along the other axes inside one shard (1 when unsharded).
    """

    chunks: int = 1
    keys: int = 1
    inner: int = 1

    @property
    def sharded(self) -> bool:
        """Whether stored objects hold several chunks (and an index)."""
        return self.chunks * self.inner > 1


def reads_whole_shard(needed: int, existing: int) -> bool:
    """Whether a read needing ``needed`` of a shard's ``existing`` axis-0 chunks
    fetches the whole shard in one request (at least half of it is needed),
    rather than its index and the needed chunks' byte ranges.

    The read layer and :meth:`EpochPlan.summary` share this rule.
    """
    return 2 * needed >= existing


def shard_requests(needed: Sequence[int], existing: int, layout: ShardLayout) -> int:
    """Store requests to read axis-0 chunks ``needed`` (ascending, local to the shard)
    of one shard row that holds ``existing`` of them.

    A whole shard is one request per stored object; otherwise the index and
    one request per run of consecutive needed chunks (adjacent byte ranges are
    merged), for each chunk along the other axes (an upper bound when those
    chunks are not stored one after another).
    """
    if not layout.sharded:
        return len(needed) * layout.keys
    if reads_whole_shard(len(needed), existing):
        return layout.keys
    runs = 1 + sum(1 for a, b in itertools.pairwise(needed) if b != a + 1)
    return layout.keys * (1 + runs * layout.inner)


def shard_units(
    offsets: Sequence[IndexArray], shards: Sequence[ShardLayout | None], max_rows: int
) -> IndexArray | None:
    """Units of whole shards: the boundaries shared by every array's shard grid.

    Used when some array is sharded and every such block fits ``max_rows``
    samples (a sequential window then starts and ends on shard boundaries, a
    buffered shuffle permutes whole shards); ``None`` otherwise, and the units
    are chunks (:func:`sample_units`).  An unsharded array's grid is its chunk
    grid, so paired arrays with different shard grids share units too.
    """
    if not any(layout is not None and layout.chunks > 1 for layout in shards):
        return None
    grids = []
    for off, layout in zip(offsets, shards, strict=True):
        step = 1 if layout is None else layout.chunks
        grids.append(np.union1d(off[::step], off[-1:]))
    common = functools.reduce(np.intersect1d, grids)
    if len(common) < 2 or np.diff(common).max() > max_rows:
        return None
    return common


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
    low, high = int(samples.min()), int(samples.max())
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


@dataclass(frozen=True)
class _UnitShuffle:
    """A buffered window as whole units permuted, so its pieces need no sort.

    The window's samples are ``concatenate(ranges of the units)[shuffle]``;
    ``landing[j]`` is the plan position of row ``j`` of that concatenation.
    """

    starts: IndexArray  # unit starts, in the window's (permuted) unit order
    stops: IndexArray
    landing: IndexArray

    @classmethod
    def of(cls, starts: IndexArray, stops: IndexArray, shuffle: IndexArray) -> _UnitShuffle:
        landing = np.empty(len(shuffle), dtype=np.int64)
        landing[shuffle] = np.arange(len(shuffle), dtype=np.int64)
        return cls(starts, stops, landing)

    def pieces(self, offsets: IndexArray) -> list[ChunkPiece]:
        """``pieces_for(samples, offsets)``, read off the unit layout.

        Units are visited in ascending sample order; each overlaps whole
        chunks or (units between any two boundaries of paired arrays) parts
        of chunks, which are merged so that a chunk appears once.
        """
        at = np.concatenate([[0], np.cumsum(self.stops - self.starts)])
        spans: dict[int, list[tuple[int, int, int]]] = {}  # chunk -> (lo, hi, at)
        for unit in np.argsort(self.starts, kind="stable").tolist():
            lo, hi, where = int(self.starts[unit]), int(self.stops[unit]), int(at[unit])
            chunk = int(np.searchsorted(offsets, lo, side="right")) - 1
            while chunk < len(offsets) - 1 and offsets[chunk] < hi:
                start, stop = int(offsets[chunk]), int(offsets[chunk + 1])
                if stop > start:
                    first, end = max(lo, start), min(hi, stop)
                    spans.setdefault(chunk, []).append((first, end, where + first - lo))
                chunk += 1
        pieces = []
        for chunk, parts in spans.items():  # ascending: units were visited in sample order
            start = int(offsets[chunk])
            if len(parts) == 1:
                ((first, end, where),) = parts
                take: Selector = slice(first - start, end - start)
                dest = self.landing[where : where + end - first]
            else:
                take = _as_selector(np.concatenate([np.arange(f, e) - start for f, e, _ in parts]))
                dest = np.concatenate([self.landing[w : w + e - f] for f, e, w in parts])
            pieces.append(
                ChunkPiece(chunk, start, int(offsets[chunk + 1]), take, _as_selector(dest))
            )
        return pieces


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
    row_bytes : tuple of int, optional
        Decoded bytes of one sample of each array; lets :meth:`summary`
        report bytes (empty: bytes are reported as 0).
    shards : tuple of ShardLayout or None, optional
        How each array's chunks are stored (``None``: not a stored array,
        e.g. numpy; empty: unknown).  Sequential and buffered windows are
        made of whole shards when a shard fits the window (see
        :func:`shard_units`), and :meth:`summary` counts shards and store
        requests.
    ramp : bool, default True
        Whether the first sequential or buffered window is split into
        windows of 1, 1, 2, 4, ... units (:func:`ramp_split`), so that the
        first batch waits for one unit's read.  Exact windows are not ramped
        (a small window of a uniform permutation still touches nearly every
        chunk, so it would cost a read of the data and save no time).
    """

    n_samples: int
    offsets: tuple[IndexArray, ...]
    batch_size: int
    drop_remainder: bool
    shuffle: ShuffleMode
    window_rows: int
    seed: int = 0
    epoch: int = 0
    row_bytes: tuple[int, ...] = ()
    shards: tuple[ShardLayout | None, ...] = ()
    ramp: bool = True
    units: IndexArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        max_rows = max(self.window_rows, 1)
        units = shard_units(self.offsets, self.shards, max_rows)
        if units is None:
            units = sample_units(self.offsets, max_rows)
        object.__setattr__(self, "units", units)

    @property
    def n_batches(self) -> int:
        """Batches the epoch yields."""
        return count_batches(self.n_samples, self.batch_size, self.drop_remainder)

    @property
    def n_used(self) -> int:
        """Samples the epoch yields (all of them unless ``drop_remainder``)."""
        return samples_used(self.n_samples, self.batch_size, self.drop_remainder)

    def summary(self, task_count: Callable[[Window], int] | None = None) -> PlanSummary:
        """What the epoch will read and yield, per window, without reading data.

        Parameters
        ----------
        task_count : callable, optional
            ``task_count(window)`` -> dask tasks of that window's graph (the
            read layer knows; streams pass it).  Without it tasks are ``None``.

        Returns
        -------
        PlanSummary
            One :class:`WindowSummary` per window and the epoch's totals.
        """
        row_bytes = self.row_bytes or (0,) * len(self.offsets)
        rows = []
        for window in self.windows():
            batches = batches_completed(window.position, window.size, self.batch_size, self.n_used)
            chunks = tuple(tuple(piece.chunk for piece in pieces) for pieces in window.pieces)
            decoded = sum(
                sum(piece.rows for piece in pieces) * size
                for pieces, size in zip(window.pieces, row_bytes, strict=True)
            )
            shards, requests = self._store_reads(window)
            rows.append(
                WindowSummary(
                    index=window.index,
                    samples=window.size,
                    batches=batches,
                    chunks=chunks,
                    bytes_decoded=decoded,
                    bytes_held=window.size * sum(row_bytes),
                    tasks=None if task_count is None else task_count(window),
                    shards=shards,
                    requests=requests,
                )
            )
        return PlanSummary(
            windows=tuple(rows),
            shuffle=self.shuffle,
            batch_size=self.batch_size,
            n_samples=self.n_samples,
            n_batches=self.n_batches,
            bytes_yielded=self.n_used * sum(row_bytes),
            dataset_bytes=self.n_samples * sum(row_bytes),
        )

    def _store_reads(self, window: Window) -> tuple[int, int]:
        """Shards a window touches and the store requests it makes (an estimate, no I/O).

        Per shard: one request when it is read whole, else the index and the
        coalesced runs of needed chunks (:func:`shard_requests`); an unsharded
        chunk is one request per stored object.  Arrays not in a store count 0.
        """
        shards = requests = 0
        for pieces, offsets, layout in zip(window.pieces, self.offsets, self.shards, strict=False):
            if layout is None:
                continue
            total = len(offsets) - 1
            rows: dict[int, list[int]] = {}
            for piece in pieces:
                rows.setdefault(piece.chunk // layout.chunks, []).append(
                    piece.chunk % layout.chunks
                )
            for row, needed in rows.items():
                existing = min(layout.chunks, total - row * layout.chunks)
                requests += shard_requests(sorted(needed), existing, layout)
                shards += layout.keys if layout.sharded else 0
        return shards, requests

    def part(self, window: Window, first: int, end: int) -> Window:
        """Plan positions ``first:end`` of ``window`` as a window of their own.

        It reads only the chunks holding those samples (a rank whose share
        ends inside a sequential window decodes just its own chunks).
        """
        if (first, end) == (0, window.size):
            return window
        samples = window.samples[first:end]
        order = None if isinstance(samples, range) else sorting_order(samples)
        pieces = tuple(tuple(pieces_for(samples, offsets, order)) for offsets in self.offsets)
        return Window(window.index, window.position + first, samples, pieces)

    def rng(self) -> np.random.Generator:
        """The generator behind this epoch's shuffle."""
        return np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(self.epoch,)))

    def windows(self) -> Iterator[Window]:
        """Yield the epoch's windows in delivery order (lazily)."""
        orders: Iterator[tuple[range | SampleIds, _UnitShuffle | None]]
        if self.shuffle == "none":
            orders = ((samples, None) for samples in self._sequential_orders())
        elif self.shuffle == "buffer":
            orders = self._buffered_orders()
        elif self.shuffle == "exact":
            orders = ((samples, None) for samples in self._exact_orders())
        else:  # pragma: no cover - guarded by the public API
            raise ValueError(f"unknown shuffle mode {self.shuffle!r}")
        position = 0
        for index, (samples, units) in enumerate(self._truncate(orders)):
            if units is not None:
                pieces = tuple(tuple(units.pieces(off)) for off in self.offsets)
            else:
                order = None if isinstance(samples, range) else sorting_order(samples)
                pieces = tuple(tuple(pieces_for(samples, off, order)) for off in self.offsets)
            yield Window(index, position, samples, pieces)
            position += len(samples)

    def windows_between(self, first: int, end: int, index: int = 0) -> Iterator[Window]:
        """The windows that deliver epoch positions ``first:end``, cut to them.

        A sequential order is the same however it is cut, so its windows are
        ramped again from ``first`` (a rank's share or a resumed epoch starts
        with a one-unit window too) and numbered from ``index``; from 0 to
        :attr:`n_used` they are :meth:`windows`.  A shuffled order depends on
        its windows, so they are the epoch's own, a window a range starts or
        ends inside cut to its part (:meth:`part`).

        Parameters
        ----------
        first, end : int
            Epoch positions, ``0 <= first <= end <= n_used``.
        index : int, default 0
            Index of the first sequential window.
        """
        if self.shuffle == "none":
            for samples in self._sequential_orders(first):
                if samples.start >= end:
                    return
                samples = samples[: end - samples.start]
                pieces = tuple(tuple(pieces_for(samples, off)) for off in self.offsets)
                yield Window(index, samples.start, samples, pieces)
                index += 1
            return
        for window in self.windows():
            start = window.position
            if start >= end:
                return
            if start + window.size > first:
                lo, hi = max(first - start, 0), min(end - start, window.size)
                yield self.part(window, lo, hi)

    def _truncate(
        self, orders: Iterator[tuple[range | SampleIds, _UnitShuffle | None]]
    ) -> Iterator[tuple[range | SampleIds, _UnitShuffle | None]]:
        remaining = self.n_used
        for samples, units in orders:
            if remaining <= 0:
                return
            if len(samples) > remaining:
                samples, units = samples[:remaining], None  # no longer whole units
            remaining -= len(samples)
            if len(samples):
                yield samples, units

    def _unit_groups(self, unit_ids: Iterable[int]) -> Iterator[list[int]]:
        """Group units (in the given order) into windows of >= window_rows.

        With the ramp, the first group is yielded as pieces (:func:`ramp_split`).
        """
        sizes = np.diff(self.units)
        group: list[int] = []
        rows = 0
        first = self.ramp
        for unit in unit_ids:
            group.append(int(unit))
            rows += int(sizes[unit])
            if rows >= self.window_rows:
                yield from self._ramped(group) if first else (group,)
                group, rows, first = [], 0, False
        if group:
            yield from self._ramped(group) if first else (group,)

    @staticmethod
    def _ramped(group: list[int]) -> Iterator[list[int]]:
        at = 0
        for size in ramp_split(len(group)):
            yield group[at : at + size]
            at += size

    def _sequential_orders(self, first: int = 0) -> Iterator[range]:
        # Consecutive units from sample `first` (the part of a unit before the
        # next boundary counts as one unit) whose total stays within window_rows
        # (at least one unit); with the ramp the first window is cut by ramp_split.
        units = self.units[self.units > first]
        edges = np.concatenate([[first], units]) if len(units) else units[:0]
        sizes = np.diff(edges).tolist()
        start = first
        unit = 0
        while unit < len(sizes):
            stop = unit + 1
            rows = sizes[unit]
            while stop < len(sizes) and rows + sizes[stop] <= self.window_rows:
                rows += sizes[stop]
                stop += 1
            pieces = ramp_split(stop - unit) if unit == 0 and self.ramp else [stop - unit]
            for count in pieces:
                end = start + sum(sizes[unit : unit + count])
                if end > start:
                    yield range(start, end)
                start, unit = end, unit + count

    def _buffered_orders(self) -> Iterator[tuple[IndexArray, _UnitShuffle]]:
        rng = self.rng()
        unit_order = rng.permutation(len(self.units) - 1)
        for group in self._unit_groups(unit_order.tolist()):
            starts, stops = self.units[group], self.units[np.asarray(group) + 1]
            samples = np.concatenate(
                [np.arange(lo, hi) for lo, hi in zip(starts, stops, strict=True)]
            )
            # numpy's Generator draws the same swaps for permutation(array) and
            # permutation(len(array)): samples[shuffle] is rng.permutation(samples)
            # (tests/test_plan.py checks it), and the shuffle gives the pieces.
            shuffle = rng.permutation(len(samples))
            yield samples[shuffle], _UnitShuffle.of(starts, stops, shuffle)

    def _exact_orders(self) -> Iterator[SampleIds]:
        order = permutation(self.rng(), self.n_samples)[: self.n_used]
        step = max(self.window_rows, 1)
        for lo in range(0, len(order), step):
            yield order[lo : lo + step]


@dataclass(frozen=True)
class WindowSummary:
    """One window of a :class:`PlanSummary`.

    Attributes
    ----------
    index : int
        Position of the window in the epoch.
    samples : int
        Samples the window yields.
    batches : int
        Batches completed in this window (a batch straddling two windows
        counts in the second).
    chunks : tuple of tuple of int
        For each array, the axis-0 chunks the window reads (each decoded once).
    bytes_decoded : int
        Decoded bytes of those chunks (whole chunks are decoded).  Stored
        (compressed) sizes are not known without listing the store, so they
        are not reported.
    bytes_held : int
        Bytes of the window's samples, held until its batches are consumed.
    tasks : int or None
        Dask tasks of the window's graph.
    shards : int
        Shards (stored objects of sharded arrays) the window reads; 0 for
        unsharded arrays.
    requests : int
        Store requests the window makes, estimated from the plan and the
        shard geometry: a chunk of an unsharded array or a shard read whole
        is one request, a shard read in part is its index plus one request per
        run of adjacent needed chunks.  0 for arrays not read from a store.
    """

    index: int
    samples: int
    batches: int
    chunks: tuple[tuple[int, ...], ...]
    bytes_decoded: int
    bytes_held: int
    tasks: int | None = None
    shards: int = 0
    requests: int = 0


@dataclass(frozen=True)
class PlanSummary:
    """An epoch's plan in numbers: per window and totals.

    Made by :meth:`EpochPlan.summary`, ``BatchStream.summary()`` and
    :func:`plan_epoch`; nothing is read to make it.

    Attributes
    ----------
    windows : tuple of WindowSummary
    shuffle : str
    batch_size, n_samples, n_batches : int
    bytes_yielded : int
        Bytes of all batches of the epoch.
    dataset_bytes : int
        Decoded bytes of the arrays.
    """

    windows: tuple[WindowSummary, ...]
    shuffle: str
    batch_size: int
    n_samples: int
    n_batches: int
    bytes_yielded: int
    dataset_bytes: int

    @property
    def n_windows(self) -> int:
        """Windows (dask graphs) of the epoch."""
        return len(self.windows)

    @property
    def chunks_read(self) -> int:
        """Chunk reads of the epoch, summed over arrays."""
        return sum(sum(len(c) for c in w.chunks) for w in self.windows)

    @property
    def shards_read(self) -> int:
        """Shard reads of the epoch, summed over arrays (0 when none is sharded)."""
        return sum(w.shards for w in self.windows)

    @property
    def requests(self) -> int:
        """Store requests of the epoch, estimated (see :attr:`WindowSummary.requests`)."""
        return sum(w.requests for w in self.windows)

    @property
    def bytes_decoded(self) -> int:
        """Decoded bytes of every chunk read."""
        return sum(w.bytes_decoded for w in self.windows)

    @property
    def read_amplification(self) -> float:
        """``bytes_decoded / bytes_yielded``: how often the data is read.

        ``0.0`` for an epoch that reads and yields nothing, ``inf`` for one
        that reads chunks but yields nothing (see :func:`read_amplification`).
        """
        return read_amplification(self.bytes_decoded, self.bytes_yielded)

    @property
    def peak_window_bytes(self) -> int:
        """Largest ``bytes_held`` of a window.

        A stream holds about ``(prefetch + 1)`` such windows at once.
        """
        return max((w.bytes_held for w in self.windows), default=0)

    @property
    def n_tasks(self) -> int | None:
        """Dask tasks of the epoch (``None`` if not counted)."""
        counts = [w.tasks for w in self.windows]
        if any(c is None for c in counts):
            return None
        return sum(c for c in counts if c is not None)

    def rows(self) -> list[dict[str, int]]:
        """One dict per window, e.g. for ``pandas.DataFrame(summary.rows())``."""
        return [
            {
                "window": w.index,
                "samples": w.samples,
                "batches": w.batches,
                "chunks_read": sum(len(c) for c in w.chunks),
                "shards": w.shards,
                "requests": w.requests,
                "bytes_decoded": w.bytes_decoded,
                "bytes_held": w.bytes_held,
                "tasks": -1 if w.tasks is None else w.tasks,
            }
            for w in self.windows
        ]

    def totals(self) -> dict[str, float | int | None]:
        """The epoch's totals as a dict."""
        return {
            "windows": self.n_windows,
            "samples": self.n_samples,
            "batches": self.n_batches,
            "chunks_read": self.chunks_read,
            "shards_read": self.shards_read,
            "requests": self.requests,
            "bytes_decoded": self.bytes_decoded,
            "bytes_yielded": self.bytes_yielded,
            "read_amplification": round(self.read_amplification, 3),
            "peak_window_bytes": self.peak_window_bytes,
            "tasks": self.n_tasks,
        }

    def __str__(self) -> str:
        mib = 2**20
        lines = [
            f"epoch plan: shuffle={self.shuffle!r}, batch_size={self.batch_size}, "
            f"{self.n_samples} samples, {self.n_batches} batches, {self.n_windows} windows",
            f"  read {self.bytes_decoded / mib:.1f} MiB decoded for "
            f"{self.bytes_yielded / mib:.1f} MiB yielded "
            f"(read amplification {self.read_amplification:.2f}), "
            f"peak window {self.peak_window_bytes / mib:.1f} MiB, "
            f"{self.chunks_read} chunk reads, {self.shards_read} shard reads, "
            f"{self.requests} store requests, dask tasks {self.n_tasks}",
        ]
        shown = self.windows if len(self.windows) <= 12 else self.windows[:10]
        lines.append(
            "  window  samples  batches  chunks  shards  requests  decoded MiB  held MiB  tasks"
        )
        for w in shown:
            lines.append(
                f"  {w.index:6d}  {w.samples:7d}  {w.batches:7d}  "
                f"{sum(len(c) for c in w.chunks):6d}  {w.shards:6d}  {w.requests:8d}  "
                f"{w.bytes_decoded / mib:11.1f}  {w.bytes_held / mib:8.1f}  {w.tasks}"
            )
        if len(shown) < len(self.windows):
            lines.append(f"  ... {len(self.windows) - len(shown)} more windows")
        return "\n".join(lines)
