"""The buffered order's windows, as index math: units grouped into balanced windows
(:func:`unit_groups`) and a window's pieces read off its permuted units
(:class:`UnitShuffle`), for :mod:`.epoch`.  Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .windows import ChunkPiece, IndexArray, Selector, _as_selector

__all__ = ["UnitShuffle", "unit_groups", "unit_rows"]


def _greedy_cuts(sizes: list[int], window_rows: int) -> IndexArray:
    """Where runs of consecutive units of at least ``window_rows`` rows end (and a rest)."""
    cuts, rows = [], 0
    for unit, size in enumerate(sizes):
        rows += size
        if rows >= window_rows:
            cuts.append(unit + 1)
            rows = 0
    if rows > 0:
        cuts.append(len(sizes))
    return np.asarray(cuts, dtype=np.int64)


def unit_rows(starts: IndexArray, stops: IndexArray) -> IndexArray:
    """The sample ids of units ``starts[i]:stops[i]``, one after another (int64)."""
    sizes = stops - starts
    at = np.cumsum(sizes) - sizes  # where each unit begins in the output
    return np.arange(int(sizes.sum()), dtype=np.int64) + np.repeat(starts - at, sizes)


@dataclass(frozen=True)
class UnitShuffle:
    """A buffered window as whole units permuted, so its pieces need no sort.

    The window's samples are ``concatenate(ranges of the units)[shuffle]``;
    ``landing[j]`` is the plan position of row ``j`` of that concatenation.
    """

    starts: IndexArray  # unit starts, in the window's (permuted) unit order
    stops: IndexArray
    landing: IndexArray

    @classmethod
    def of(cls, starts: IndexArray, stops: IndexArray, shuffle: IndexArray) -> UnitShuffle:
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


def unit_groups(
    units: IndexArray, unit_ids: Iterable[int], window_rows: int
) -> Iterator[list[int]]:
    """Group units (boundaries ``units``, ids in the given order) into balanced windows.

    As many windows ``W`` as consecutive units of at least ``window_rows``
    samples make (the buffer rounded up to whole units, and the remainder),
    cut at the unit boundaries nearest to ``j * rows / W``: every window
    holds about ``rows / W`` samples, no more than a buffer rounded up to
    whole units (equal units: ``floor`` or ``ceil`` of ``units / W`` each),
    so none is a short remainder (where that would put more than a buffer
    and one unit in a window, units of very unequal sizes, the runs
    themselves).  A remainder window of a few
    units at the end of the epoch would deliver its batches from those few
    units alone (with class-sorted data, one or two classes a batch): the
    end of the epoch would be less mixed than its middle.  Not ramped: the
    first window is a whole buffer, read as one window (its chunks
    concurrently), so the first batch draws from as many chunks as any
    other (see the module docstring).
    """
    order = np.fromiter(unit_ids, dtype=np.int64)
    if not len(order):
        return
    sizes = np.diff(units)[order]
    ends = np.cumsum(sizes)
    total = int(ends[-1])
    greedy = _greedy_cuts(sizes.tolist(), window_rows)
    count = len(greedy)
    targets = (np.arange(1, count, dtype=np.int64) * total) // count
    after = np.searchsorted(ends, targets, side="left")  # the first unit ending at or past
    below = np.maximum(after - 1, 0)  # the unit before it (ending short of the target)
    nearer = (after > 0) & (targets - ends[below] < ends[after] - targets)
    cuts = np.where(nearer, below, after) + 1  # units before each cut
    cuts = np.unique(np.append(cuts[cuts < len(order)], len(order)))
    rows = np.diff(np.concatenate([[0], ends[cuts - 1]]))
    if rows.max() >= window_rows + max(int(sizes.max()), 1):
        cuts = greedy  # units of very unequal sizes
    lo = 0
    for hi in cuts.tolist():
        yield order[lo:hi].tolist()
        lo = hi
