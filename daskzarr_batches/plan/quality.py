"""Shuffle quality as numbers: of a plan (nothing read) and of what a stream delivered.

Four figures, each also given as a fraction of what an exact shuffle (a
uniform permutation) scores, so 1.0 means "as mixed as an exact shuffle":

*neighbour entropy*
    Bits of the histogram (:data:`ENTROPY_BINS` equal bins over ``(-n, n)``)
    of the differences between neighbouring sample ids.  It measures how
    *locally* mixed the order is: a small shuffle buffer keeps neighbours
    within the same few chunks, so their differences fall in a few bins.  The
    exact shuffle's value is computed in closed form (:func:`exact_entropy`).
*displacement*
    Mean ``|id - position|`` over the samples; an exact shuffle's is
    ``(n**2 - 1) / (3 n)``.  It measures how far samples travel; any shuffle
    of whole chunks scores near 1.
*mixing* (batch composition)
    Mean bits, per batch, of the distribution of a batch's samples over the
    epoch's stored chunks (the strata), over the expected bits of a batch
    drawn uniformly (:func:`exact_mixing_bits`), clipped at 1.  A buffer of
    ``k`` chunks puts at most about ``k`` chunks in a batch: the figure that
    tracks training on data stored in order.
*source entropy* (collections only)
    Mean bits, per batch (runs of ``batch_size`` delivered samples), of the
    distribution of a batch's samples over the collection's members
    (stores); the exact shuffle's value is the expected
    plug-in entropy of a batch of the same size drawn from the members'
    shares (binomial marginals, :func:`exact_source_entropy`).

:class:`QualityCounter` accumulates the three over ids fed batch by batch (a
few microseconds a batch); a plan's figure feeds its windows' ids, a stream's
feeds what it delivered.  :func:`buffer_entropy` estimates the neighbour
entropy of a buffered shuffle from a sample of its windows (the mean over
epochs), :func:`pair_bins` sums the differences of pairs of ranges in closed
form (``EpochPlan.expected_entropy``), and :func:`smallest_buffer` is the
search behind ``shuffle_buffer_size="auto"``, which holds each epoch to its
own expected batch mixing (``EpochPlan.expected_mixing``).  Pure numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ArgumentValueError
from .windows import RunIndex

__all__ = [
    "AUTO_EXACT_SAMPLES",
    "AUTO_EXPECTED_MARGIN",
    "DEFAULT_SHUFFLE_QUALITY",
    "ENTROPY_BINS",
    "LABEL_MIXING_WARNING",
    "LabelCounter",
    "QualityCounter",
    "ShuffleQuality",
    "buffer_entropy",
    "exact_entropy",
    "exact_label_distance",
    "exact_mixing_bits",
    "exact_source_entropy",
    "expected_batch_bits",
    "pair_bins",
    "smallest_buffer",
]

#: Bins of the neighbour-difference histogram (over ``(-n, n)``).
ENTROPY_BINS = 256

#: ``shuffle_quality`` of ``shuffle_buffer_size="auto"``: the fraction of an exact
#: shuffle's batch mixing (:attr:`ShuffleQuality.mixing`) the buffer must reach.
#: Measured on scikit-learn's digits, training rows sorted by label, chunks of 128,
#: batch 32, an MLP for 8 epochs, 3 seeds (``python -m benchmarks --only
#: quality-training``): buffers of mixing 0.82 trained 1.5 points below the exact
#: shuffle, of 0.88 within 0.4 points; 0.85 is the first target between them.
DEFAULT_SHUFFLE_QUALITY = 0.85

#: Neighbour entropy at length: epochs of up to this many samples are best measured by
#: their planned figure (every row shuffle drawn: about 0.1 s per candidate buffer here), a
#: longer epoch to its figure given its own windows with the rows of each window
#: shuffled in expectation (``EpochPlan.expected_entropy``: milliseconds at any
#: length) less ``AUTO_EXPECTED_MARGIN`` (measured from 1e7 to 1e8 samples, chunks of
#: 4,096 to 65,536 rows, buffers of 2 to 30 chunks: within 7e-5 of the planned figure).
AUTO_EXACT_SAMPLES = 2**23
AUTO_EXPECTED_MARGIN = 0.0005

#: Neighbour differences :func:`buffer_entropy` draws per estimate, and the windows
#: they are drawn from.
ESTIMATE_DRAWS = 2**17
ESTIMATE_WINDOWS = 64


def _bins(diffs: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """The histogram bin of each difference (``-n < d < n``): ``(d + n) * bins // 2n``."""
    return np.clip(((diffs + n) * ENTROPY_BINS) // (2 * n), 0, ENTROPY_BINS - 1)


def _entropy(counts: npt.NDArray[np.int64] | npt.NDArray[np.float64]) -> float:
    total = counts.sum()
    if total <= 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


@functools.lru_cache(maxsize=64)
def exact_entropy(n: int) -> float:
    """Neighbour entropy (bits) of a uniform permutation of ``n`` samples, in the limit.

    Two neighbours of a uniform permutation differ by ``d != 0`` with
    probability ``(n - |d|) / (n (n - 1))``; the bins sum that in closed form.
    An observed order of ``m`` differences scores about ``(bins - 1) / (2 m
    ln 2)`` bits less (the plug-in bias: 0.001 bits for ``m = 2e5``).
    """
    if n < 2:
        return 0.0

    def below(x: int) -> int:  # sum of (n - |d|) for d in [-(n - 1), x]
        if x < -(n - 1):
            return 0
        if x < 0:
            return (n + x) * (n + x + 1) // 2
        x = min(x, n - 1)
        return n * (n - 1) // 2 + (x + 1) * n - x * (x + 1) // 2

    mass = []
    for b in range(ENTROPY_BINS):
        lo = -((-2 * n * b) // ENTROPY_BINS) - n  # first d of bin b
        hi = -((-2 * n * (b + 1)) // ENTROPY_BINS) - n - 1
        total = below(hi) - below(lo - 1)
        if lo <= 0 <= hi:
            total -= n  # d = 0 never happens in a permutation
        mass.append(total)
    return _entropy(np.asarray(mass, dtype=np.float64))


def exact_displacement(n: int) -> float:
    """Mean ``|sigma(i) - i|`` of a uniform permutation of ``n``: ``(n**2 - 1) / (3 n)``."""
    return (n * n - 1) / (3 * n) if n > 0 else 0.0


@functools.lru_cache(maxsize=64)
def _exact_source_entropy(sizes: tuple[int, ...], batch: int) -> float:
    total = sum(sizes)
    p = np.asarray([s / total for s in sizes if s > 0])
    if len(p) <= 1 or batch < 1:
        return 0.0
    x = np.arange(batch + 1)
    log_choose = np.asarray(
        [math.lgamma(batch + 1) - math.lgamma(k + 1) - math.lgamma(batch - k + 1) for k in x]
    )
    share = x / batch
    term = np.zeros(batch + 1)
    term[1:] = -share[1:] * np.log2(share[1:])
    expected = 0.0
    for lo in range(0, len(p), 256):  # bounded memory for many members
        part = p[lo : lo + 256, None]
        with np.errstate(divide="ignore"):
            logpmf = log_choose + x * np.log(part) + (batch - x) * np.log1p(-part)
        expected += float((np.exp(logpmf) * term).sum())
    return expected


def exact_source_entropy(sizes: tuple[int, ...], batch: int) -> float:
    """Expected bits of a batch's members under an exact shuffle.

    A batch of ``batch`` samples drawn uniformly holds about ``Binomial(batch,
    p_m)`` samples of member ``m`` (``p_m``: its share of the samples); this is
    the expectation of the plug-in entropy ``-sum (c_m / batch) log2(c_m /
    batch)`` under those marginals.
    """
    return _exact_source_entropy(tuple(int(s) for s in sizes), int(batch))


@functools.lru_cache(maxsize=64)
def _exact_mixing_bits(sizes: tuple[int, ...], batch: int) -> float:
    """:func:`exact_mixing_bits` of strata of these sizes (equal ones computed once)."""
    values, repeats = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
    total = int(values @ repeats) if len(values) else 0
    if total <= 0 or batch < 1:
        return 0.0
    pairs = zip(values.tolist(), repeats.tolist(), strict=True)
    return float(sum(r * _share_bits(v / total, batch) for v, r in pairs))


@functools.lru_cache(maxsize=4096)
def _share_bits(p: float, batch: int) -> float:
    """``E[-(c / batch) log2(c / batch)]`` for ``c ~ Binomial(batch, p)``."""
    if p <= 0 or p >= 1 or batch < 1:
        return 0.0
    x, pmf = _binomial_pmf(p, batch)
    share = x[1:] / batch
    return float((pmf[1:] * -share * np.log2(share)).sum())


def _binomial_pmf(p: float, batch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """``k`` and ``P(c = k)`` for ``c ~ Binomial(batch, p)``, ``k = 0..batch`` (0 < p < 1)."""
    x = np.arange(batch + 1)
    log_choose = math.lgamma(batch + 1) - np.asarray(
        [math.lgamma(k + 1) + math.lgamma(batch - k + 1) for k in x]
    )
    return x, np.exp(log_choose + x * math.log(p) + (batch - x) * math.log1p(-p))


def expected_batch_bits(shares: npt.ArrayLike, batch: int) -> npt.NDArray[np.float64]:
    """Each stratum's term of a batch's expected bits: ``share`` the stratum's share.

    The sum over a window's strata is the expected plug-in entropy of a
    batch of ``batch`` samples drawn from it (binomial marginals, as
    :func:`exact_source_entropy`); equal shares (equal chunks) are computed
    once.
    """
    shares = np.asarray(shares, dtype=np.float64)
    values, where = np.unique(np.round(shares, 12), return_inverse=True)
    terms = np.asarray([_share_bits(float(v), int(batch)) for v in values.tolist()])
    return terms[where.ravel()] if len(shares) else np.zeros(0)


def exact_mixing_bits(strata: npt.ArrayLike, batch: int) -> float:
    """Expected bits of a batch's strata under an exact shuffle.

    ``strata``: the strata bounds ``[0, ..., n]`` (the epoch's stored chunks).
    A batch of ``batch`` samples drawn uniformly holds about ``Binomial(batch,
    p_s)`` samples of stratum ``s`` (``p_s``: its share of the samples); the
    expectation of the plug-in entropy under those marginals, as
    :func:`exact_source_entropy` (drawn without replacement, the counts vary
    a little less, so an exact shuffle scores a hair above: the figure is
    clipped at 1).  Strata of equal size are computed once, so many chunks
    cost what their distinct sizes cost.
    """
    sizes = np.diff(np.asarray(strata, dtype=np.int64))
    return _exact_mixing_bits(tuple(sizes.tolist()), int(batch))


class _Mixing:
    """Per-batch entropy of the strata histogram, accumulated in delivery order.

    Sparse: a piece's samples become ``(batch, stratum)`` entries (a run of
    consecutive ids: one entry per segment between batch and stratum
    edges), so the cost is per sample (or per segment), never per
    ``batch x strata`` cell.  The unfinished batch is carried as entries.
    """

    __slots__ = ("batches", "bits", "bounds", "carry", "exact", "k", "size")

    def __init__(self, bounds: npt.NDArray[np.int64], batch_size: int) -> None:
        self.bounds = bounds
        self.k = max(len(bounds) - 1, 1)
        self.size = batch_size
        self.exact = exact_mixing_bits(bounds, batch_size)
        self.bits = 0.0
        self.batches = 0
        empty = np.zeros(0, dtype=np.int64)
        self.carry: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] = (empty, empty)

    def stratum(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return np.clip(np.searchsorted(self.bounds, ids, side="right") - 1, 0, self.k - 1)

    def add(self, ids: npt.NDArray[np.int64], before: int) -> None:
        """``ids`` delivered after ``before`` samples."""
        n = len(ids)
        batch = (before + np.arange(n, dtype=np.int64)) // self.size - before // self.size
        self._entries(batch, self.stratum(ids), np.ones(n, dtype=np.int64), before, n)

    def add_run(self, lo: int, n: int, before: int) -> None:
        """Ids ``lo, lo + 1, ..., lo + n - 1`` delivered after ``before`` samples."""
        size = self.size
        first = before // size
        inner = self.bounds[(self.bounds > lo) & (self.bounds < lo + n)] - lo
        cuts = np.arange((first + 1) * size - before, n, size, dtype=np.int64)
        edges = np.unique(np.concatenate([[0, n], inner, cuts]))
        starts, lengths = edges[:-1], np.diff(edges)
        batch = (before + starts) // size - first
        self._entries(batch, self.stratum(lo + starts), lengths, before, n)

    def _entries(
        self,
        batch: npt.NDArray[np.int64],
        stratum: npt.NDArray[np.int64],
        count: npt.NDArray[np.int64],
        before: int,
        n: int,
    ) -> None:
        carried, carried_counts = self.carry
        if len(carried):
            batch = np.concatenate([np.zeros(len(carried), dtype=np.int64), batch])
            stratum = np.concatenate([carried, stratum])
            count = np.concatenate([carried_counts, count])
        key, where = np.unique(batch * self.k + stratum, return_inverse=True)
        cells = np.bincount(where.ravel(), weights=count).astype(np.int64)
        rows = key // self.k
        totals = np.bincount(rows, weights=cells)
        p = cells / totals[rows]
        bits = np.bincount(rows, weights=-p * np.log2(p))
        last = int(rows[-1])
        whole = last + 1 if (before + n) % self.size == 0 else last
        self.bits += float(bits[:whole].sum())
        self.batches += whole
        if whole <= last:
            mine = rows == last
            self.carry = (key[mine] % self.k, cells[mine])
        else:
            empty = np.zeros(0, dtype=np.int64)
            self.carry = (empty, empty)

    def figure(self) -> tuple[float, float]:
        """``(mixing, bits per batch)``: an unfinished batch counts as one."""
        total, batches = self.bits, self.batches
        if len(self.carry[1]):
            total += _entropy(self.carry[1])
            batches += 1
        bits = total / batches if batches else 0.0
        if self.exact <= 0:
            return 1.0, bits
        return min(bits / self.exact, 1.0), bits


@dataclass(frozen=True)
class ShuffleQuality:
    """How well mixed an epoch's order is, beside an exact shuffle's.

    Made by ``plan_epoch(...).quality`` / ``stream.summary().quality`` (the
    plan, nothing read) and ``stream.stats.quality`` (what the stream
    delivered so far).  See ``docs/streams.md``, *Shuffle quality*.

    Attributes
    ----------
    samples : int
        Samples the figures are taken over.
    entropy : float
        Neighbour entropy, as a fraction of an exact shuffle's
        (``entropy_bits / exact_entropy_bits``).
    entropy_bits, exact_entropy_bits : float
        Bits of the histogram of neighbouring id differences
        (``ENTROPY_BINS`` bins over ``(-n, n)``), observed and of an exact
        shuffle of ``n`` samples.
    displacement : float
        Mean ``|sample id - epoch position|`` as a fraction of an exact
        shuffle's, ``(n**2 - 1) / (3 n)``.
    source_entropy : float or None
        Collections: mean bits of the members within a batch, as a fraction of
        an exact shuffle's expected value; ``None`` for one array.
    source_entropy_bits : float or None
        That mean, in bits.
    mixing : float or None
        Batch composition: the mean bits, per batch, of the distribution of
        a batch's samples over the epoch's stored chunks (the strata), as a
        fraction of an exact shuffle's expected value (clipped to ``[0, 1]``).
        A buffer of ``k`` chunks cannot put more than about ``k`` chunks in a
        batch, so this is the figure that falls when a batch holds a few
        neighbouring regions of a store written in order (one class, one
        time span); see ``docs/streams.md``, *Shuffle quality*.  ``None``
        where the counter was given no strata.
    mixing_bits, exact_mixing_bits : float or None
        That mean in bits, and an exact shuffle's expectation.
    label_mixing : float or None
        Streams told which array holds discrete labels (``labels=``): the
        mean overlap of a batch's label distribution with the epoch's (the
        labels delivered so far), ``1 - total variation``, as a fraction of
        an exact shuffle's expected overlap, clipped to ``[0, 1]`` (1.0:
        batches as representative as an exact shuffle's; a batch of one
        class among ten equal ones overlaps 0.1).  Below
        ``LABEL_MIXING_WARNING`` (0.85) the stream warns at the end of its
        epoch.  ``None`` for plans and streams without labels.
    label_distance : float or None
        That mean total-variation distance (0: every batch has the epoch's
        label distribution; 1: batches share no label with the rest).
    """

    samples: int
    entropy: float
    entropy_bits: float
    exact_entropy_bits: float
    displacement: float
    source_entropy: float | None = None
    source_entropy_bits: float | None = None
    mixing: float | None = None
    mixing_bits: float | None = None
    exact_mixing_bits: float | None = None
    label_mixing: float | None = None
    label_distance: float | None = None

    def __str__(self) -> str:
        text = (
            f"neighbour entropy {self.entropy:.3f} of exact ({self.entropy_bits:.2f} of "
            f"{self.exact_entropy_bits:.2f} bits), displacement {self.displacement:.3f}"
        )
        if self.source_entropy is not None:
            text += f", sources per batch {self.source_entropy:.3f}"
        if self.mixing is not None:
            text += f", batch mixing {self.mixing:.3f}"
        if self.label_mixing is not None:
            text += f", label mixing {self.label_mixing:.3f}"
        return text


class QualityCounter:
    """The figures of :class:`ShuffleQuality`, accumulated over ids fed in delivery order.

    ``add(ids, positions)`` takes the next samples delivered (sample ids and
    their epoch positions), in pieces of any size: batches are the runs of
    ``batch_size`` samples from the first one (as a stream cuts them), and
    the neighbour difference across two pieces counts, so feeding an order
    in any cuts gives the same figures as feeding it whole.  Vectorised per
    piece: a stream feeds each window once its batches are handed out.

    Parameters
    ----------
    n : int
        Samples the ids are drawn from.
    members : sequence of int, optional
        Offsets of a collection's members (``[0, len0, len0 + len1, ..., n]``):
        enables the source entropy.
    batch_size : int, default 1
        Samples per batch, for the source entropy and the mixing.
    strata : sequence of int, optional
        Bounds of the strata (``[0, ..., n]``: the epoch's stored chunks)
        whose per-batch histogram the mixing figure takes; without it, no
        mixing figure.
    """

    __slots__ = (
        "_bins",
        "_distance",
        "_exact_sources",
        "_last",
        "_members",
        "_mixing",
        "_partial",
        "_runs",
        "_source_bits",
        "batch_size",
        "batches",
        "n",
        "samples",
    )

    def __init__(
        self,
        n: int,
        members: npt.ArrayLike | None = None,
        batch_size: int = 1,
        strata: npt.ArrayLike | None = None,
    ) -> None:
        self.n = max(int(n), 1)
        self.batch_size = max(int(batch_size), 1)
        self._bins = np.zeros(ENTROPY_BINS, dtype=np.int64)
        self._last: int | None = None
        self._distance = 0
        self.samples = 0
        self.batches = 0  # complete batches counted in the source entropy
        self._source_bits = 0.0
        self._members: npt.NDArray[np.int64] | None = None
        self._partial: npt.NDArray[np.int64] | None = None  # members of an unfinished batch
        self._exact_sources = 0.0
        if members is not None:
            bounds = np.asarray(members, dtype=np.int64)
            if len(bounds) > 2:
                self._members = bounds[1:-1]
                self._runs = RunIndex(bounds)
                self._partial = np.zeros(len(bounds) - 1, dtype=np.int64)
                sizes = tuple(np.diff(bounds).tolist())
                self._exact_sources = exact_source_entropy(sizes, self.batch_size)
        self._mixing: _Mixing | None = None
        if strata is not None:
            self._mixing = _Mixing(np.asarray(strata, dtype=np.int64), self.batch_size)

    def add(self, ids: npt.ArrayLike, positions: npt.ArrayLike) -> None:
        """Count the next delivered samples: ``ids`` at epoch ``positions``.

        Runs (``range`` ids and positions: a sequential window) are counted
        without an array: the same figures, in constant time.
        """
        if isinstance(ids, range) and isinstance(positions, range):
            if len(positions) != len(ids):
                raise ValueError(f"{len(ids)} ids at {len(positions)} positions")
            if (self._members is None and self._mixing is None) or ids.step == 1:
                if self._members is not None and len(ids):
                    self._add_sources_run(ids)
                if self._mixing is not None and len(ids):
                    self._mixing.add_run(ids.start, len(ids), self.samples)
                self._add_run(ids, positions)
                return
        if isinstance(ids, range):
            ids = np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)
        if isinstance(positions, range):
            positions = np.arange(positions.start, positions.stop, positions.step, dtype=np.int64)
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return
        self.add_neighbours(ids)
        self._distance += int(np.abs(ids - np.asarray(positions, dtype=np.int64)).sum())
        if self._members is not None:
            self._add_sources(ids)
        if self._mixing is not None:
            self._mixing.add(ids, self.samples)
        self.samples += len(ids)

    def add_neighbours(self, ids: npt.ArrayLike) -> None:
        """Count the next samples for the neighbour entropy only (no displacement, sources).

        What :meth:`EpochPlan.entropy` feeds: the entropy of the ids fed
        through here alone equals that of the same ids through :meth:`add`.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return
        diffs = np.diff(ids) if self._last is None else np.diff(ids, prepend=self._last)
        self._bins += np.bincount(_bins(diffs, self.n), minlength=ENTROPY_BINS)
        self._last = int(ids[-1])

    def _add_run(self, ids: range, positions: range) -> None:
        """:meth:`add` of a run: every difference but the first is the step."""
        n = len(ids)
        if n == 0:
            return
        if len(positions) != n:
            raise ValueError(f"{n} ids at {len(positions)} positions")
        first = [] if self._last is None else [ids[0] - self._last]
        diffs = np.asarray(first + [ids.step] * min(n - 1, 1), dtype=np.int64)
        weights = np.asarray([1] * len(first) + [n - 1] * min(n - 1, 1), dtype=np.int64)
        np.add.at(self._bins, _bins(diffs, self.n), weights)
        self._last = int(ids[-1])
        offset, drift = ids[0] - positions[0], ids.step - positions.step
        if drift == 0:
            self._distance += n * abs(offset)
        else:
            gaps = offset + drift * np.arange(n, dtype=np.int64)
            self._distance += int(np.abs(gaps).sum())
        self.samples += n

    def _add_sources(self, ids: npt.NDArray[np.int64]) -> None:
        assert self._members is not None and self._partial is not None
        k, size = len(self._partial), self.batch_size
        batch = (self.samples + np.arange(len(ids))) // size
        batch -= batch[0]
        member = self._runs(ids)
        rows = int(batch[-1]) + 1
        counts = np.bincount(batch * k + member, minlength=rows * k).reshape(rows, k)
        counts[0] += self._partial
        whole = rows if (self.samples + len(ids)) % size == 0 else rows - 1
        self._source_bits += float(_row_entropy(counts[:whole]).sum())
        self.batches += whole
        self._partial = counts[rows - 1] if whole < rows else np.zeros(k, dtype=np.int64)

    def _add_sources_run(self, ids: range) -> None:
        """:meth:`_add_sources` of consecutive ids: only the batches a member starts in mix.

        A batch within one member has no source entropy; the others (those a
        member boundary falls in, and the first and last, which carry an
        unfinished batch) are counted as :meth:`_add_sources` counts them.
        """
        assert self._members is not None and self._partial is not None
        n, size, k = len(ids), self.batch_size, len(self._partial)
        first = self.samples // size
        rows = (self.samples + n - 1) // size - first + 1
        lo = ids.start
        starts = self._members[(self._members > lo) & (self._members < lo + n)] - lo
        mixed = np.unique(np.concatenate([[0, rows - 1], (self.samples + starts) // size - first]))
        whole = rows if (self.samples + n) % size == 0 else rows - 1
        bits, last = 0.0, np.zeros(k, dtype=np.int64)
        for row in mixed.tolist():
            a = max(0, (first + row) * size - self.samples)
            b = min(n, (first + row + 1) * size - self.samples)
            counts = self._runs.counts(lo + a, lo + b)
            if row == 0:
                counts += self._partial
            if row < whole:
                bits += _entropy(counts)
            else:
                last = counts
        self._source_bits += bits
        self.batches += whole
        self._partial = last

    def quality(self) -> ShuffleQuality:
        """The figures over every id added so far (an unfinished batch counts as one)."""
        bits = _entropy(self._bins)
        exact = exact_entropy(self.n)
        mean = self._distance / self.samples if self.samples else 0.0
        sources = bits_per_batch = None
        if self._partial is not None:
            total, batches = self._source_bits, self.batches
            if self._partial.any():
                total += _entropy(self._partial)
                batches += 1
            bits_per_batch = total / batches if batches else 0.0
            sources = bits_per_batch / self._exact_sources if self._exact_sources else 1.0
        mixing = mixing_bits = exact_mixing = None
        if self._mixing is not None:
            mixing, mixing_bits = self._mixing.figure()
            exact_mixing = self._mixing.exact
        return ShuffleQuality(
            samples=self.samples,
            entropy=bits / exact if exact else 1.0,
            entropy_bits=bits,
            exact_entropy_bits=exact,
            displacement=mean / far if (far := exact_displacement(self.n)) else 1.0,
            source_entropy=sources,
            source_entropy_bits=bits_per_batch,
            mixing=mixing,
            mixing_bits=mixing_bits,
            exact_mixing_bits=exact_mixing,
        )


def _row_entropy(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Bits of each row's distribution."""
    if len(counts) == 0:
        return np.zeros(0)
    p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    logs = np.log2(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(axis=1)


def pair_bins(
    a: npt.NDArray[np.int64],
    p: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
    q: npt.NDArray[np.int64],
    weight: npt.NDArray[np.float64],
    n: int,
) -> npt.NDArray[np.float64]:
    """The histogram (:data:`ENTROPY_BINS` bins over ``(-n, n)``) of ``x - y`` over pairs of ranges.

    Pair ``i`` counts every ``x`` in ``[a, a + p)`` and ``y`` in ``[b, b + q)``
    once, times ``weight[i]``, in closed form (the differences of two ranges
    form a trapezoid; its mass in a bin is a difference of the counts below
    the bin's edges), so the cost is per pair and bin touched, not per row.
    """
    a, p, b, q = (np.asarray(v, dtype=np.int64) for v in (a, p, b, q))
    weight = np.asarray(weight, dtype=np.float64)
    lo_d, hi_d = a - b - q + 1, a - b + p - 1  # the differences' range
    first, last = _bins(lo_d, n), _bins(hi_d, n)
    one = first == last  # most pairs: the whole trapezoid in one bin
    hist = np.zeros(ENTROPY_BINS, dtype=np.float64)
    hist += np.bincount(first[one], weights=(p * q * weight)[one], minlength=ENTROPY_BINS)
    if one.all():
        return hist
    a, p, b, q, weight, first, last = (v[~one] for v in (a, p, b, q, weight, first, last))
    span = last - first + 1
    pair = np.repeat(np.arange(len(a)), span)
    within = np.arange(len(pair)) - np.repeat(np.cumsum(span) - span, span)
    bin_ = first[pair] + within
    edges = -((-2 * n * np.arange(ENTROPY_BINS + 1)) // ENTROPY_BINS) - n  # first d of bin
    edges[0], edges[-1] = np.iinfo(np.int64).min // 4, np.iinfo(np.int64).max // 4
    pa, pp, pb, pq = a[pair], p[pair], b[pair], q[pair]

    def below(t: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        # pairs with x - y <= t: sum over y of clip(t - a + b + v + 1, 0, p), v < q
        t = np.clip(t, pa - pb - pq, pa - pb + pp)  # saturated beyond the trapezoid
        s = (t - pa + pb + 1).astype(np.float64)
        fp, fq = pp.astype(np.float64), pq.astype(np.float64)

        def upto(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:  # sum clip(w,0,p), w<=z
            z = np.maximum(z, 0.0)
            low = np.minimum(z, fp)
            return low * (low + 1) / 2 + np.maximum(z - fp, 0.0) * fp

        return upto(s + fq - 1) - upto(s - 1)

    mass = below(edges[bin_ + 1] - 1) - below(edges[bin_] - 1)
    hist += np.bincount(bin_, weights=mass * weight[pair], minlength=ENTROPY_BINS)
    return hist


def buffer_entropy(units: npt.NDArray[np.int64], window_rows: int, seed: int = 0) -> float:
    """Estimated neighbour entropy of a buffered shuffle, as a fraction of an exact one's.

    The plan permutes the units (``units``: their offsets, ``[0, ..., n]``),
    groups consecutive ones into windows of at least ``window_rows`` samples
    and permutes each window's rows, so neighbours are two samples drawn from
    one window, and an epoch's histogram mixes its windows'.  This simulates
    epochs of seeded unit permutations, drawing about ``ESTIMATE_DRAWS /
    ESTIMATE_WINDOWS`` pairs per window (in proportion to its rows) from
    ``ESTIMATE_WINDOWS`` windows in all, and returns the mean entropy of an
    epoch's differences (Miller-Madow corrected for the few draws) over
    :func:`exact_entropy`.  An epoch of more windows
    is cut at ``ESTIMATE_WINDOWS``: its mixture then covers fewer bins than
    the whole epoch's, so the estimate errs low (a larger buffer).  A few
    milliseconds whatever ``n`` (the permutation of the units is the largest
    cost).  Cached by the units and the window.
    """
    units = np.ascontiguousarray(units, dtype=np.int64)
    digest = f"{len(units)}:{hash(units.tobytes())}"
    return _buffer_entropy(digest, units, int(window_rows), int(seed))


_ESTIMATES: dict[tuple[str, int, int], float] = {}


def _buffer_entropy(
    digest: str, units: npt.NDArray[np.int64], window_rows: int, seed: int
) -> float:
    key = (digest, window_rows, seed)  # within this process
    if key in _ESTIMATES:
        return _ESTIMATES[key]
    units = np.asarray(units, dtype=np.int64)
    n = int(units[-1] - units[0])
    sizes = np.diff(units)
    rng = np.random.default_rng(seed)
    per_window = max(ESTIMATE_DRAWS // ESTIMATE_WINDOWS, 2)
    epochs: list[float] = []
    windows = 0
    while windows < ESTIMATE_WINDOWS and len(sizes):
        # one epoch's windows (at most ESTIMATE_WINDOWS of them): its figure is the
        # entropy of their mixture, as the epoch's own histogram mixes its windows
        counts = np.zeros(ENTROPY_BINS, dtype=np.int64)
        order = rng.permutation(len(sizes))
        ends = np.cumsum(sizes[order])
        start = done = 0  # first unit (in order) and rows before the window
        while start < len(order) and windows < ESTIMATE_WINDOWS:
            stop = min(int(np.searchsorted(ends, done + window_rows, side="left")) + 1, len(order))
            chosen = order[start:stop]
            at = np.concatenate([[0], np.cumsum(sizes[chosen])])
            rows = int(at[-1])
            draws = max(2, round(per_window * min(rows / max(window_rows, 1), 4.0)))
            if rows >= 2:
                a = rng.integers(0, rows, draws)
                b = rng.integers(0, rows - 1, draws)
                b += b >= a  # two distinct rows of the window
                starts = units[chosen]
                pa = np.searchsorted(at, a, "right") - 1
                pb = np.searchsorted(at, b, "right") - 1
                diffs = (starts[pa] + a - at[pa]) - (starts[pb] + b - at[pb])
                counts += np.bincount(_bins(diffs, n), minlength=ENTROPY_BINS)
            done = int(ends[stop - 1])
            start = stop
            windows += 1
        # Miller-Madow: the plug-in entropy of N draws is (bins - 1) / (2 N ln 2) bits
        # low; an epoch's own histogram has n - 1 differences, far more than drawn here
        drawn = int(counts.sum())
        bias = (np.count_nonzero(counts) - 1) / (2 * drawn * math.log(2)) if drawn else 0.0
        epochs.append(_entropy(counts) + bias)
    exact = exact_entropy(n)
    figure = min(float(np.mean(epochs)) / exact, 1.0) if exact and epochs else 1.0
    if len(_ESTIMATES) > 4096:
        _ESTIMATES.clear()
    _ESTIMATES[key] = figure
    return figure


def smallest_buffer(
    units_for: Callable[[int], npt.NDArray[np.int64]],
    unit_rows: int,
    most_rows: int,
    target: float,
    n: int,
    planned: Callable[[int], float] | None = None,
    estimate_rows: Callable[[int], float] | None = None,
    largest: bool = False,
) -> tuple[int, float]:
    """The smallest buffer of whole units whose epoch meets ``target``.

    Buffers of ``k * unit_rows`` samples, ``k = 1, 2, ...`` (``unit_rows``: the
    largest unit, so a window holds at least ``k`` units) up to ``most_rows``
    (what the memory budget holds) or the whole dataset.  ``units_for(rows)``:
    the plan's units for a buffer of ``rows`` (shards become units once they
    fit).  ``planned(rows)``: the neighbour-entropy fraction of the epoch
    itself with that buffer (``EpochPlan.entropy``, this ``(seed, epoch)``),
    the figure the answer is held to.

    The search starts where :func:`buffer_entropy` (an estimate of the mean
    over epochs, a few milliseconds) crosses ``target`` (doubling from one
    unit, then bisecting), then brackets and bisects on ``planned``: the
    answer ``k`` meets the target by ``planned`` and ``k - 1`` does not (the
    figure of one seed is nondecreasing in ``k`` but for noise, so the first
    crossing is taken).  A buffer of the whole
    dataset meets any target: one window, a uniform permutation, is the
    exact shuffle the figures are fractions of (on small datasets its own
    figure is below 1 by the plug-in bias of its few differences).  Without ``planned`` the
    estimate is the figure (every seed gets the same size).

    ``estimate_rows(rows)``: the figure the search starts from (default
    :func:`buffer_entropy` of the units, the neighbour entropy); a cheap
    figure (``EpochPlan.expected_mixing``) is its own estimate.
    ``largest``: when no buffer within ``most_rows`` meets the target, the
    largest one is the answer (its figure below ``target`` says so) instead
    of an error.

    Returns
    -------
    (rows, figure)
        The buffer in samples and its figure (``planned``, else the estimate).

    Raises
    ------
    ArgumentValueError
        ``target`` is not in ``(0, 1]``, no unit fits ``most_rows``, or (not
        ``largest``) no buffer within ``most_rows`` meets it.
    """
    if not 0 < target <= 1:
        raise ArgumentValueError(f"shuffle_quality must be in (0, 1], got {target!r}")
    unit_rows = max(int(unit_rows), 1)
    whole = max(math.ceil(n / unit_rows), 1)
    top = min(whole, most_rows // unit_rows)

    def estimate(k: int) -> float:
        rows = k * unit_rows
        if estimate_rows is not None:
            return estimate_rows(rows)
        return buffer_entropy(units_for(rows), rows)

    figures: dict[int, float] = {}

    def figure(k: int) -> float:
        if k not in figures:
            figures[k] = planned(k * unit_rows) if planned is not None else estimate(k)
        return figures[k]

    def refuse(best: float) -> ArgumentValueError:
        whole_note = (
            ""
            if top >= whole
            else f" (the whole dataset in one buffer reaches {figure(whole):.3f})"
        )
        return ArgumentValueError(
            f"shuffle_buffer_size='auto': no buffer within the memory budget reaches "
            f"shuffle_quality={target}: the largest, {max(top, 0)} units of {unit_rows} "
            f"samples, reaches {best:.3f}{whole_note}; raise memory_budget, lower "
            "shuffle_quality, or use the exact shuffle"
        )

    def meets(k: int) -> bool:
        # one buffer of the whole dataset is a uniform permutation: the reference itself
        return k >= whole or figure(k) >= target

    if top < 1:
        raise refuse(0.0)
    # where the estimate crosses the target (top if it never does): the start, found
    # by doubling from one unit (buffers are usually a few units of many) and bisecting
    lo, hi = 0, 1  # estimate(lo) < target (k = 0: no buffer)
    while hi < top and estimate(hi) < target:
        lo, hi = hi, min(2 * hi, top)
    while hi - lo > 1 and estimate(hi) >= target:  # (top may not meet it either)
        mid = (lo + hi) // 2
        if estimate(mid) >= target:
            hi = mid
        else:
            lo = mid
    start = hi
    # bracket the crossing of the figure itself: not meets(lo), meets(hi)
    if meets(start):
        hi, step = start, 1
        lo = max(start - step, 0)
        while lo > 0 and meets(lo):
            hi, step = lo, step * 2
            lo = max(hi - step, 0)
    else:
        lo, step = start, 1
        hi = min(start + step, top)
        while not meets(hi):
            if hi >= top:
                if largest:
                    return top * unit_rows, figure(top)
                raise refuse(figure(top))
            lo, step = hi, step * 2
            hi = min(lo + step, top)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi * unit_rows, figure(hi)


#: ``label_mixing`` below which a stream told its labels warns at the end of its epoch
#: (``ShuffleQualityWarning``).  Measured on the sorted digits (``python -m benchmarks
#: --only quality-training``): orders of label mixing 0.87 trained 1.5 points below the
#: exact shuffle, of 0.80 and below 8 points or more; the threshold is the auto target's.
LABEL_MIXING_WARNING = 0.85


@functools.lru_cache(maxsize=256)
def _binomial_abs_dev(p: float, batch: int) -> float:
    """``E|c / batch - p|`` for ``c ~ Binomial(batch, p)``."""
    if p <= 0 or p >= 1 or batch < 1:
        return 0.0
    x, pmf = _binomial_pmf(p, batch)
    return float((pmf * np.abs(x / batch - p)).sum())


def exact_label_distance(shares: npt.ArrayLike, batch: int) -> float:
    """Expected total-variation distance of a uniformly drawn batch's labels from ``shares``.

    ``0.5 * sum_c E|c_c / batch - q_c|`` with binomial counts (an exact
    shuffle's batch; drawn without replacement it is a little closer).
    """
    q = np.asarray(shares, dtype=np.float64)
    return 0.5 * sum(_binomial_abs_dev(round(float(v), 12), int(batch)) for v in q.tolist())


class LabelCounter:
    """Per-batch label histograms, in delivery order, for the label mixing figures.

    ``add(labels)`` takes one delivered batch's labels (any discrete dtype);
    :meth:`figures` compares each batch's distribution with the distribution
    of every label delivered so far (the epoch's, once it is over): the mean
    total-variation distance, and the mean overlap (``1 - distance``) over an
    exact shuffle's expected overlap (clipped to ``[0, 1]``; 1.0: as close as
    an exact shuffle's batches).  A few microseconds a batch (one ``np.unique``).
    """

    __slots__ = ("_batch_rows", "_codes", "_counts", "_rows", "_sizes", "classes")

    def __init__(self) -> None:
        self.classes: dict[Any, int] = {}
        self._rows: list[npt.NDArray[np.int64]] = []  # batch index of each entry
        self._codes: list[npt.NDArray[np.int64]] = []
        self._counts: list[npt.NDArray[np.int64]] = []
        self._sizes: list[int] = []

    def add(self, labels: npt.ArrayLike) -> None:
        """Count one batch's labels."""
        values = np.asarray(labels).ravel()
        if len(values) == 0:
            return
        unique, counts = np.unique(values, return_counts=True)
        codes = np.asarray(
            [self.classes.setdefault(v, len(self.classes)) for v in unique.tolist()],
            dtype=np.int64,
        )
        self._rows.append(np.full(len(codes), len(self._sizes), dtype=np.int64))
        self._codes.append(codes)
        self._counts.append(counts.astype(np.int64))
        self._sizes.append(len(values))

    def figures(self) -> tuple[float, float] | None:
        """``(label_mixing, mean total-variation distance)``; ``None`` before a batch."""
        if not self._sizes:
            return None
        rows = np.concatenate(self._rows)
        codes = np.concatenate(self._codes)
        counts = np.concatenate(self._counts)
        sizes = np.asarray(self._sizes, dtype=np.float64)
        totals = np.bincount(codes, weights=counts, minlength=len(self.classes))
        q = totals / totals.sum()
        p = counts / sizes[rows]
        near = np.bincount(rows, weights=np.abs(p - q[codes]), minlength=len(sizes))
        held = np.bincount(rows, weights=q[codes], minlength=len(sizes))
        distance = 0.5 * (near + 1.0 - held)  # classes a batch lacks are 0.5 * q_c each
        mean = float(distance.mean())
        lengths, repeats = np.unique(sizes.astype(np.int64), return_counts=True)
        expected = sum(
            r * exact_label_distance(q, int(b))
            for b, r in zip(lengths.tolist(), repeats.tolist(), strict=True)
        ) / len(sizes)
        # the overlap (1 - distance) of a batch with the epoch, as a fraction of an
        # exact shuffle's expected overlap
        mixing = (1.0 - mean) / (1.0 - expected) if expected < 1 else 1.0
        return min(max(mixing, 0.0), 1.0), mean
