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

A sequential order starts small (:func:`ramp_split`): the first window is read
as windows of 1, 1, 2, 4, ... units, so the first batch waits for one unit's
read, not a whole window's; later windows are as without the ramp.  A buffered
order does not: a ramp would hand out its first batches from one chunk each
(with class-sorted data, single-class batches).  Its first window is the whole
first buffer, whose chunks the read layer decodes concurrently (the stream
reads it alone, before any other), so its first batch mixes as many chunks as
any later one and waits about what ``x[a:b]`` over those chunks costs.
``"exact"``
    A uniform permutation of all samples, split into windows of
    ``window_rows`` samples.  A window touches almost every chunk, so the data
    is read about ``ceil(n / window_rows)`` times per epoch.  The permutation
    is a keyed bijection of positions (:class:`IndexShuffle`, a Feistel
    network keyed by ``(seed, epoch)``), never held: window ``w``'s sample
    ids, positions ``w * window_rows`` onwards, are computed on their own in
    O(window) time and memory, at any ``n``.

Everything here is deterministic given ``(seed, epoch)``, and independent of
prefetch, concurrency and scheduler.  This module is the single source of truth
for "every sample exactly once".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import epoch_figures
from .batching import count_batches, samples_used
from .buffer_windows import UnitShuffle as _UnitShuffle
from .buffer_windows import unit_groups, unit_rows
from .index_shuffle import IndexShuffle
from .quality import QualityCounter
from .sampling import ClassSampler
from .shards import ShardLayout, shard_units
from .summary import PlanSummary
from .windows import (
    IndexArray,
    SampleIds,
    ShuffleMode,
    Window,
    pieces_for,
    ramp_split,
    sample_units,
    sorting_order,
)

if TYPE_CHECKING:
    from .mix import MixOrder

__all__ = ["EpochPlan", "permutation"]


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


@dataclass(frozen=True)
class EpochPlan:
    """The complete, deterministic plan of one epoch.

    Parameters
    ----------
    n_samples : int
        Length of axis 0 (shared by every array of the stream).
    offsets : tuple of ndarray
        Axis-0 chunk offsets of each array (see `chunk_offsets`).
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
        Decoded bytes of one sample of each array; lets
        [`summary`][daskzarr_batches.plan.EpochPlan.summary]
        report bytes (empty: bytes are reported as 0).
    shards : tuple of ShardLayout or None, optional
        How each array's chunks are stored (``None``: not a stored array,
        e.g. numpy; empty: unknown).  Sequential and buffered windows are
        made of whole shards when a shard fits the window (see
        `shard_units`), and [`summary`][daskzarr_batches.plan.EpochPlan.summary] counts shards and
        store
        requests.
    ramp : bool, default True
        Whether the first sequential window is split into windows of 1, 1,
        2, 4, ... units (`ramp_split`), so that the first batch waits
        for one unit's read.  Buffered windows are not ramped (the first
        batch would mix one chunk).  An exact first window is cut into
        pieces of ``b, 4 b, 16 b, ...`` samples (``b`` the batch size) below
        the chunk count and half the window, then the rest (its ids, not its
        reads, were what the first batch waited for: a window of 10**7
        samples is 1.5 s of ids and their sort; the pieces cost at most about
        4/3 of one read of the data).
    members : tuple of int, optional
        A collection's member offsets (``[0, len0, ..., n]``):
        [`summary`][daskzarr_batches.plan.EpochPlan.summary]
        then reports the source entropy of the batches (``plan.quality``).
    sampler : ClassSampler, optional
        Class-balanced or weighted sampling: the epoch is the sampler's draws
        from [`rng`][daskzarr_batches.plan.EpochPlan.rng] (``n_samples`` of them, ids over its
        labels),
        cut into windows of ``window_rows`` read like the exact shuffle's.
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
    mix: MixOrder | None = None
    members: tuple[int, ...] = ()
    sampler: ClassSampler | None = field(default=None, compare=False)
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
            One [`WindowSummary`][daskzarr_batches.plan.WindowSummary] per window and the epoch's
            totals.
        """
        return epoch_figures.summary(self, task_count)

    def quality_counter(self) -> QualityCounter:
        """An empty `QualityCounter` for this epoch's ids (and members, batches).

        A mixture's reference is an exact shuffle of its epoch's draws (each
        stratum's share of them), which draw some sources in part and cycle others.
        """
        ids = self.n_samples if self.mix is None else sum(self.mix.lengths)  # ids span all sources
        if self.sampler is not None:
            ids = self.sampler.n_ids  # draws over the labelled samples
        strata, draws = self.strata(ids), None
        if self.mix is not None:  # an exact shuffle of the epoch's draws, not of every sample
            drawn = self.mix_order()[0][: self.n_used]
            where = np.searchsorted(strata, drawn, side="right") - 1
            draws = np.bincount(where, minlength=len(strata) - 1)
        return QualityCounter(
            ids, self.members or None, self.batch_size, strata, self.n_batches, draws
        )

    def strata(self, span: int | None = None) -> IndexArray:
        """The strata of the mixing figure: the epoch's stored chunks, ``[0, ..., span]``.

        Every array's axis-0 chunk boundaries together (a patch plan's units),
        or, where those do not span the ids (a mixture's draws over its
        sources), as many equal strata as the first array has chunks.
        """
        span = self.n_samples if span is None else span
        bounds = np.unique(np.concatenate([np.asarray(o, dtype=np.int64) for o in self.offsets]))
        if len(bounds) >= 2 and bounds[0] == 0 and bounds[-1] == span:
            return bounds
        k = max(len(self.offsets[0]) - 1 if self.offsets else 1, 1)
        return np.unique((np.arange(k + 1, dtype=np.int64) * span) // k)

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
        position = 0
        for index, (samples, units) in enumerate(self._truncate(self._orders())):
            if units is not None:
                pieces = tuple(tuple(units.pieces(off)) for off in self.offsets)
            else:
                order = None if isinstance(samples, range) else sorting_order(samples)
                pieces = tuple(tuple(pieces_for(samples, off, order)) for off in self.offsets)
            yield Window(index, position, samples, pieces)
            position += len(samples)

    def window_samples(self) -> Iterator[range | SampleIds]:
        """Each window's sample ids in delivery order, as
        [`windows`][daskzarr_batches.plan.EpochPlan.windows] gives them,
        without their chunk pieces (lazily)."""
        for samples, _ in self._truncate(self._orders()):
            yield samples

    def _orders(self) -> Iterator[tuple[range | SampleIds, _UnitShuffle | None]]:
        """Each window's sample ids (and a buffered window's unit layout), untruncated."""
        orders: Iterator[tuple[range | SampleIds, _UnitShuffle | None]]
        if self.mix is not None:
            orders = ((samples, None) for samples in self._mix_orders())
        elif self.sampler is not None:
            orders = ((samples, None) for samples in self._sampler_orders())
        elif self.shuffle == "none":
            orders = ((samples, None) for samples in self._sequential_orders())
        elif self.shuffle == "buffer":
            orders = self._buffered_orders()
        elif self.shuffle == "exact":
            orders = ((samples, None) for samples in self._exact_orders())
        else:  # pragma: no cover - guarded by the public API
            raise ValueError(f"unknown shuffle mode {self.shuffle!r}")
        return orders

    def windows_between(self, first: int, end: int, index: int = 0) -> Iterator[Window]:
        """The windows that deliver epoch positions ``first:end``, cut to them.

        A sequential order is the same however it is cut, so its windows are
        ramped again from ``first`` (a rank's share or a resumed epoch starts
        with a one-unit window too) and numbered from ``index``; from 0 to
        [`n_used`][daskzarr_batches.plan.EpochPlan.n_used] they are
        [`windows`][daskzarr_batches.plan.EpochPlan.windows].  A shuffled order depends on
        its windows, so they are the epoch's own, a window a range starts or
        ends inside cut to its part ([`part`][daskzarr_batches.plan.EpochPlan.part]).

        Parameters
        ----------
        first : int
            Epoch positions, ``0 <= first <= end <= n_used``.
        end : int
            See ``first``.
        index : int, default 0
            Index of the first sequential window.
        """
        if self.shuffle == "none" and self.mix is None:
            for samples in self._sequential_orders(first):
                if samples.start >= end:
                    return
                samples = samples[: end - samples.start]
                pieces = tuple(tuple(pieces_for(samples, off)) for off in self.offsets)
                yield Window(index, samples.start, samples, pieces)
                index += 1
            return
        windows = self.windows() if not self._exact_alone() else self._exact_windows(first)
        for window in windows:
            start = window.position
            if start >= end:
                return
            if start + window.size > first:
                lo, hi = max(first - start, 0), min(end - start, window.size)
                yield self.part(window, lo, hi)

    def _exact_alone(self) -> bool:
        """An exact order of the plan's own samples (no mixture, no sampler)."""
        return self.shuffle == "exact" and self.mix is None and self.sampler is None

    def _exact_windows(self, first: int) -> Iterator[Window]:
        """The exact order's windows from the one holding position ``first``: O(window) each."""
        step = max(self.window_rows, 1)
        ramp = np.cumsum(self._exact_ramp())
        for lo, hi in self._exact_bounds(first):
            # the ramp's pieces are windows 0..len(ramp) - 1, then one per window_rows
            index = lo // step + len(ramp) - 1 if lo >= step else int((ramp <= lo).sum())
            samples = self._exact_ids(lo, hi)
            order = sorting_order(samples)
            pieces = tuple(tuple(pieces_for(samples, off, order)) for off in self.offsets)
            yield Window(index, lo, samples, pieces)

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
        """The buffered order's windows of units: :func:`buffer_windows.unit_groups`."""
        return unit_groups(self.units, unit_ids, self.window_rows)

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

    def _buffered_draws(self) -> Iterator[tuple[IndexArray, IndexArray, IndexArray]]:
        """Each buffered window's units (starts, stops) and its row shuffle.

        The one place a buffered epoch draws from its generator, shared by
        :meth:`windows` and :meth:`entropy`, so both see the same order.
        """
        rng = self.rng()
        unit_order = rng.permutation(len(self.units) - 1)
        for group in self._unit_groups(unit_order.tolist()):
            starts, stops = self.units[group], self.units[np.asarray(group) + 1]
            # numpy's Generator draws the same swaps for permutation(array) and
            # permutation(len(array)): samples[shuffle] is rng.permutation(samples)
            # (tests/plan/test_plan.py checks it), and the shuffle gives the pieces.
            yield starts, stops, rng.permutation(int((stops - starts).sum()))

    def expected_entropy(self, most_pairs: int = 2**24) -> float | None:
        """A buffered epoch's neighbour entropy given its windows, in expectation.

        The epoch's windows are its own (this ``(seed, epoch)``'s unit
        permutation, grouped as [`windows`][daskzarr_batches.plan.EpochPlan.windows] groups it);
        only each
        window's row shuffle is taken in expectation: a window of ``R`` rows
        whose first ``m`` are delivered has ``m - 1`` neighbour pairs, each an
        ordered pair of two of its rows drawn uniformly, and a window's first
        row follows the previous window's last.  The histogram is summed in
        closed form over pairs of units (`pair_bins`), so it costs per
        pair of units in a window, not per row (for 10**8 samples in 24,415
        chunks and buffers of 8 chunks, 0.2 M pairs), in batches of about
        2**20 pairs.  The realised figure
        differs by the plug-in noise of ``n - 1`` differences (a few 1e-5 of
        the exact figure for 10**7 samples).  ``None``: more than
        ``most_pairs`` pairs (many units a window), or not a buffered row
        order.
        """
        return epoch_figures.expected_entropy(self, most_pairs)

    def expected_mixing(self) -> float | None:
        """A buffered epoch's batch mixing given its windows, in expectation.

        The epoch's own windows (this ``(seed, epoch)``'s unit permutation,
        grouped as [`windows`][daskzarr_batches.plan.EpochPlan.windows] groups it); each batch is
        taken as
        ``batch_size`` rows drawn from its window (the window's row shuffle in
        expectation, a batch straddling two windows counted in the first),
        whose expected bits over the strata are those of binomial counts of
        the window's strata shares (`expected_batch_bits`).  The mean
        over the delivered batches, weighted by the batches each window
        delivers, over an exact shuffle's (`exact_mixing_bits`), at most
        1: what ``shuffle_buffer_size="auto"`` holds a candidate buffer to.
        Costs per unit and distinct strata share, never per row.  A mixture's
        buffered windows deliver each source's own order in the schedule's
        (not a row shuffle of the window): its figure is the planned one,
        counted batch by batch over its draws (`planned_mixing`, per
        sample).  ``None``: not a buffered order.
        """
        return epoch_figures.expected_mixing(self)

    def _buffered_orders(self) -> Iterator[tuple[IndexArray, _UnitShuffle]]:
        for starts, stops, shuffle in self._buffered_draws():
            yield unit_rows(starts, stops)[shuffle], _UnitShuffle.of(starts, stops, shuffle)

    def entropy(self) -> float:
        """The epoch's neighbour entropy, as a fraction of an exact shuffle's.

        ``summary().quality.entropy``, from the ids alone (no pieces, no
        displacement or sources): what ``shuffle_buffer_size="auto"`` checks
        a candidate buffer against for this ``(seed, epoch)``.
        """
        counter = self.quality_counter()
        if self.shuffle == "buffer" and self.mix is None:
            remaining = self.n_used
            for starts, stops, shuffle in self._buffered_draws():
                if remaining <= 0:
                    break
                ids = unit_rows(starts, stops)[shuffle[:remaining]]
                counter.add_neighbours(ids)
                remaining -= len(ids)
        else:
            for samples, _ in self._truncate(self._orders()):
                counter.add_neighbours(samples)
        return counter.quality().entropy

    def mix_order(self) -> tuple[SampleIds, IndexArray]:
        """A mixture's ``(sample ids, source)`` per draw of this epoch (``mix`` set)."""
        assert self.mix is not None
        return self.mix.order(self.shuffle, self.window_rows, self.seed, self.epoch, self.ramp)

    def _mix_orders(self) -> Iterator[SampleIds]:
        assert self.mix is not None
        order = self.mix_order()[0][: self.n_used]
        ends = self.mix.window_ends(
            self.shuffle, self.window_rows, self.seed, self.epoch, self.ramp
        )
        if ends is None:  # every window_rows draws
            step = max(self.window_rows, 1)
            ends = np.arange(step, len(order) + step, step)
        lo = 0
        for end in ends.tolist():
            if lo >= len(order):
                return
            yield order[lo:end]
            lo = end

    def _sampler_orders(self) -> Iterator[SampleIds]:
        """A :class:`ClassSampler`'s draws of this epoch, in windows of ``window_rows``."""
        assert self.sampler is not None
        order = self.sampler.order(self.rng())[: self.n_used]
        step = max(self.window_rows, 1)
        for lo in range(0, len(order), step):
            yield order[lo : lo + step]

    def index_shuffle(self) -> IndexShuffle:
        """The exact order's bijection of positions to sample ids, keyed by ``(seed, epoch)``."""
        return IndexShuffle.of(self.n_samples, self.seed, self.epoch)

    def _exact_ramp(self) -> list[int]:
        """How the exact order's first window is cut: ``b, 4 b, 16 b, ...`` samples, then the rest.

        ``b`` is the batch size.  A piece of ``m`` samples touches at most
        ``m`` chunks, so pieces stop below the chunk count (past it a piece
        reads the data as a whole window does) and below half the window:
        the ramp costs at most about 4/3 of one read of the data, and the
        first batch waits for ``b`` samples' ids and chunks instead of a
        window's.  Later windows keep their bounds (multiples of
        ``window_rows``).  Without the plan's ``ramp``: the window whole.
        """
        step = max(self.window_rows, 1)
        chunks = max((len(off) - 1 for off in self.offsets), default=0)
        sizes: list[int] = []
        size, total = max(self.batch_size, 1), 0
        while self.ramp and size < chunks and total + size <= step // 2:
            sizes.append(size)
            total, size = total + size, size * 4
        return [*sizes, step - total]

    def _exact_orders(self, first: int = 0) -> Iterator[SampleIds]:
        # window w is positions [w * step, (w + 1) * step) of the keyed bijection, each
        # computed on its own in O(step): the permutation is never held; the first is
        # cut by the ramp (the order is the same however it is cut)
        for lo, hi in self._exact_bounds(first):
            yield self._exact_ids(lo, hi)

    def _exact_ids(self, lo: int, hi: int) -> SampleIds:
        """The exact order's sample ids at positions ``lo:hi`` (int32 below 2**31 samples)."""
        ids = self.index_shuffle().window(lo, hi)
        return ids.astype(np.int32) if self.n_samples < 2**31 else ids

    def _exact_bounds(self, first: int = 0) -> Iterator[tuple[int, int]]:
        """The exact windows' position bounds, from the one holding ``first``."""
        step = max(self.window_rows, 1)
        lo = 0
        for size in self._exact_ramp():
            if lo >= self.n_used:
                return
            hi = min(lo + size, self.n_used)
            if hi > first:
                yield lo, hi
            lo = hi
        for lo in range(max(step, first - first % step), self.n_used, step):
            yield lo, min(lo + step, self.n_used)
