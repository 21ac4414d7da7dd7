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
feeds what it delivered; :class:`LabelCounter` the per-batch label figures.
The exact shuffle's values in closed form are in ``plan.exact_figures``;
:func:`buffer_entropy`, :func:`pair_bins` and :func:`smallest_buffer` (the
search behind ``shuffle_buffer_size="auto"``) in ``plan.buffer_search``; both
are importable from here as before.  Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .buffer_search import (
    AUTO_EXACT_SAMPLES,
    AUTO_EXPECTED_MARGIN,
    DEFAULT_SHUFFLE_QUALITY,
    buffer_entropy,
    pair_bins,
    smallest_buffer,
)
from .exact_figures import (
    ENTROPY_BINS,
    _bins,
    _entropy,
    exact_displacement,
    exact_entropy,
    exact_label_distance,
    exact_mixing_bits,
    exact_source_entropy,
    expected_batch_bits,
)
from .mixing import WORST_STRETCHES, _Mixing, stretch_batches
from .windows import RunIndex

__all__ = [
    "AUTO_EXACT_SAMPLES",
    "AUTO_EXPECTED_MARGIN",
    "DEFAULT_SHUFFLE_QUALITY",
    "ENTROPY_BINS",
    "LABEL_MIXING_WARNING",
    "WORST_STRETCHES",
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
    "stretch_batches",
]


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
        Each batch is scored against an exact shuffle's expectation for its
        own size, so the short last batch of an exact shuffle scores as its
        full ones do.
    mixing_bits, exact_mixing_bits : float or None
        That mean in bits, and an exact shuffle's expectation for a full batch.
    worst_mixing : float or None
        The batch mixing of the epoch's least mixed stretch: the mean score
        of ``ceil(batches / WORST_STRETCHES)`` consecutive batches (2% of the
        epoch; the last stretch takes the rest), the minimum over the
        stretches (clipped to ``[0, 1]``).  The epoch's mean (``mixing``) can
        hide a stretch of poorly mixed batches (an epoch's end from a few
        chunks); this does not.  An exact shuffle's is a little below 1 by
        the noise of a stretch's few batches.  ``None`` with ``mixing``.
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
    worst_mixing: float | None = None
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
            if self.worst_mixing is not None:
                text += f" (worst stretch {self.worst_mixing:.3f})"
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
    batches : int, optional
        The epoch's batches, which sizes the stretches of ``worst_mixing``
        (`stretch_batches`); default ``ceil(n / batch_size)``.
    draws : sequence of int, optional
        How many of the epoch's ids each stratum holds, where that is not its
        size (a mixture draws some sources in part, others cycled): the
        shares the exact shuffle's reference batch is drawn from (an exact
        shuffle of the epoch's own draws).  Default: the strata's sizes.
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
        batches: int | None = None,
        draws: npt.ArrayLike | None = None,
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
            if batches is None:
                batches = -(-self.n // self.batch_size)
            reference = None
            if draws is not None:
                reference = np.concatenate([[0], np.cumsum(np.asarray(draws, dtype=np.int64))])
            self._mixing = _Mixing(
                np.asarray(strata, dtype=np.int64),
                self.batch_size,
                stretch_batches(batches),
                reference,
            )

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
            score = total / self._exact_sources if self._exact_sources else float(batches)
            if self._partial.any():  # a short batch, against a short batch's expectation
                short = _entropy(self._partial)
                sizes = tuple(np.diff(self._runs.offsets).tolist())
                reference = exact_source_entropy(sizes, int(self._partial.sum()))
                total, batches = total + short, batches + 1
                score += short / reference if reference else 1.0
            bits_per_batch = total / batches if batches else 0.0
            sources = score / batches if batches else 1.0
        mixing = mixing_bits = exact_mixing = worst = None
        if self._mixing is not None:
            mixing, mixing_bits, worst = self._mixing.figure()
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
            worst_mixing=worst,
        )


def _row_entropy(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Bits of each row's distribution."""
    if len(counts) == 0:
        return np.zeros(0)
    p = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    logs = np.log2(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(axis=1)


#: ``label_mixing`` below which a stream told its labels warns at the end of its epoch
#: (``ShuffleQualityWarning``).  Measured on the sorted digits (``python -m benchmarks
#: --only quality-training``): orders of label mixing 0.87 trained 1.5 points below the
#: exact shuffle, of 0.80 and below 8 points or more; the threshold is the auto target's.
LABEL_MIXING_WARNING = 0.85


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
