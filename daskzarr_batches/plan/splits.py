"""Chunk-aligned splits: which units along one axis each subset gets, and where it may read.

The arithmetic behind ``chunk_split``: units (an array's chunks, or the blocks
between chunk boundaries shared by several arrays) drawn at random for each
subset (:func:`split_units`), the usable ranges of a subset once a gap is kept
from every unit it does not own (:func:`usable_ranges`), and those ranges cut
at an array's chunk boundaries (:func:`cut_at_chunks`), the pieces a subset's
reads are made of.  Pure numpy.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from .windows import IndexArray

__all__ = [
    "FRACTION_TOLERANCE",
    "Ranges",
    "cut_at_chunks",
    "merge_ranges",
    "shared_boundaries",
    "split_units",
    "usable_ranges",
]

#: How far above 1 the fractions may sum (floating point: ``0.7 + 0.2 + 0.1``).
FRACTION_TOLERANCE = 1e-9

#: ``(start, stop)`` position ranges along the split axis: sorted, disjoint, non-empty.
Ranges = tuple[tuple[int, int], ...]


def shared_boundaries(offsets: Sequence[IndexArray]) -> IndexArray:
    """The chunk boundaries every array has (each array's ``[0, c0, c0 + c1, ..., n]``).

    The blocks between consecutive ones are the split's units: each covers
    whole chunks of every array (cf. ``plan.windows.sample_units``, which
    may fall back to finer units to bound a window; a split never does).
    Empty chunks leave no unit of their own.
    """
    return functools.reduce(np.intersect1d, [np.unique(o) for o in offsets])


def split_units(lengths: Sequence[int], fractions: Sequence[float], seed: int) -> list[IndexArray]:
    """The units each subset gets: random, seeded, sized by ``fractions``.

    The units are permuted with ``numpy.random.default_rng(seed)`` and laid
    end to end in that order; subset ``i`` gets the units whose start falls
    in ``[F_i * n, F_{i+1} * n)`` (``F_i`` the sum of the fractions before
    ``i``, ``n`` the total length), so its length is within one unit (less
    than the longest unit) of ``fractions[i] * n``, and the units past
    ``sum(fractions) * n`` are left unused.  A subset that this would leave
    empty (a fraction below one unit) gets the next unit instead, at the
    expense of the later subsets.

    Parameters
    ----------
    lengths : sequence of int
        Length of each unit (all > 0), in position order.
    fractions : sequence of float
        Positive, summing to at most ``1 + FRACTION_TOLERANCE`` (checked by
        the caller), at most ``len(lengths)`` of them.
    seed : int
        Seed of the permutation.

    Returns
    -------
    list of ndarray
        Per subset, its unit indices, ascending.

    Examples
    --------
    >>> [u.tolist() for u in split_units([10] * 10, [0.6, 0.2, 0.2], seed=0)]
    [[2, 3, 4, 5, 6, 7], [0, 9], [1, 8]]
    """
    sizes = np.asarray(lengths, dtype=np.int64)
    count = len(sizes)
    assert len(fractions) <= count, "the caller checks there are enough units"
    order = np.random.default_rng(seed).permutation(count)
    starts = np.concatenate([[0], np.cumsum(sizes[order])[:-1]])
    total = int(sizes.sum())
    bounds = np.cumsum(np.asarray(fractions, dtype=np.float64)) * total
    if abs(sum(fractions) - 1.0) <= FRACTION_TOLERANCE:
        bounds[-1] = total  # every unit is used: no unit lost to rounding
    cuts = np.searchsorted(starts, bounds, side="left").tolist()
    begin = 0
    subsets = []
    for i, cut in enumerate(cuts):
        later = len(cuts) - i - 1
        end = min(max(cut, begin + 1), count - later)
        subsets.append(np.sort(order[begin:end]).astype(np.int64))
        begin = end
    return subsets


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> Ranges:
    """``ranges`` sorted, empty ones dropped and adjacent or overlapping ones merged."""
    merged: list[list[int]] = []
    for start, stop in sorted(ranges):
        if stop <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    return tuple((start, stop) for start, stop in merged)


def usable_ranges(bounds: IndexArray, units: IndexArray, gap: int) -> Ranges:
    """The positions a subset of ``units`` may use, kept ``gap`` away from every other unit.

    ``bounds`` are the units' boundaries (``[0, ..., n]``).  Adjacent units
    of the subset merge into one range; a range is trimmed by ``gap`` at each
    end that borders a unit it does not own (another subset's, or an unused
    one), never at the array's ends.  Ranges that the gap empties are dropped.

    Examples
    --------
    >>> usable_ranges(np.array([0, 10, 20, 30, 40]), np.array([0, 1, 3]), gap=2)
    ((0, 18), (32, 40))
    """
    n = int(bounds[-1]) if len(bounds) else 0
    extents = merge_ranges([(int(bounds[u]), int(bounds[u + 1])) for u in units])
    trimmed = []
    for start, stop in extents:
        trimmed.append((start + gap if start > 0 else start, stop - gap if stop < n else stop))
    return merge_ranges(trimmed)


def cut_at_chunks(ranges: Ranges, offsets: IndexArray) -> tuple[tuple[int, int, int], ...]:
    """``ranges`` cut at an array's chunk boundaries: ``(chunk, start, stop)`` per piece.

    ``offsets`` are the array's chunk offsets along the axis (``[0, c0, ...,
    n]``, empty chunks repeating an offset).  Each piece lies in one
    non-empty chunk; pieces ascend.

    Examples
    --------
    >>> cut_at_chunks(((3, 12), (15, 16)), np.array([0, 5, 10, 20]))
    ((0, 3, 5), (1, 5, 10), (2, 10, 12), (2, 15, 16))
    """
    pieces = []
    for start, stop in ranges:
        at = start
        while at < stop:
            chunk = int(np.searchsorted(offsets, at, side="right")) - 1
            end = min(stop, int(offsets[chunk + 1]))
            pieces.append((chunk, at, end))
            at = end
    return tuple(pieces)
