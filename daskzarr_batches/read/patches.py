"""Reading one window of patches: each stored chunk decoded once, every patch cut from boxes.

The task behind every window of a patch stream (:func:`read_patches`).  The
window's patch ids (the plan's pieces over the grid's units) give one *box*
per unit it touches, the bounding box of that unit's patches in the window
(every cut of the base array: an input and its forecast target share one
box).  Every stored chunk a box overlaps is decoded once, concurrently on
Zarr's event loop, and copied into each box that needs it; the patches are
then cut out of the boxes into the window's outputs (one per cut).  A numpy
array's boxes are views; a dask array's are computed in one ``dask.compute``
(shared blocks once).  If a read fails, the chunks are read again one by one
(:func:`~daskzarr_batches.read.tasks.read_block`), so the error names the
chunk, and with ``on_error="skip"`` the patches touching a chunk that does
not decode leave the window (from every output of the base array).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import zarr

from ..plan.budget import DECODE_GROUP_BYTES
from ..plan.patches import Box, Cut, PatchGrid, box_chunks, chunk_bytes, chunks_of, merge_boxes
from ..plan.windows import ChunkPiece, chunk_offsets
from ..store.cache import CacheCounts
from ..store.layout import block_key
from ..store.policy import (
    Ledger,
    ReadReport,
)
from .chunk_share import ChunkShare, _Abandoned, _edges, _no_share  # noqa: F401
from .context import DEFAULT_CONTEXT, ReadContext
from .patch_boxes import in_memory_boxes, read_boxes
from .patch_skips import _missing_blocks, _runs, _touching

__all__ = [
    "ChunkShare",
    "KeptBlocks",
    "PatchBase",
    "kept_blocks",
    "patch_ids",
    "read_origins",
    "read_patches",
]

Block = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class PatchBase:
    """What a patch window's read task reads of its base array: how errors name it, its
    chunk sizes per axis (dask style), the stream's patch origins and the cuts read from
    it together."""

    name: str
    chunks: tuple[tuple[int, ...], ...]
    grid: PatchGrid
    cuts: tuple[Cut, ...]


class KeptBlocks(NamedTuple):
    """A patch window's kept stored blocks (a cache on a cluster): the futures, where each
    sits in the array, whether each was made for this window; passed to
    :func:`read_patches` as its last three arguments (the futures a list dask resolves)."""

    data: list[Any]
    places: tuple[tuple[slice, ...], ...]
    made: tuple[bool, ...]


def patch_ids(
    pieces: Sequence[ChunkPiece], size: int, plan_order: bool
) -> tuple[np.ndarray, list[int], np.ndarray]:
    """A window's patch ids (ascending), how many each unit holds, and where each goes.

    ``where[i]`` is the output row of patch ``ids[i]``: its rank (ascending
    order), or with ``plan_order`` its plan position (the pieces' ``dest``).
    """
    ids, groups, where = [], [], []
    at = 0
    for piece in pieces:
        local = np.arange(piece.rows, dtype=np.int64)[piece.take]
        ids.append(piece.start + local)
        groups.append(len(local))
        if plan_order:
            where.append(np.arange(size, dtype=np.int64)[piece.dest])
        else:
            where.append(np.arange(at, at + len(local), dtype=np.int64))
        at += len(local)
    if not ids:
        empty = np.empty(0, dtype=np.int64)
        return empty, [], empty
    return np.concatenate(ids), groups, np.concatenate(where)


def read_origins(
    grid: PatchGrid, cut: Cut, size: int, pieces: Sequence[ChunkPiece], plan_order: bool = False
) -> tuple[np.ndarray, ReadReport]:
    """A window's patch origins (``return_origins``) in ``cut``'s array: ``(size, ndim)``."""
    ids, _, where = patch_ids(pieces, size, plan_order)
    out = np.empty((len(ids), len(cut.size)), dtype=np.int64)
    out[where] = cut.place(grid.origin_of(ids))
    return out, ReadReport(decoded=())  # read from no stored chunk


def read_patches(
    array: Any,
    stored: PatchBase,
    size: int,
    pieces: Sequence[ChunkPiece],
    ctx: ReadContext = DEFAULT_CONTEXT,
    share: ChunkShare | None = None,
    kept: Sequence[tuple[np.ndarray, ReadReport]] | None = None,
    kept_places: Sequence[tuple[slice, ...]] = (),
    kept_made: Sequence[bool] = (),
) -> tuple[tuple[np.ndarray, ReadReport], ...]:
    """Read one window's patches of one array: one ``(patches, report)`` per cut.

    Parameters
    ----------
    array : zarr.Array, numpy.ndarray or dask.array.Array
        The base array (an argument of its own: a cluster resolves it).
    stored : PatchBase
        How errors name it, its chunk sizes, the stream's
        patch origins and what to cut at each (one output per cut, of shape
        ``(size, *cut.size)``, in ascending patch order, or plan order).
    size : int
        Patches in the window.
    pieces : sequence of ChunkPiece
        The window's pieces over the grid's units.
    ctx : ReadContext
        The stream's reads (policy, scope, plan order; ``pool``: where the
        outputs come from, the stream gives them back once cut).
    share : ChunkShare, optional
        Chunks decoded once for the windows of a sequential stream that need
        them (local reads only).
    kept, kept_places, kept_made : optional
        A cache on a cluster: every stored block the window's boxes overlap,
        as kept (``(data, report)``: the block, or its whole axis-0 chunk
        when the block spans every column), where each sits in the array
        and whether it was made for this window (a cache miss) or kept from
        before (a hit).  The boxes are filled from them, nothing read from
        the store; if one of them was skipped as undecodable, the window is
        read from the store as without them (``policy`` less its cache), so
        that only the patches touching a chunk that does not decode are
        dropped.

    Returns
    -------
    tuple of (ndarray, ReadReport)
        Per cut.  The first report carries what was read (``decoded``:
        every chunk decoded, with its bytes; missing chunks, retries); with ``on_error="skip"``
        every report lists the chunks skipped and the patches they took out.
    """
    name, chunks, grid, cuts = stored.name, stored.chunks, stored.grid, stored.cuts
    pool = ctx.pool
    ids, groups, where = patch_ids(pieces, size, ctx.plan_order)
    boxes = grid.boxes(ids, groups, cuts) if len(ids) else []
    bounds = [chunk_offsets(sizes) for sizes in chunks]
    dtype = np.dtype(array.dtype)
    if kept is not None and any(report.skipped for _, report in kept):
        kept, ctx = None, ctx.uncached()
    outs = [
        np.empty((size, *cut.size), dtype=dtype)
        if pool is None
        else pool.take((size, *cut.size), dtype)
        for cut in cuts
    ]
    ledger = Ledger()
    bad: set[Block] = set()
    origins = cuts[0].place(grid.origin_of(ids))
    starts = np.concatenate([[0], np.cumsum(groups, dtype=np.int64)]).tolist()
    done: set[Block] = set()  # the stored chunks this task decoded
    edges: frozenset[Block] = frozenset()
    if not isinstance(array, zarr.Array):  # a dask array's windows each compute their blocks
        share = None
    if share is not None and boxes and share.uses is not None:  # other windows claim these
        edges = frozenset(b for b in box_chunks(boxes, bounds)[0] if share.shared(b))
    elif share is not None and boxes:  # the chunks the windows before and after may need
        edges = _edges(boxes, bounds, cuts, origins, grid, ids)
    coverage = _coverage(grid, cuts)
    direct = (
        kept is None
        and not isinstance(array, np.ndarray)
        and _direct(cuts, bounds, len(ids), boxes, dtype.itemsize)
    )
    if direct:  # the chunks decoded straight into the patches: no boxes to cut from
        regions, views = _patch_targets(cuts, outs, origins, where)
        _, lost, mine = read_boxes(
            array, name, regions, bounds, ledger, ctx, share, (coverage, edges), views
        )
        bad |= lost
        done |= mine
    # consecutive boxes whose union is a box read as one (forecast pairs: a chunk in one box)
    merged, firsts = merge_boxes(boxes, dtype.itemsize, DECODE_GROUP_BYTES)
    merged_starts = [starts[first] for first in firsts]
    for lo, hi in [] if direct else _box_groups(merged, dtype.itemsize):
        part = merged[lo:hi]
        if kept is not None:
            filled = [_kept_box(box, kept, kept_places, dtype) for box in part]
        elif isinstance(array, np.ndarray):  # views, unless the user's reader reads it
            filled = in_memory_boxes(array, part, bounds, ctx)
        else:  # a Zarr array's chunks, a dask array's blocks: requests to its reader
            filled, lost, mine = read_boxes(
                array, name, part, bounds, ledger, ctx, share, (coverage, edges)
            )
            bad |= lost
            done |= mine
        _cut_boxes(outs, cuts, merged, filled, range(lo, hi), origins, where, merged_starts)
        if pool is not None:
            for data in filled:  # cut: the boxes serve the next window
                pool.give(data)
        del filled
    decoded: tuple[tuple[Block, int], ...] = ()
    if kept is not None:
        _kept_ledger(ledger, kept, kept_made, array, boxes, bounds)
        decoded = chunk_bytes(box_chunks(boxes, bounds)[0], bounds, dtype.itemsize)
    elif not isinstance(array, np.ndarray):
        decoded = chunk_bytes(sorted(done), bounds, dtype.itemsize)
    skipped: tuple[tuple[Block, int, int], ...] = ()
    if bad:
        drop = _touching(origins, cuts, bad, bounds)
        skipped = _runs(ids, drop, origins, cuts, bad, bounds)
        outs = [np.delete(out, where[drop], axis=0) for out in outs]
    missing_keys = tuple(dict.fromkeys(ledger.missing))
    first = ReadReport(
        cache=ledger.cache,
        missing_keys=missing_keys,
        missing_chunks=_missing_blocks(array, boxes, bounds, missing_keys),
        retries=ledger.retries,
        skipped=skipped,
        decoded=decoded,
    )
    rest = ReadReport(skipped=skipped, decoded=())
    return tuple((out, first if i == 0 else rest) for i, out in enumerate(outs))


def kept_blocks(chunks: tuple[tuple[int, ...], ...], boxes: Sequence[Box]) -> list[Block]:
    """The stored blocks ``boxes`` overlap (what a cache keeps for them on a cluster), sorted."""
    bounds = [chunk_offsets(sizes) for sizes in chunks]
    return sorted(box_chunks(boxes, bounds)[0])


def _kept_box(
    box: Box,
    kept: Sequence[tuple[np.ndarray, ReadReport]],
    places: Sequence[tuple[slice, ...]],
    dtype: Any,
) -> np.ndarray:
    """``box`` of the array, filled from the kept parts it overlaps (each at its ``places``)."""
    out = np.empty(tuple(s.stop - s.start for s in box), dtype=dtype)
    for (data, _), place in zip(kept, places, strict=True):
        inner = tuple(
            slice(max(a.start, b.start), min(a.stop, b.stop))
            for a, b in zip(place, box, strict=True)
        )
        if all(s.start < s.stop for s in inner):
            out[_local(inner, box)] = data[_local(inner, place)]
    return out


def _kept_ledger(
    ledger: Ledger,
    kept: Sequence[tuple[np.ndarray, ReadReport]],
    made: Sequence[bool],
    array: Any,
    boxes: Sequence[Box],
    bounds: Sequence[np.ndarray],
) -> None:
    """What a window of patches cut from kept chunks saw: each chunk made for it a miss
    (its retries counted), each kept one a hit; the absent keys of the chunks it reached."""
    counts = ledger.cache = CacheCounts()
    spans, _ = box_chunks(boxes, bounds)
    own = {key for block in spans for key in block_key(array, block)}
    for (data, report), new in zip(kept, made, strict=True):
        if new:
            counts.misses += 1
            ledger.retries += report.retries
        else:
            counts.hits += 1
            counts.bytes_hit += data.nbytes
        ledger.missing.extend(key for key in report.missing_keys if key in own)


def _cut_boxes(
    outs: Sequence[np.ndarray],
    cuts: Sequence[Cut],
    boxes: Sequence[Box],
    filled: Sequence[np.ndarray],
    numbers: range,
    origins: np.ndarray,
    where: np.ndarray,
    starts: Sequence[int],
) -> None:
    """Cut the patches of boxes ``numbers`` (filled: ``filled``) into each cut's output."""
    for number, data in zip(numbers, filled, strict=True):
        a, b = starts[number], starts[number + 1]
        start = np.array([s.start for s in boxes[number]], dtype=np.int64)
        for cut, out in zip(cuts, outs, strict=True):
            rel = origins[a:b] + np.asarray(cut.shift) - start
            _cut(out, where[a:b], data, rel, cut)


#: the smallest stored chunk (bytes) decoded straight into patches (``_direct``): below it the
#: copy saved costs less than the request and copy per patch (measured: 8 x 8 float32 chunks,
#: 16 x 16 patches, 8% slower in place than cut from boxes)
DIRECT_CHUNK_BYTES = 1 << 16


def _direct(
    cuts: Sequence[Cut],
    bounds: Sequence[np.ndarray],
    patches: int,
    boxes: Sequence[Box],
    itemsize: int,
) -> bool:
    """Whether every cut's patches are at least a stored chunk along every axis, and few.

    Then a window's chunks are decoded straight into its outputs (each into a
    patch that holds all of the chunk the window needs, copied from there
    into the other patches that need it: a forecast target, an overlap), not
    into boxes the patches are then cut from.  Chunks of at least
    :data:`DIRECT_CHUNK_BYTES` only.  Few: at most about two
    patches per chunk of the boxes (patches that overlap much are cut from
    boxes by one gather, not a request and copies per patch).
    """
    largest = [int(np.max(np.diff(e))) if len(e) > 1 else 0 for e in bounds]
    if math.prod(largest) * itemsize < DIRECT_CHUNK_BYTES:
        return False
    if not all(
        size >= chunk for cut in cuts for size, chunk in zip(cut.size, largest, strict=True)
    ):
        return False
    touched = sum(math.prod(len(r) for r in chunks_of(box, bounds)) for box in boxes)
    return patches * len(cuts) <= 2 * touched + 8


def _patch_targets(
    cuts: Sequence[Cut], outs: Sequence[np.ndarray], origins: np.ndarray, where: np.ndarray
) -> tuple[list[Box], list[np.ndarray]]:
    """Each patch of each cut as a box to fill: its region of the array, its output row."""
    regions, views = [], []
    for cut, out in zip(cuts, outs, strict=True):
        firsts = (origins + np.asarray(cut.shift)).tolist()
        for first, row in zip(firsts, where.tolist(), strict=True):
            regions.append(tuple(slice(o, o + k) for o, k in zip(first, cut.size, strict=True)))
            views.append(out[row])
    return regions, views


def _coverage(grid: PatchGrid, cuts: Sequence[Cut]) -> Box:
    """The region of the array any patch of the stream reaches (a bound: splits leave gaps)."""
    region = [slice(0, n) for n in cuts[0].size]
    for dim, axis in enumerate(cuts[0].axes):
        origins = grid.origins[dim]
        if not len(origins):
            return tuple(slice(0, 0) for _ in region)
        low = min(c.shift[axis] for c in cuts)
        high = max(c.shift[axis] + c.size[axis] for c in cuts)
        region[axis] = slice(int(origins[0]) + low, int(origins[-1]) + high)
    return tuple(region)


def _box_groups(boxes: Sequence[Box], itemsize: int) -> list[tuple[int, int]]:
    """Consecutive boxes filled at once: at most ``DECODE_GROUP_BYTES`` (at least one box).

    Bounds a window's memory beyond its output when its boxes together are
    large (an exact shuffle's window touches every unit).
    """
    found, lo, held = [], 0, 0
    for number, box in enumerate(boxes):
        nbytes = itemsize * int(np.prod([s.stop - s.start for s in box]))
        if number > lo and held + nbytes > DECODE_GROUP_BYTES:
            found.append((lo, number))
            lo, held = number, 0
        held += nbytes
    if lo < len(boxes):
        found.append((lo, len(boxes)))
    return found


def _cut(out: np.ndarray, where: np.ndarray, data: np.ndarray, rel: np.ndarray, cut: Cut) -> None:
    """Copy the patches at box-relative origins ``rel`` of ``data`` to rows ``where`` of ``out``.

    Patches that form a regular grid in C order (a whole unit, the rows they
    go to consecutive: sequential and buffered windows) are one strided view
    copied in one assignment; others a copy per patch (large patches) or one
    gather (small ones).
    """
    n = len(rel)
    if n == 0:
        return
    run = int(where[-1]) - int(where[0]) + 1 == n and (n == 1 or bool(np.all(np.diff(where) == 1)))
    if n > 1 and run and _cut_grid(out[int(where[0]) : int(where[-1]) + 1], data, rel, cut):
        return
    if n <= 8 or math.prod(cut.size) >= 1024:  # a copy per patch, straight into place
        size = cut.size
        for row, origin in zip(where.tolist(), rel.tolist(), strict=True):
            out[row] = data[tuple([slice(o, o + k) for o, k in zip(origin, size, strict=True)])]
        return
    gathered = np.lib.stride_tricks.sliding_window_view(data, cut.size)[tuple(rel.T)]
    if run:
        out[int(where[0]) : int(where[-1]) + 1] = gathered
    else:
        out[where] = gathered


def _cut_grid(rows: np.ndarray, data: np.ndarray, rel: np.ndarray, cut: Cut) -> bool:
    """Copy patches whose origins are a regular grid in C order as one strided view.

    ``rows`` are the consecutive output rows.  Returns ``False`` (nothing
    copied) when the origins are not such a grid.
    """
    axes = list(cut.axes)
    counts, steps, firsts = [], [], []
    for axis in axes:
        values = np.unique(rel[:, axis])
        step = int(values[1] - values[0]) if len(values) > 1 else 1
        if len(values) > 1 and not np.all(np.diff(values) == step):
            return False
        counts.append(len(values))
        steps.append(step)
        firsts.append(int(values[0]))
    if math.prod(counts) != len(rel):
        return False
    grid = np.stack(
        np.meshgrid(*[f + s * np.arange(c) for f, s, c in zip(firsts, steps, counts, strict=True)],
                    indexing="ij"), axis=-1,
    ).reshape(-1, len(axes))  # fmt: skip
    if not np.array_equal(rel[:, axes], grid):
        return False
    fixed = rel[0]
    start = tuple(
        slice(int(fixed[a]), None) if a not in axes else slice(firsts[axes.index(a)], None)
        for a in range(data.ndim)
    )
    base = data[start]
    view = np.lib.stride_tricks.as_strided(
        base,
        shape=(*counts, *cut.size),
        strides=(*(s * base.strides[a] for s, a in zip(steps, axes, strict=True)), *base.strides),
        writeable=False,
    )
    rows.reshape((*counts, *cut.size))[...] = view
    return True


def _local(inner: Box, outer: Box) -> Box:
    """``inner`` relative to the start of ``outer``."""
    return tuple(
        slice(a.start - b.start, a.stop - b.start) for a, b in zip(inner, outer, strict=True)
    )
