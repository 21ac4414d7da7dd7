"""Patch geometry: N-D samples as ids, units and boxes.  Pure numpy.

A patch stream's sample is a *patch*: a window of an N-D array at an
*origin*.  The origins form a grid over the *patched axes* (the axes
``input_dims`` names; the others are taken whole), and a patch's id is the C
order of its origin on that grid, so the sequential order is the C order of
the origins.  A patch stream reads one or more *cuts* per origin: the input
(size ``input_dims``, shift 0), a forecast target (its own size along the
shifted axis, shifted by ``target_offset``), the same patch of each variable
of a dataset.

The epoch plan (:class:`~daskzarr_batches.plan.epoch.EpochPlan`) works on
patch ids exactly as on rows: its "chunks" are the grid's *units*
(:meth:`PatchGrid.units`), runs of consecutive patch ids whose origins share
one stored chunk along one patched axis (and one origin along the axes
before it), so that a window of whole units decodes each of its chunks once
and, when patches tile the chunks, no chunk twice in an epoch.  The read
layer turns a window's patch ids into *boxes* (:meth:`PatchGrid.boxes`), one
region per unit it touches, decodes every stored chunk the boxes overlap
once and cuts the patches out of the boxes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .windows import IndexArray

__all__ = [
    "UNIT_WINDOWS",
    "Box",
    "Cut",
    "PatchGrid",
    "box_chunks",
    "chunk_bytes",
    "chunks_of",
    "merge_boxes",
    "patch_origins",
]

#: How many windows' worth of patches a unit may hold before it is split along the next dim.
UNIT_WINDOWS = 4

#: A region of an array: one slice per axis.
Box = tuple[slice, ...]


@dataclass(frozen=True)
class Cut:
    """One array cut at every patch origin: its size and the shift of its origin.

    Attributes
    ----------
    size : tuple of int
        Extent along every axis of the array (an axis not patched: its length).
    shift : tuple of int
        Added to the patch origin along every axis (0 but along a forecast
        target's axis).

    axes : tuple of int
        The array's axis of each patched dim (in the grid's order).
    """

    size: tuple[int, ...]
    shift: tuple[int, ...]
    axes: tuple[int, ...]

    def place(self, origins: IndexArray) -> IndexArray:
        """Grid origins ``(n, dims)`` as origins in the array: ``(n, ndim)``, 0 on other axes."""
        out = np.zeros((len(origins), len(self.size)), dtype=np.int64)
        out[:, list(self.axes)] = origins
        return out


def patch_origins(
    length: int,
    stride: int,
    cuts: Sequence[tuple[int, int]],
    ranges: Sequence[tuple[int, int]] | None = None,
) -> IndexArray:
    """Origins along one axis: the grid of every ``stride`` positions, where every cut fits.

    The grid is the one without a target, ``start, start + stride, ...``
    from the start of each range (0 for the whole axis); an origin whose
    cuts do not all fit is dropped, so a target behind the input (a negative
    shift) drops the first origins but does not move the others.

    Parameters
    ----------
    length : int
        The axis' length.
    stride : int
        Positions between consecutive origins (size - overlap).
    cuts : sequence of (shift, size)
        Every cut along this axis; an origin is kept when each
        ``[origin + shift, origin + shift + size)`` lies inside one range.
    ranges : sequence of (start, stop), optional
        The usable positions (a chunk-aligned split's); default the whole axis.
        The grid restarts at each range, so a subset's patches start at its
        first usable position.

    Returns
    -------
    ndarray of int64
        Ascending origin positions.

    Examples
    --------
    >>> patch_origins(10, 3, [(0, 4)]).tolist()
    [0, 3, 6]
    >>> patch_origins(10, 1, [(0, 2), (2, 1)]).tolist()  # 2 steps in, the next out
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> patch_origins(10, 2, [(0, 2), (-1, 2)]).tolist()  # 0 dropped: its target is at -1
    [2, 4, 6, 8]
    """
    low = min(0, *(shift for shift, _ in cuts))
    high = max(shift + size for shift, size in cuts)
    found = []
    for lo, hi in [(0, length)] if ranges is None else ranges:
        start = max(lo, 0)
        # the first grid origin whose cuts start inside the range (low <= 0)
        first = start + -(low // stride) * stride
        last = min(hi, length) - high
        if last >= first:
            found.append(np.arange(first, last + 1, stride, dtype=np.int64))
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class PatchGrid:
    """The origins of a patch stream and how its patch ids group into units.

    Parameters
    ----------
    shape : tuple of int
        Length of each patched dim (every array of the stream shares them),
        in the first array's axis order.
    origins : tuple of ndarray
        Origin positions along each patched axis, ascending.
    bounds : tuple of ndarray
        Stored chunk boundaries along each patched axis (``[0, c0, ..., n]``),
        which units follow.
    unit_patches : int, default 0
        Patches of a window (the plan's ``window_rows``): a unit may hold up
        to ``UNIT_WINDOWS`` times as many, so that the patches of one row of
        stored chunks along the first patched dim stay one unit where they
        can (0: always).
    """

    shape: tuple[int, ...]
    origins: tuple[IndexArray, ...]
    bounds: tuple[IndexArray, ...]
    unit_patches: int = 0
    level: int = field(init=False, compare=False)
    unit_offsets: IndexArray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        level, offsets = self._units()
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "unit_offsets", offsets)

    @property
    def counts(self) -> tuple[int, ...]:
        """Origins along each patched axis."""
        return tuple(len(o) for o in self.origins)

    @property
    def n_patches(self) -> int:
        """Patches of the grid (the stream's samples)."""
        return math.prod(self.counts) if self.origins else 0

    def sized(self, unit_patches: int) -> PatchGrid:
        """The same grid with units of at most ``unit_patches`` patches (if they can be)."""
        if unit_patches == self.unit_patches:
            return self
        return PatchGrid(self.shape, self.origins, self.bounds, unit_patches)

    def _units(self) -> tuple[int, IndexArray]:
        """The units: runs of patch ids sharing origins before ``level`` and a chunk at it.

        ``level`` is the first patched dim (in order) at which the largest
        unit holds at most ``UNIT_WINDOWS * unit_patches`` patches (the last
        one if none does): a unit is one origin along each patched dim before
        it, the origins inside one stored chunk along it, every origin after
        it.  Patch ids are C-ordered over the origins, so each unit is a run.
        A unit below level 0 decodes its chunks for one origin of the dims
        before it, so the chunks of a row along those dims are decoded once
        per origin (read amplification up to the chunk's length there, less
        where consecutive units share a window): hence the slack.
        """
        counts = self.counts
        if self.n_patches == 0:
            return 0, np.zeros(1, dtype=np.int64)
        for level in range(len(self.origins)):
            blocks = np.searchsorted(self.bounds[level], self.origins[level], side="right") - 1
            groups = np.diff(np.flatnonzero(np.diff(blocks, prepend=-1, append=-2)))
            inner = math.prod(counts[level + 1 :])
            largest = int(groups.max()) * inner
            if self.unit_patches <= 0 or largest <= UNIT_WINDOWS * self.unit_patches:
                break
        repeats = math.prod(counts[:level])
        sizes = np.tile(groups.astype(np.int64) * inner, repeats)
        return level, np.concatenate([[0], np.cumsum(sizes)])

    @property
    def unit_sizes(self) -> tuple[int, ...]:
        """Patches per unit, in order (the plan's "chunks")."""
        return tuple(np.diff(self.unit_offsets).tolist())

    def origin_of(self, ids: IndexArray) -> IndexArray:
        """Origins of patches ``ids`` along each patched dim: shape ``(n, dims)``."""
        out = np.zeros((len(ids), len(self.origins)), dtype=np.int64)
        if len(ids) == 0:
            return out
        index = np.unravel_index(np.asarray(ids, dtype=np.int64), self.counts)
        for dim, (where, positions) in enumerate(zip(index, self.origins, strict=True)):
            out[:, dim] = positions[where]
        return out

    def boxes(
        self, ids: IndexArray, groups: Sequence[int], cuts: Sequence[Cut]
    ) -> list[tuple[slice, ...]]:
        """The region each group of ``ids`` needs: the bounding box of its cuts.

        ``groups`` gives how many consecutive ``ids`` form each group (a
        window's patches of one unit); the box spans, along each axis, from
        the first cut's start to the last cut's end of the group's patches.
        The cuts are of one array (they share its axes).
        """
        origins = cuts[0].place(self.origin_of(ids))
        low = np.min([c.shift for c in cuts], axis=0)
        high = np.max([np.add(c.shift, c.size) for c in cuts], axis=0)
        boxes = []
        at = 0
        for count in groups:
            part = origins[at : at + count]
            first, last = part.min(axis=0) + low, part.max(axis=0) + high
            boxes.append(tuple(slice(int(a), int(b)) for a, b in zip(first, last, strict=True)))
            at += count
        return boxes


def merge_boxes(boxes: Sequence[Box], itemsize: int, limit: int) -> tuple[list[Box], list[int]]:
    """Consecutive boxes whose union is a box, as that box: ``(merged, firsts)``.

    Two boxes merge when they agree on every axis but at most one and overlap or
    touch along it, so the merged box is exactly their union (nothing more is read
    or held); a merged box stays within ``limit`` bytes (a single box may not).
    Merged box ``k`` holds boxes ``firsts[k]`` to ``firsts[k + 1] - 1`` (``firsts``
    ends with ``len(boxes)``).  Forecast pairs give one box per time step, ``[t, t +
    2)``, each chunk shared by two of them; merged, a window's chunks each belong to
    one box and decode straight into it (issue 36).
    """
    merged: list[Box] = []
    firsts: list[int] = []
    for number, box in enumerate(boxes):
        if merged:
            union = _union(merged[-1], box)
            if union is not None and itemsize * math.prod(s.stop - s.start for s in union) <= limit:
                merged[-1] = union
                continue
        merged.append(box)
        firsts.append(number)
    return merged, [*firsts, len(boxes)]


def _union(a: Box, b: Box) -> Box | None:
    """``a`` and ``b`` as one box if their union is one, else None."""
    differ = [axis for axis, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if len(differ) > 1:
        return None
    if not differ:
        return a
    (axis,) = differ
    x, y = a[axis], b[axis]
    if y.start > x.stop or x.start > y.stop:
        return None
    joined = slice(min(x.start, y.start), max(x.stop, y.stop))
    return tuple(joined if i == axis else s for i, s in enumerate(a))


def chunks_of(box: tuple[slice, ...], bounds: Sequence[IndexArray]) -> list[range]:
    """Chunk indices along each axis that ``box`` overlaps (``bounds``: chunk boundaries)."""
    found = []
    for where, edges in zip(box, bounds, strict=True):
        if where.stop <= where.start:
            found.append(range(0))
            continue
        first = int(np.searchsorted(edges, where.start, side="right")) - 1
        last = int(np.searchsorted(edges, where.stop, side="left"))
        found.append(range(first, last))
    return found


def box_chunks(
    boxes: Sequence[Box], bounds: Sequence[IndexArray]
) -> tuple[dict[tuple[int, ...], Box], dict[tuple[int, ...], list[int]]]:
    """Every chunk the boxes overlap: the part of it they need, and which boxes need it.

    Returns ``({block: span}, {block: [box numbers]})``, blocks in the order
    the boxes first touch them; ``span`` is the bounding box of the parts of
    the chunk the boxes overlap (what a read of the chunk asks for).
    """
    region: dict[tuple[int, ...], list[list[int]]] = {}
    users: dict[tuple[int, ...], list[int]] = {}
    for number, box in enumerate(boxes):
        for block in itertools.product(*chunks_of(box, bounds)):
            users.setdefault(block, []).append(number)
            lo = [max(int(e[b]), s.start) for b, e, s in zip(block, bounds, box, strict=True)]
            hi = [min(int(e[b + 1]), s.stop) for b, e, s in zip(block, bounds, box, strict=True)]
            if block in region:
                old = region[block]
                region[block] = [
                    [min(a, c) for a, c in zip(old[0], lo, strict=True)],
                    [max(b, d) for b, d in zip(old[1], hi, strict=True)],
                ]
            else:
                region[block] = [lo, hi]
    spans = {
        block: tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))
        for block, (lo, hi) in region.items()
    }
    return spans, users


def chunk_bytes(
    blocks: Iterable[tuple[int, ...]], bounds: Sequence[IndexArray], itemsize: int
) -> tuple[tuple[tuple[int, ...], int], ...]:
    """Each chunk of ``blocks`` with its decoded bytes (a chunk is decoded whole)."""
    found = []
    for block in blocks:
        elements = 1
        for b, edges in zip(block, bounds, strict=True):
            elements *= int(edges[b + 1] - edges[b])
        found.append((block, elements * itemsize))
    return tuple(found)
