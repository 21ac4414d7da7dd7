"""Mixtures: a seeded, weighted interleave of several sources' epoch orders.

Pure index math.  A mixture's epoch is a sequence of *draws*; draw ``i``
takes the next sample of source ``source[i]`` in that source's own epoch
order (the order its stream alone would give: :class:`EpochPlan` over the
source, any shuffle mode), cycling it when the stop rule draws more than the
source holds.  How many draws each source gets per epoch is fixed by the stop
rule and the weights (:func:`mix_counts`, the same every epoch, so an epoch's
length and a rank's steps never change); where they fall is drawn per
``(seed, epoch)`` by stratified sampling: source ``k``'s ``j``-th draw lands
at time ``(j + u) / c_k`` (``u`` uniform), the draws of all sources merged by
time.  Every prefix of the epoch then holds each source's share to within
``K + 1`` draws (``K`` sources), so windows and batches are mixed as the whole epoch is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .epoch import EpochPlan
from .shards import ShardLayout
from .windows import IndexArray, ShuffleMode

__all__ = ["STOP_RULES", "MixOrder", "StopRule", "mix_counts", "mix_seed"]

StopRule = Literal["first_exhausted", "all_exhausted", "never"]
STOP_RULES: tuple[str, ...] = ("first_exhausted", "all_exhausted", "never")


def mix_seed(seed: int, source: int) -> int:
    """The seed of source ``source``'s own order in a mixture drawn with ``seed``.

    A stream over that source alone with this seed (same shuffle settings
    and epoch) yields the source's samples in the order the mixture draws them.
    """
    state = np.random.SeedSequence(seed, spawn_key=(1, source)).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


def mix_counts(
    lengths: Sequence[int], weights: Sequence[float], stop: str, samples: int | None
) -> np.ndarray:
    """Draws per source in one epoch (int64), from the stop rule.

    ``first_exhausted``: the epoch ends when the source that runs out first
    (relative to its weight) is used up, every other source drawn by its
    weight, each sample at most once.  ``all_exhausted``: it ends when the
    last one is used up, the others cycled (each sample at least once).
    ``never``: ``samples`` draws split by the weights (largest remainders),
    sources cycled.  ``samples`` caps the first two (a prefix of their
    epoch, split by the weights).
    """
    n = np.asarray(lengths, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    if stop == "first_exhausted":
        total = float(np.min(n / w))
        counts = np.minimum(n, np.rint(w * total).astype(np.int64))
        counts[np.argmin(n / w)] = n[np.argmin(n / w)]
    elif stop == "all_exhausted":
        total = float(np.max(n / w))
        counts = np.maximum(n, np.rint(w * total).astype(np.int64))
    else:
        assert samples is not None
        return _apportion(samples, w)
    if samples is not None and samples < counts.sum():
        counts = np.minimum(counts, _apportion(samples, w))
        counts = _topped(counts, n if stop == "first_exhausted" else None, samples, w)
    return counts


def _apportion(total: int, w: np.ndarray) -> np.ndarray:
    """``total`` split by weights ``w``, largest remainders first."""
    exact = w * total
    counts = np.floor(exact).astype(np.int64)
    rest = total - int(counts.sum())
    counts[np.argsort(-(exact - counts), kind="stable")[:rest]] += 1
    return counts


def _topped(counts: np.ndarray, caps: np.ndarray | None, total: int, w: np.ndarray) -> np.ndarray:
    """``counts`` raised to sum to ``total`` (never above ``caps``), most lacking first."""
    counts = counts.copy()
    while counts.sum() < total:
        lack = w * total - counts
        if caps is not None:
            lack[counts >= caps] = -np.inf
        counts[int(np.argmax(lack))] += 1
    return counts


@dataclass(frozen=True)
class MixOrder:
    """The epoch order of a mixture: which source each draw takes, and its sample id.

    Parameters
    ----------
    lengths : tuple of int
        Samples of each source.
    offsets : tuple of tuple of ndarray
        Per source, the axis-0 chunk offsets of each of its arrays (paired
        arrays: every array's chunks, so buffered units are shared blocks).
    shards : tuple of tuple of ShardLayout or None
        Per source, each array's shard layout (as :class:`EpochPlan` takes it).
    weights : tuple of float
        Positive; normalised.
    stop : {"first_exhausted", "all_exhausted", "never"}
    samples_per_epoch : int, optional
        The epoch's length for ``"never"`` (required), a cap otherwise.
    seed : int
        Seed of the schedule (where each source's draws fall).
    """

    lengths: tuple[int, ...]
    offsets: tuple[tuple[IndexArray, ...], ...] = field(repr=False)
    shards: tuple[tuple[ShardLayout | None, ...], ...] = field(repr=False)
    weights: tuple[float, ...]
    stop: str = "first_exhausted"
    samples_per_epoch: int | None = None
    seed: int = 0
    _cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, np.ndarray | None]] = field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def counts(self) -> np.ndarray:
        """Draws per source in every epoch."""
        return mix_counts(self.lengths, self.weights, self.stop, self.samples_per_epoch)

    @property
    def n_samples(self) -> int:
        """Draws per epoch: the epoch's length."""
        return int(self.counts.sum())

    @property
    def starts(self) -> np.ndarray:
        """Where each source starts in the joined sample ids (and the total)."""
        return np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    def schedule(self, epoch: int) -> np.ndarray:
        """The source of each draw of ``epoch`` (int64), stratified per source."""
        return self._draws(epoch)[0]

    def _draws(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(source, time)`` of each draw of ``epoch``, by time (stratified per source)."""
        counts = self.counts
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(0, epoch)))
        times = np.concatenate(
            [(np.arange(c) + rng.random(c)) / c for c in counts.tolist()]
        ) if counts.sum() else np.empty(0)  # fmt: skip
        source = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        by_time = np.argsort(times, kind="stable")
        return source[by_time], times[by_time]

    def source_order(
        self,
        source: int,
        shuffle: ShuffleMode,
        window_rows: int,
        seed: int,
        epoch: int,
        ramp: bool,
    ) -> np.ndarray:
        """Source ``source``'s own epoch order (local sample ids), as its stream gives it."""
        return self._source_windows(source, shuffle, window_rows, seed, epoch, ramp)[0]

    def _source_windows(
        self,
        source: int,
        shuffle: ShuffleMode,
        window_rows: int,
        seed: int,
        epoch: int,
        ramp: bool,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Source ``source``'s own order and where its own windows start in it (and end)."""
        plan = EpochPlan(
            n_samples=self.lengths[source],
            offsets=self.offsets[source],
            batch_size=1,
            drop_remainder=False,
            shuffle=shuffle,
            window_rows=window_rows,
            seed=mix_seed(seed, source) if shuffle != "none" else 0,
            epoch=epoch,
            shards=self.shards[source],
            ramp=ramp,
        )
        parts = [
            np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)  # not element by element
            if isinstance(ids, range)
            else np.asarray(ids, dtype=np.int64)
            for ids in plan.window_samples()
        ]
        edges = np.cumsum([0, *(len(p) for p in parts)]).astype(np.int64)
        return (np.concatenate(parts) if parts else np.empty(0, np.int64)), edges

    def order(
        self, shuffle: ShuffleMode, window_rows: int, seed: int, epoch: int, ramp: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(sample ids, source)`` of every draw of ``epoch``, in delivery order.

        Sample ids are the joined ids (source ``k``'s local id plus
        ``starts[k]``); ``shuffle``, ``window_rows``, ``seed`` and ``ramp``
        give each source's own order (:meth:`source_order`).  A buffered
        shuffle's draws are grouped into buffer-aligned windows
        (:meth:`window_ends`).
        """
        ids, source, _ = self._ordered(shuffle, window_rows, seed, epoch, ramp)
        return ids, source

    def window_ends(
        self, shuffle: ShuffleMode, window_rows: int, seed: int, epoch: int, ramp: bool
    ) -> np.ndarray | None:
        """Where the epoch's windows end (draw positions), or ``None``: every ``window_rows``.

        A buffered shuffle's windows hold whole buffers of every source, so each
        source chunk is decoded once per epoch (and per cycle of a cycled
        source): the source with the fewest buffers paces them, each window
        holds one of its buffers and the buffers of the other sources whose
        middle (in the schedule's time) falls within it, the draws in a window
        in the schedule's order.  A window then holds about ``sum_k c_k / c_p``
        buffers (``c`` the draws per source, ``p`` the pacing one); where one
        would exceed ``ALIGN_LIMIT`` buffers the windows are ``window_rows``
        consecutive draws instead (each window re-reads the buffers it cuts).
        """
        return self._ordered(shuffle, window_rows, seed, epoch, ramp)[2]

    def _ordered(
        self, shuffle: ShuffleMode, window_rows: int, seed: int, epoch: int, ramp: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        key = (shuffle, window_rows, seed, epoch, ramp)
        if key in self._cache:
            return self._cache[key]
        source = self.schedule(epoch)
        ids = np.empty(len(source), dtype=np.int64)
        starts = self.starts
        segments: list[np.ndarray | None] = []
        for k in range(len(self.lengths)):
            where = np.flatnonzero(source == k)
            segments.append(None)
            if not len(where):
                continue
            own, edges = self._source_windows(k, shuffle, window_rows, seed, epoch, ramp)
            ids[where] = starts[k] + own[np.arange(len(where)) % len(own)]
            cycles = -(-len(where) // len(own))
            cuts = (np.arange(cycles)[:, None] * len(own) + edges[None, :-1]).ravel()
            segments[-1] = np.append(cuts[cuts < len(where)], len(where))
        ends = None
        if shuffle == "buffer" and len(source):
            aligned = _aligned(source, segments, max(window_rows, 1))
            if aligned is not None:
                moved, ends = aligned
                ids, source = ids[moved], source[moved]
        if len(self._cache) >= 2:
            self._cache.clear()
        self._cache[key] = (ids, source, ends)
        return ids, source, ends


#: the most buffers (of ``window_rows``) a buffer-aligned mixture window may hold
ALIGN_LIMIT = 8


def _aligned(
    source: np.ndarray, segments: Sequence[np.ndarray | None], window_rows: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Draws (in time order, of ``source``) regrouped into windows of whole buffers.

    ``segments[k]``: where source ``k``'s buffers start among its draws, and
    its count of draws.  Returns the new order of the draws and the windows'
    ends, or ``None`` when a window would exceed ``ALIGN_LIMIT`` buffers.
    """
    used = [k for k, cuts in enumerate(segments) if cuts is not None]
    pace = min(used, key=lambda k: len(segments[k]))  # type: ignore[arg-type]
    cuts = segments[pace]
    assert cuts is not None
    edges = cuts[:-1] / cuts[-1]  # pacing buffers' start times: the windows' starts
    window = np.empty(len(source), dtype=np.int64)
    for k in used:
        cut = segments[k]
        assert cut is not None
        where = np.flatnonzero(source == k)
        middle = (cut[:-1] + cut[1:]) / 2 / cut[-1]
        of_segment = np.searchsorted(edges, middle, side="right") - 1
        sizes = np.diff(cut)
        window[where] = np.repeat(of_segment, sizes)
    ends = np.cumsum(np.bincount(window))
    ends = np.unique(ends[ends > 0])
    if np.diff(ends, prepend=0).max() > ALIGN_LIMIT * window_rows:
        return None
    return np.argsort(window, kind="stable"), ends
