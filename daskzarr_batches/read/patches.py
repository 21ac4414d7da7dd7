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

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import zarr

from ..errors import ReadCancelledError
from ..plan.budget import DECODE_GROUP_BYTES
from ..plan.patches import Box, Cut, PatchGrid, box_chunks, chunk_bytes, merge_boxes
from ..plan.windows import ChunkPiece, chunk_offsets
from ..store.cache import CacheCounts
from ..store.layout import block_key
from ..store.policy import (
    CancelScope,
    Ledger,
    ReadReport,
    is_program_error,
    program_error,
)
from ..store.zarr_adapter import async_array, nd_buffer
from .chunk_share import ChunkShare, _Abandoned, _edges, _no_share  # noqa: F401
from .context import DEFAULT_CONTEXT, ReadContext
from .patch_skips import _missing_blocks, _runs, _touching
from .tasks import read_block, read_views, run_on_loop

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
    dtype = np.dtype(array.dtype)
    # one box per unit, those whose union is a box merged (box k: units firsts[k]:firsts[k+1])
    boxes, firsts = merge_boxes(
        grid.boxes(ids, groups, cuts) if len(ids) else [], dtype.itemsize, DECODE_GROUP_BYTES
    )
    bounds = [chunk_offsets(sizes) for sizes in chunks]
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
    if share is not None and boxes and share.uses is not None:  # other windows claim these
        edges = frozenset(b for b in box_chunks(boxes, bounds)[0] if share.shared(b))
    elif share is not None and boxes:  # the chunks the windows before and after may need
        edges = _edges(boxes, bounds, cuts, origins)
    coverage = _coverage(grid, cuts)
    for lo, hi in _box_groups(boxes, dtype.itemsize):
        part = boxes[lo:hi]
        if kept is not None:
            filled = [_kept_box(box, kept, kept_places, dtype) for box in part]
        elif isinstance(array, np.ndarray):
            filled = [array[box] for box in part]
        elif isinstance(array, zarr.Array):
            filled, lost, mine = _read_boxes(
                array, name, part, bounds, ledger, ctx, share, coverage, edges
            )
            bad |= lost
            done |= mine
        else:  # a dask array: the boxes in one compute, each shared block once
            import dask

            filled = list(dask.compute(*[array[box] for box in part], scheduler="sync"))
        for number, data in zip(range(lo, hi), filled, strict=True):
            a, b = starts[firsts[number]], starts[firsts[number + 1]]
            start = np.array([s.start for s in boxes[number]], dtype=np.int64)
            for cut, out in zip(cuts, outs, strict=True):
                rel = origins[a:b] + np.asarray(cut.shift) - start
                _cut(out, where[a:b], data, rel, cut)
        if pool is not None:
            for data in filled:  # cut: the boxes serve the next window
                pool.give(data)
        del filled
    decoded: tuple[tuple[Block, int], ...] = ()
    if kept is not None:
        _kept_ledger(ledger, kept, kept_made, array, boxes, bounds)
        decoded = chunk_bytes(box_chunks(boxes, bounds)[0], bounds, dtype.itemsize)
    elif isinstance(array, zarr.Array):
        decoded = chunk_bytes(sorted(done), bounds, dtype.itemsize)
    elif not isinstance(array, np.ndarray):
        decoded = chunk_bytes(box_chunks(boxes, bounds)[0], bounds, dtype.itemsize)
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


def _read_boxes(
    array: zarr.Array,
    name: str,
    boxes: Sequence[Box],
    bounds: Sequence[np.ndarray],
    ledger: Ledger,
    ctx: ReadContext,
    share: ChunkShare | None = None,
    coverage: Box = (),
    edges: frozenset[Block] = frozenset(),
) -> tuple[list[np.ndarray], set[Block], set[Block]]:
    """Fill each box from the chunks it overlaps, each chunk decoded once.

    Also returns the chunks that did not decode (``on_error="skip"``) and
    the chunks this task decoded (not those another window's read handed on
    through ``share``).
    """
    spans, users = box_chunks(boxes, bounds)
    dtype = np.dtype(array.dtype)
    pool = ctx.pool
    filled = [
        np.empty(shape, dtype=dtype) if pool is None else pool.take(shape, dtype)
        for shape in (tuple(s.stop - s.start for s in box) for box in boxes)
    ]

    def place(block: Block, data: np.ndarray) -> None:
        span = spans[block]
        for number in users[block]:
            box = boxes[number]
            inner = tuple(
                slice(max(a.start, b.start), min(a.stop, b.stop))
                for a, b in zip(span, box, strict=True)
            )
            filled[number][_local(inner, box)] = data[_local(inner, span)]

    def keys() -> list[str]:
        return [key for block in spans for key in block_key(array, block)]

    fast, _ = read_views(array, name, ctx.policy, ledger, keys, ctx.scope)
    bad: set[Block] = set()
    decoded: set[Block] = set()
    inner = async_array(fast)
    try:
        if inner is None:
            raise RuntimeError("not an asynchronous array")
        job = _BoxJob(spans, users, boxes, filled, place, bounds, coverage, edges)
        _decode_concurrently(inner, job, dtype.itemsize, ctx.scope, share, decoded)
    except ReadCancelledError:
        raise
    except Exception as exc:  # read again chunk by chunk, so that the error names the chunk
        if is_program_error(exc):
            error = program_error(exc, f"a window of patches of array {name}")
            raise error from error.__cause__
        for block, span in spans.items():
            data, report = read_block(array, name, block, span, ctx)
            ledger.retries += report.retries
            ledger.missing.extend(report.missing_keys)
            if data is None:  # on_error="skip": its patches leave the window
                bad.add(block)
                continue
            decoded.add(block)
            place(block, data)
    return filled, bad, decoded


@dataclasses.dataclass(frozen=True)
class _BoxJob:
    """One group of a window's boxes to fill: per chunk its span and the boxes using it
    (``box_chunks``), the boxes and their arrays, ``place(block, data)`` copying a decoded
    span into each box using it, the chunk bounds, the stream's ``coverage`` and the
    window's ``edges`` (see :func:`_decode_concurrently`)."""

    spans: dict[Block, Box]
    users: dict[Block, list[int]]
    boxes: Sequence[Box]
    filled: list[np.ndarray]
    place: Any
    bounds: Sequence[np.ndarray] = ()
    coverage: Box = ()
    edges: frozenset[Block] = frozenset()


def _decode_concurrently(
    inner: Any,
    job: _BoxJob,
    itemsize: int,
    scope: CancelScope | None,
    share: ChunkShare | None = None,
    decoded: set[Block] | None = None,
) -> None:
    """Decode every chunk's span on Zarr's event loop.

    A chunk whose span only one box needs is decoded straight into that box
    (Zarr's selection with an ``out`` buffer: no copy); one shared by several
    boxes (a halo) is decoded once and copied into each.  With a ``share``,
    the chunks at the window's edges (``edges``: those of its first and last
    units, which the windows before and after it may need) and any chunk
    another window has claimed are decoded once for all the windows that
    claim them: into its box when this window is the only one that can need
    it all (its span is the part of the chunk inside ``coverage``, the region
    any patch of the stream reaches), handed on as a copy, else that part of
    it decoded on its own, so a window after can take the rest; either way
    what is handed on is the chunk's part inside ``coverage`` (a split's gap
    or an array's end the stream never reaches is not in it).  ``decoded``
    collects the chunks this call decoded.
    """
    spans, users, boxes, filled, place = job.spans, job.users, job.boxes, job.filled, job.place
    bounds, coverage, edges = job.bounds, job.coverage, job.edges
    decoded = set() if decoded is None else decoded
    largest = max((np.prod([s.stop - s.start for s in span]) for span in spans.values()), default=1)
    limit = max(4, DECODE_GROUP_BYTES // max(int(largest) * itemsize, 1))

    async def read_all() -> None:
        gate = asyncio.Semaphore(limit)

        async def whole(block: Block, extent: Box) -> np.ndarray:
            decoded.add(block)
            return np.asarray(await inner.getitem(extent))

        async def into(block: Block, span: Box) -> np.ndarray:
            """Decode ``span`` of ``block`` straight into its one box; that part of the box."""
            (owner,) = users[block]
            decoded.add(block)
            target = filled[owner][_local(span, boxes[owner])]
            await inner.get_orthogonal_selection(span, out=nd_buffer(target))
            return target

        async def one(block: Block, span: Box) -> None:
            async with gate:
                alone = len(users[block]) == 1
                if share is None or (block not in edges and block not in share.entries):
                    if alone:
                        await into(block, span)
                    else:
                        decoded.add(block)
                        place(block, np.asarray(await inner.getitem(span)))
                    return
                extent = tuple(
                    slice(int(e[b]), int(e[b + 1])) for b, e in zip(block, bounds, strict=True)
                )
                needed = tuple(
                    slice(max(e.start, c.start), min(e.stop, c.stop))
                    for e, c in zip(extent, coverage, strict=True)
                )
                # What is handed on is always ``needed`` (the part of the chunk any
                # patch reaches), however the first claim decoded it: a waiter cuts
                # its span relative to ``needed``'s start, never the chunk's.
                mine: list[np.ndarray] = []
                if alone and span == needed:  # decoded into its box, a copy handed on

                    async def read() -> np.ndarray:
                        mine.append(await into(block, span))
                        return mine[0].copy()  # the box goes back to the pool

                    data = await share.decode(block, read)
                    if mine:
                        return
                else:
                    data = await share.decode(block, lambda: whole(block, needed))
                start = [s.start for s in needed]
                local = tuple(
                    slice(s.start - a, s.stop - a) for s, a in zip(span, start, strict=True)
                )
                place(block, data[local])

        async with asyncio.TaskGroup() as group:  # a failure cancels the siblings
            for block, span in spans.items():
                group.create_task(one(block, span))

    run_on_loop(read_all(), scope)


def _local(inner: Box, outer: Box) -> Box:
    """``inner`` relative to the start of ``outer``."""
    return tuple(
        slice(a.start - b.start, a.stop - b.start) for a, b in zip(inner, outer, strict=True)
    )
