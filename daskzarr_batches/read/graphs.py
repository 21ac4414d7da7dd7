"""Graph builders: one dask graph per window, or per stored block or shard, of task functions.

Task functions take the array object itself as an argument (not a key of its
own), so distributed sends it with each task and no worker is pinned by a
shared key."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from collections.abc import Sequence
from typing import Any, cast

from dask.optimization import cull

from ..plan.windows import ChunkPiece, Window
from ..store.collections import ConcatSource, SourcesSource
from ..store.patches import PatchSource
from ..store.sources import DaskSource, SliceSource, Source
from ..store.sparse import CsrSource
from ..store.subsets import SubsetSource
from .context import DEFAULT_CONTEXT, Kept, ReadContext
from .kept import cut_kept_chunks, read_kept_part
from .patches import KeptBlocks, PatchBase, kept_blocks, patch_ids, read_origins, read_patches
from .sparse import read_csr_window
from .tasks import (
    Key,
    assemble_rows,
    join_members,
    join_pieces,
    read_sources,
    window_output,
)
from .window import (
    MemberWindow,
    read_member_window,
    read_subset_window,
    read_window,
)

__all__ = [
    "count_tasks",
    "read_threads",
    "window_graph",
]


def window_graph(
    sources: Sequence[Source],
    window: Window,
    token: str,
    ctx: ReadContext = DEFAULT_CONTEXT,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph of one window; its result is one ``(rows, ReadReport)`` per source.

    Each array holds the window's samples in *ascending sample order* (chunk
    by chunk, ``take`` ascending), the same order for every source, so each
    array is filled with contiguous copies.  The window's own order is applied
    while batches are cut (``window.gather_index()``), in the copy that makes
    each batch an owned array anyway: permuting here as well would cost a
    scattered write of the whole window.

    ``ctx.plan_order`` (results that travel to another process: a cluster)
    writes each chunk's rows straight to their place in the window's plan
    order instead (the pieces' ``dest``): the scattered write replaces the
    contiguous one on the worker, and the consumer cuts batches by slicing.

    ``ctx.decode_bytes``: see :func:`read_window` (shared by the window's
    arrays, in proportion to their row sizes).  ``ctx.shares``: a patch
    stream's :class:`ChunkShare` per base array (``id``), which its windows'
    reads use; ``ctx.pool``: where patch reads and Zarr arrays' window reads
    take their outputs from (local reads; the consumer gives them back once cut).

    ``ctx.kept`` (a cache on a cluster): a Zarr array's window (a chunk
    subset's base, a collection's member), when every chunk it touches is
    kept as a cluster future, is one task cutting its rows from those futures
    (:func:`cut_kept_chunks`), and a patch window's boxes are filled from
    them, so the scheduler runs it where most of its chunks live and the
    store is read only by the chunks' own tasks, once each while the cache
    keeps them.
    """
    ctx = ctx.narrowed(priority=-window.index)
    dsk: dict[Key, Any] = {}
    outputs = []
    groups: dict[int, tuple[Key, list[int]]] = {}  # patch sources by base array
    for position, (source, pieces) in enumerate(zip(sources, window.pieces, strict=True)):
        out_key = (f"dzb-array-{token}", window.index, position)
        outputs.append(out_key)
        here = ctx.narrowed(decode_bytes=_share(ctx.decode_bytes, source, sources))
        output = _Output(window, tuple(pieces), out_key, token, position, groups)
        _add_output(source, dsk, output, here)
    window_key = (f"dzb-window-{token}", window.index)
    dsk[window_key] = (tuple, outputs)
    return dsk, window_key


@dataclasses.dataclass(frozen=True)
class _Output:
    """One output of a window graph being built: its window, pieces, key, the graph's token,
    its position and the patch sources' read tasks by base array (shared by the outputs)."""

    window: Window
    pieces: tuple[ChunkPiece, ...]
    key: Key
    token: str
    position: int
    groups: dict[int, tuple[Key, list[int]]]


@functools.singledispatch
def _add_output(source: Source, dsk: dict[Key, Any], output: _Output, ctx: ReadContext) -> None:
    """Add task ``output.key``: the window's ``(rows, ReadReport)`` of ``source``."""
    where = (output.token, output.window.index, output.position)
    _add_rows(source, dsk, output.pieces, output.window.size, (output.key, where), ctx)


@_add_output.register
def _(source: PatchSource, dsk: dict[Key, Any], output: _Output, ctx: ReadContext) -> None:
    _add_patches(dsk, source, output, ctx)


@_add_output.register
def _(source: SourcesSource, dsk: dict[Key, Any], output: _Output, ctx: ReadContext) -> None:
    """Provenance: computed from the sample ids (a chunk subset's pieces mapped to its base)."""
    pieces = output.pieces
    base_piece = getattr(source.rows, "base_piece", None)
    if base_piece is not None:
        pieces = tuple(base_piece(piece) for piece in pieces)
    dsk[output.key] = (
        read_sources, source.collection.offsets, pieces, output.window.size, ctx.plan_order,
    )  # fmt: skip


#: ``(out_key, where)``: a task's key and (token, window, output), unique per helper task
RowKeys = tuple[Key, tuple[Any, ...]]


@functools.singledispatch
def _add_rows(
    source: Source,
    dsk: dict[Key, Any],
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: RowKeys,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None = None,
    into: Any = None,
) -> None:
    """Add task ``keys[0]``: ``(rows, ReadReport)`` of ``pieces`` of one array.

    Dispatched on the kind of ``source``.  ``keys[1]`` (token, window,
    output) makes the keys of helper tasks unique.  ``ctx.kept`` (a cache on
    a cluster): a Zarr array's rows, when every chunk they touch is kept, are
    cut from the kept chunks (:func:`cut_kept_chunks`), whatever holds the
    array (a chunk subset's base, a collection's member).  ``local``: a
    chunk subset's chunk map (its pieces already mapped to the base array),
    its report given in the subset's chunks.  ``into``: a task giving the
    rows of a shared output the read fills (a collection's member read here,
    :func:`_add_members`); readers other than :func:`read_window` ignore it
    (the join copies their rows).  ``ctx.pool``: where a Zarr array's rows
    are read into, when the output is the window's own (not a collection
    member's, which is joined).
    """
    raise TypeError(f"no window read for a source of kind {type(source).__name__}")


@_add_rows.register
def _(
    source: SubsetSource,
    dsk: dict[Key, Any],
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: RowKeys,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None = None,
    into: Any = None,
) -> None:
    """A chunk subset's pieces, read in place in its base array."""
    pieces = tuple(source.base_piece(piece) for piece in pieces)
    _add_rows(source.base, dsk, pieces, size, keys, ctx, source.local_chunks(), into)


@_add_rows.register
def _(
    source: ConcatSource,
    dsk: dict[Key, Any],
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: RowKeys,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None = None,
    into: Any = None,
) -> None:
    _add_members(dsk, source, pieces, size, keys, ctx, local)


@_add_rows.register
def _(
    source: SliceSource,
    dsk: dict[Key, Any],
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: RowKeys,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None = None,
    into: Any = None,
) -> None:
    out_key, _ = keys
    if _add_kept(dsk, source, pieces, size, out_key, ctx, local):
        return
    args = (source.array, source.name, size, source.row_bytes, tuple(pieces), ctx.for_tasks())
    if local is None:
        dsk[out_key] = (read_window, *args, into)
    else:
        dsk[out_key] = (read_subset_window, local, *args, into)


@_add_rows.register
def _(
    source: CsrSource,
    dsk: dict[Key, Any],
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: RowKeys,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None = None,
    into: Any = None,
) -> None:
    """Sparse rows: one task gathering the rows from their stored chunks, each decoded once."""
    dsk[keys[0]] = (read_csr_window, source, tuple(pieces), size, ctx.for_tasks())


@_add_rows.register
def _(
    source: DaskSource,
    dsk: dict[Key, Any],
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: RowKeys,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None = None,
    into: Any = None,
) -> None:
    """One task per axis-0 chunk, on the array's own culled graph, and a join."""
    out_key, where = keys
    piece_keys = []
    for piece in pieces:
        key = (f"dzb-read-{where[0]}", *where[1:], piece.chunk)
        _add_dask_rows(dsk, source, key, piece)
        piece_keys.append(key)
    dests = [piece.dest for piece in pieces] if ctx.plan_order else None
    dsk[out_key] = (join_pieces, piece_keys, dests)


def _add_kept(
    dsk: dict[Key, Any],
    source: SliceSource,
    pieces: Sequence[ChunkPiece],
    size: int,
    out_key: Key,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None,
) -> bool:
    """Add task ``out_key`` cutting ``pieces`` from kept chunks, if the cache keeps them all.

    Returns whether it did (else the caller reads the pieces from the store).
    """
    if ctx.kept is None or not pieces:
        return False
    refs = [ctx.kept_chunk(source, piece) for piece in pieces]
    if not all(ref is not None for ref in refs):
        return False
    futures = [ref[0] for ref in refs if ref is not None]
    made = tuple(ref[1] for ref in refs if ref is not None)
    dsk[out_key] = (cut_kept_chunks, futures, tuple(pieces), size, ctx.plan_order, made, local)
    return True


def _add_members(
    dsk: dict[Key, Any],
    source: ConcatSource,
    pieces: Sequence[ChunkPiece],
    size: int,
    keys: tuple[Key, tuple[Any, ...]],
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None,
) -> None:
    """Add a collection's rows: one read per member the window touches, then one join.

    Each member is read by the reader it would have alone (in ascending
    order; ``ctx.decode_bytes`` shared by the member reads that run at once).
    Read here (``ctx.plan_order`` false: the local threads, which share memory),
    one task makes the window's output and each member's read writes its
    rows straight into its part of it (ascending sample order: the members'
    rows one after another), so the join only merges the reports and the
    window is held once, as for one array.  On a cluster (``plan_order``) the
    member reads run on any worker, so the join places each piece's rows at
    its ``dest`` (plan order), a copy of the window beside the members'.
    Either way the join maps the reports to the collection's chunks.
    ``ctx.pool``: where the shared output is taken from (not an exact window's).
    """
    out_key, where = keys
    decode_bytes, plan_order = ctx.decode_bytes, ctx.plan_order
    parts, maps, placed = [], [], []
    touched = source.split(pieces)
    # the member reads that run at once (read_threads) share the window's decode bytes
    share = None
    if decode_bytes is not None:
        share = max(1, decode_bytes // min(len(touched), 4 * MEMBER_READS))
    shared = None  # sparse members' rows are stacked by the join
    if _shares_output(plan_order) and not source.sparse:
        shared = (f"dzb-rows-{where[0]}", *where[1:])
    if shared is not None and _read_together(source, touched, ctx):
        _add_members_together(dsk, source, touched, size, out_key, ctx, local)
        return
    if shared is not None:
        dsk[shared] = (
            window_output,
            size,
            source.shape[1:],
            source.dtype,
            decode_bytes is not None,
            ctx.pool,
        )
    member_ctx = ctx.narrowed(plan_order=False, decode_bytes=share, pool=None)
    at = 0
    starts = []
    for member, member_pieces in touched:
        rows = sum(_taken(piece) for piece in member_pieces)
        key = (f"dzb-member-{where[0]}", *where[1:], member)
        into = None if shared is None else (operator.getitem, shared, slice(at, at + rows))
        _add_rows(
            source.members[member], dsk, member_pieces, rows,
            (key, (f"{where[0]}-m{member}", *where[1:])), member_ctx, None, into,
        )  # fmt: skip
        parts.append(key)
        starts.append(at)
        at += rows
        to_global = source._grid[2][member]
        maps.append((to_global, int(source.offsets[member])))
        if plan_order:
            placed.append([(p.chunk, p.dest, _taken(p)) for p in member_pieces])
    placement = (size, placed) if plan_order else None
    within = None if shared is None else (shared, starts)
    dsk[out_key] = (join_members, parts, maps, placement, local, within)


def _read_together(
    source: ConcatSource,
    touched: Sequence[tuple[int, Sequence[ChunkPiece]]],
    ctx: ReadContext,
) -> bool:
    """Whether a local window's members are read by one task (:func:`read_members`).

    When every member it touches is a Zarr array of the plain zstd layout
    (``store.direct``), without a cache.
    """
    if ctx.kept is not None or ctx.policy.cache is not None:
        return False
    layouts = source.direct_layouts
    return all(layouts[m] is not None for m, _ in touched)


def _add_members_together(
    dsk: dict[Key, Any],
    source: ConcatSource,
    touched: Sequence[tuple[int, Sequence[ChunkPiece]]],
    size: int,
    out_key: Key,
    ctx: ReadContext,
    local: dict[int, tuple[int, int, int]] | None,
) -> None:
    """Add a local window's members as one task: output, members read together, join."""
    reads, starts, maps, at = [], [], [], 0
    for member, member_pieces in touched:
        base = cast(SliceSource, source.members[member])  # a direct layout: a Zarr array
        layout = source.direct_layouts[member]
        reads.append((base.array, base.name, base.row_bytes, tuple(member_pieces), layout))
        starts.append(at)
        at += sum(_taken(piece) for piece in member_pieces)
        maps.append((source._grid[2][member], int(source.offsets[member])))
    window = MemberWindow(
        tuple(reads), tuple(starts), tuple(maps), size, source.shape[1:], source.dtype, local,
        ctx.decode_bytes,
    )  # fmt: skip
    dsk[out_key] = (read_member_window, window, ctx.for_tasks())


def _shares_output(plan_order: bool) -> bool:
    """Whether a collection's member reads fill one output: reads in this process."""
    return not plan_order


def _taken(piece: ChunkPiece) -> int:
    take = piece.take
    return len(range(piece.rows)[take]) if isinstance(take, slice) else len(take)


def _add_patches(
    dsk: dict[Key, Any], source: PatchSource, output: _Output, ctx: ReadContext
) -> None:
    """Add ``output`` of a patch source: one read task per base array, shared.

    ``ctx.kept`` (a cache on a cluster): a Zarr base array's boxes are filled
    from its kept stored blocks (``kept.block``: every one the window's
    boxes overlap), so the task runs where they live and reads nothing from
    the store.
    """
    window, pieces, out_key, groups = output.window, output.pieces, output.key, output.groups
    token, position = output.token, output.position
    grid = source.grid
    assert grid is not None
    if source.cut is None:  # the patches' origins
        dsk[out_key] = (
            read_origins, grid, source.group[0], window.size, tuple(pieces), ctx.plan_order
        )  # fmt: skip
        return
    base = source.base
    assert base is not None
    group = id(base)
    if group not in groups:
        key = (f"dzb-patches-{token}", window.index, position)
        array = getattr(base, "array", None)  # a Zarr, numpy or dask array
        kept: tuple[Any, ...] = ()  # the KeptBlocks, as three arguments (futures in a list)
        if ctx.kept is not None and base.sliced:  # a Zarr or numpy array's blocks are kept
            ids, counts, _ = patch_ids(pieces, window.size, ctx.plan_order)
            boxes = grid.boxes(ids, counts, source.group) if len(ids) else []
            parts = _kept_parts(base, ctx.kept, kept_blocks(base.chunks, boxes), ctx.priority)
            if parts:  # every stored block the boxes reach is kept
                kept = KeptBlocks([p[0] for p in parts], tuple(p[2] for p in parts),
                                  tuple(p[1] for p in parts))  # fmt: skip
        share = (ctx.shares or {}).get(group)
        stored = PatchBase(base.name, base.chunks, grid, source.group)
        dsk[key] = (
            read_patches, array, stored, window.size, tuple(pieces), ctx.for_tasks(), share, *kept,
        )  # fmt: skip
        groups[group] = (key, [])
    key, _ = groups[group]
    dsk[out_key] = (operator.getitem, key, source.group.index(source.cut))


@functools.singledispatch
def _kept_parts(
    source: Source, kept: Kept, blocks: Sequence[tuple[int, ...]], priority: int
) -> list[tuple[Any, bool, tuple[slice, ...]]]:
    """The kept parts holding ``blocks``, each once (a shard holds several); empty if one
    of them is not kept (or there are no blocks).  Only sliced arrays' blocks are kept."""
    return []


@_kept_parts.register
def _(
    source: SliceSource, kept: Kept, blocks: Sequence[tuple[int, ...]], priority: int
) -> list[tuple[Any, bool, tuple[slice, ...]]]:
    parts: dict[tuple[tuple[int, int], ...], tuple[Any, bool, tuple[slice, ...]]] = {}
    for block in blocks:
        ref = kept.block(source, block, priority, read_kept_part)
        if ref is None:
            return []
        parts.setdefault(tuple((s.start, s.stop) for s in ref[2]), ref)
    return list(parts.values())


def _share(decode_bytes: int | None, source: Source, sources: Sequence[Source]) -> int | None:
    """``source``'s part of a window's ``decode_bytes``: its part of the row bytes."""
    if decode_bytes is None:
        return None
    total = sum(other.row_bytes for other in sources)
    return decode_bytes * source.row_bytes // max(total, 1)


def count_tasks(sources: Sequence[Source], window: Window) -> int:
    """Tasks of :func:`window_graph` for ``window`` (data entries excluded)."""
    dsk, _ = window_graph(sources, window, "count")
    return len(dsk)


def read_threads(sources: Sequence[Source]) -> int | None:
    """Local read threads that suit windows of ``sources`` (``None``: one per CPU).

    A window of Zarr or numpy arrays is one task per array, each decoding its
    chunks concurrently inside Zarr: four threads per array read the windows
    in flight (``prefetch + 1`` windows' worth of samples: the default three,
    or the fast-start ramp's small windows together) at once, in order, so
    batch cutting overlaps the next reads and a high-latency store sees every
    ramp window's requests at once (the measurements are in docs/benchmarks.md).
    A patch stream's window is one task per base array (its outputs share it)
    and one for the origins.
    """
    patches = [_patch_read(source) for source in sources]
    if any(read is not None for read in patches):
        reads = {read for read in patches if read}  # the origins' (0) read nothing
        return 4 * max(len(reads), 1)
    if all(_sliced(source) for source in sources):
        return 4 * sum(_reads(source) for source in sources)
    return None


#: A collection's window reads up to this many members at once per array (each member
#: read is one task; a window of an exact shuffle touches every member).
MEMBER_READS = 8


@functools.singledispatch
def _patch_read(source: Source) -> int | None:
    """A patch source's read task (its base array's ``id``; 0: the origins), else ``None``."""
    return None


@_patch_read.register
def _(source: PatchSource) -> int | None:
    return id(source.base) if source.cut is not None else 0


@functools.singledispatch
def _reads(source: Source) -> int:
    """Read tasks of one array a window may run at once: a collection's members, capped."""
    return 1


@_reads.register
def _(source: SubsetSource) -> int:
    return _reads(source.base)


@_reads.register
def _(source: ConcatSource) -> int:
    return max(1, min(len(source.members), MEMBER_READS))


@functools.singledispatch
def _sliced(source: Source) -> bool:
    """Whether ``source`` is read by slicing arrays (Zarr or numpy), whatever wraps them."""
    return False


@_sliced.register(SliceSource)
@_sliced.register(SourcesSource)
def _(source: Source) -> bool:
    return True


@_sliced.register
def _(source: SubsetSource) -> bool:
    return _sliced(source.base)


@_sliced.register
def _(source: ConcatSource) -> bool:
    return all(_sliced(member) for member in source.members)


def _add_dask_rows(dsk: dict[Key, Any], source: DaskSource, key: Key, piece: ChunkPiece) -> None:
    """Add task ``key``: rows ``piece.take`` of an axis-0 chunk of a dask array."""
    grid = [range(len(sizes)) for sizes in source.chunks[1:]]
    keys = [(source.array.name, piece.chunk, *rest) for rest in itertools.product(*grid)]
    dsk.update(cull(source.graph, keys)[0])
    layout = tuple(len(sizes) for sizes in source.chunks[1:])
    dsk[key] = (
        assemble_rows, source.name, piece.chunk, piece.start, piece.stop, piece.take, layout, keys
    )  # fmt: skip
