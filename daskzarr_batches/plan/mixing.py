"""Batch mixing counted batch by batch: the per-batch strata entropy behind
``ShuffleQuality.mixing`` and its worst stretch (``worst_mixing``).

Each batch's bits over the strata (the epoch's stored chunks) are scored
against an exact shuffle's expectation for a batch of its own size (a short
last batch against a short batch's), the mean over the batches is the
figure, and the least mean over stretches of ``ceil(batches /
WORST_STRETCHES)`` consecutive batches the worst stretch.  Pure numpy; used by
``plan.quality``'s ``QualityCounter`` (and importable from there).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .exact_figures import _entropy, exact_mixing_bits

__all__ = ["WORST_STRETCHES", "stretch_batches"]


#: Stretches of an epoch's batches the worst-stretch mixing (``ShuffleQuality.worst_mixing``)
#: is the minimum over: ``ceil(batches / WORST_STRETCHES)`` consecutive batches each (2% of
#: the epoch), the last one taking the rest.
WORST_STRETCHES = 50


def stretch_batches(batches: int) -> int:
    """Batches in one stretch of the worst-stretch figure: ``ceil(batches / 50)``, at least 1."""
    return max(-(-max(int(batches), 1) // WORST_STRETCHES), 1)


class _Mixing:
    """Per-batch entropy of the strata histogram, accumulated in delivery order.

    Sparse: a piece's samples become ``(batch, stratum)`` entries (a run of
    consecutive ids: one entry per segment between batch and stratum
    edges), so the cost is per sample (or per segment), never per
    ``batch x strata`` cell.  The unfinished batch is carried as entries.
    Each batch is scored against an exact shuffle's expectation for its own
    size (the short last batch against a short batch's), and the scores are
    summed per stretch of ``stretch`` batches for the worst-stretch figure.
    """

    __slots__ = (
        "batches", "bits", "bounds", "carry", "exact", "k", "reference", "score", "size",
        "step", "stretch", "stretches",
    )  # fmt: skip

    def __init__(
        self,
        bounds: npt.NDArray[np.int64],
        batch_size: int,
        stretch: int = 1,
        reference: npt.NDArray[np.int64] | None = None,
    ) -> None:
        self.bounds = bounds
        self.k = max(len(bounds) - 1, 1)
        # the strata's common size when every one but the last has it (else 0)
        sizes = np.diff(bounds[:-1])
        equal = len(sizes) > 0 and int(sizes[0]) > 0 and bool(np.all(sizes == sizes[0]))
        self.step = int(sizes[0]) if equal else 0
        self.size = batch_size
        # the exact shuffle's strata shares: the strata's sizes, or the epoch's draws of each
        self.reference = bounds if reference is None else reference
        self.exact = exact_mixing_bits(self.reference, batch_size)
        self.bits = 0.0
        self.score = 0.0  # sum over batches of bits / the exact expectation
        self.batches = 0
        self.stretch = max(int(stretch), 1)
        self.stretches = np.zeros(0, dtype=np.float64)  # score per stretch
        empty = np.zeros(0, dtype=np.int64)
        self.carry: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] = (empty, empty)

    def stratum(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        if self.step:  # equal strata (one array's chunks): a division, not a binary search
            return np.clip((ids - self.bounds[0]) // self.step, 0, self.k - 1)
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
        key, cells = self._cells(batch * self.k + stratum, count, int(batch[-1]) + 1 if n else 1)
        rows = key // self.k
        totals = np.bincount(rows, weights=cells)
        p = cells / totals[rows]
        bits = np.bincount(rows, weights=-p * np.log2(p))
        last = int(rows[-1])
        whole = last + 1 if (before + n) % self.size == 0 else last
        self.bits += float(bits[:whole].sum())
        if whole:
            scores = bits[:whole] / self.exact if self.exact > 0 else np.ones(whole)
            self.score += float(scores.sum())
            self._stretch(self.batches + np.arange(whole), scores)
        self.batches += whole
        if whole <= last:
            mine = rows == last
            self.carry = (key[mine] % self.k, cells[mine])
        else:
            empty = np.zeros(0, dtype=np.int64)
            self.carry = (empty, empty)

    def _cells(
        self, key: npt.NDArray[np.int64], count: npt.NDArray[np.int64], batches: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The distinct ``(batch, stratum)`` keys, sorted, and their summed counts.

        ``batches`` is one past the largest batch (the batches ascend in delivery
        order): when those batches' cells are few beside the entries, one dense
        ``bincount`` replaces ``np.unique``'s sort (issue 36: the sort was most of a
        buffered epoch's counting).
        """
        span = batches * self.k
        if span <= 4 * len(key) + 4096:
            dense = np.bincount(key, weights=count, minlength=span)
            where = np.flatnonzero(dense)
            return where.astype(np.int64), dense[where].astype(np.int64)
        key, where = np.unique(key, return_inverse=True)
        return key, np.bincount(where.ravel(), weights=count).astype(np.int64)

    def _stretch(self, batches: npt.NDArray[np.int64], scores: npt.NDArray[np.float64]) -> None:
        """Add batches' scores to their stretches."""
        where = batches // self.stretch
        sums = np.bincount(where - where[0], weights=scores)
        top = int(where[0]) + len(sums)
        if top > len(self.stretches):
            self.stretches = np.concatenate([self.stretches, np.zeros(top - len(self.stretches))])
        self.stretches[int(where[0]) : top] += sums

    def _short(self) -> tuple[float, float] | None:
        """The unfinished (short) batch's ``(bits, score)``: scored against its own size."""
        counts = self.carry[1]
        if not len(counts):
            return None
        bits = _entropy(counts)
        exact = exact_mixing_bits(self.reference, int(counts.sum()))
        return bits, (bits / exact if exact > 0 else 1.0)

    def figure(self) -> tuple[float, float, float]:
        """``(mixing, bits per batch, worst stretch)``: an unfinished batch counts as one."""
        total, score, batches = self.bits, self.score, self.batches
        stretches = self.stretches.copy()
        short = self._short()
        if short is not None:
            total, score, batches = total + short[0], score + short[1], batches + 1
            at = self.batches // self.stretch
            if at >= len(stretches):
                stretches = np.concatenate([stretches, np.zeros(at + 1 - len(stretches))])
            stretches[at] += short[1]
        if not batches:
            return 1.0, 0.0, 1.0
        sizes = np.full(len(stretches), self.stretch, dtype=np.float64)
        sizes[-1] = batches - self.stretch * (len(stretches) - 1)
        if len(stretches) > 1 and sizes[-1] < self.stretch:  # the rest joins the one before
            stretches[-2] += stretches[-1]
            sizes[-2] += sizes[-1]
            stretches, sizes = stretches[:-1], sizes[:-1]
        worst = float(np.min(stretches / sizes))
        return min(score / batches, 1.0), total / batches, min(worst, 1.0)
