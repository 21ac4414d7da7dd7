"""Graph builders for chunk streams: one stored block, or the inner blocks of one shard.

Dispatched on the source kind (a chunk subset's block is its base's, cropped; a
collection's is its member's); task functions take the array object itself, as in
:mod:`.graphs`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dask.optimization import cull

from ..store.collections import ConcatSource
from ..store.sources import DaskSource, SliceSource, Source
from ..store.sparse import CsrSource
from ..store.subsets import SubsetSource
from .context import DEFAULT_CONTEXT, ReadContext
from .kept import cut_kept_block, read_kept_part
from .shard_tasks import read_shard
from .sparse import read_csr_block
from .tasks import Key, apply_transform, read_block, read_block_part, read_block_result

__all__ = ["block_graph", "shard_graph"]


def block_graph(
    source: Source,
    block: tuple[int, ...],
    token: str,
    transform: Callable[[np.ndarray], Any] | None = None,
    ctx: ReadContext = DEFAULT_CONTEXT,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph reading one stored block (all axes) of ``source``.

    With ``transform``, the read and the transform are one task (the read's
    task nested in the transform's: one task a chunk, as dask fuses
    ``map_blocks`` on ``from_zarr``), so only its result moves and the
    scheduler handles one task, not two.  ``ctx.kept``
    (a cache on a cluster): a Zarr array's stored block (also a chunk
    subset's, a collection member's) is cut from its kept future
    (:func:`cut_kept_block`; ``kept.block``, at ``ctx.priority``), so the
    scheduler runs the block's tasks where it lives and the store is read by
    the kept block's own task alone.
    """
    dsk: dict[Key, Any] = {}
    key = (f"dzb-block-{token}", *block)
    _add_block(source, dsk, key, block, None, ctx)
    if transform is None:
        return dsk, key
    mapped = (f"dzb-map-{token}", *block)
    dsk[mapped] = (apply_transform, transform, dsk.pop(key))
    return dsk, mapped


@functools.singledispatch
def _add_block(
    source: Source,
    dsk: dict[Key, Any],
    key: Key,
    block: tuple[int, ...],
    where: tuple[slice, ...] | None,
    ctx: ReadContext,
) -> None:
    """Add task ``key``: stored ``block`` of ``source``, cropped to ``where`` if given.

    Dispatched on the kind of ``source``.  ``where`` is in ``source``'s
    coordinates (``None``: the whole block).  A collection's block is its
    member's block, read as that member would be; a chunk subset's, its
    base's stored block cropped to the subset's ranges.
    """
    raise TypeError(f"no block read for a source of kind {type(source).__name__}")


@_add_block.register
def _(
    source: SubsetSource,
    dsk: dict[Key, Any],
    key: Key,
    block: tuple[int, ...],
    where: tuple[slice, ...] | None,
    ctx: ReadContext,
) -> None:
    index, slices = source.block_index(block), source.block_slices(block)
    _add_block(source.base, dsk, key, index, slices, ctx)


@_add_block.register
def _(
    source: ConcatSource,
    dsk: dict[Key, Any],
    key: Key,
    block: tuple[int, ...],
    where: tuple[slice, ...] | None,
    ctx: ReadContext,
) -> None:
    member, local = source.member_block(block)
    if where is not None:
        shift = int(source.offsets[member])
        first = slice(where[0].start - shift, where[0].stop - shift)
        where = (first, *where[1:])
    _add_block(source.members[member], dsk, key, local, where, ctx)


@_add_block.register
def _(
    source: SliceSource,
    dsk: dict[Key, Any],
    key: Key,
    block: tuple[int, ...],
    where: tuple[slice, ...] | None,
    ctx: ReadContext,
) -> None:
    whole = source.block_slices(block)
    where = whole if where is None else where
    kept = ctx.kept
    ref = None if kept is None else kept.block(source, block, ctx.priority, read_kept_part)
    if ref is not None:
        origin = tuple(s.start for s in ref[2])
        dsk[key] = (
            cut_kept_block, ref[0], origin, ref[1], source.array, source.name, block, where,
            ctx.for_tasks(),
        )  # fmt: skip
        return
    dsk[key] = (read_block, source.array, source.name, block, where, ctx.for_tasks())


@_add_block.register
def _(
    source: CsrSource,
    dsk: dict[Key, Any],
    key: Key,
    block: tuple[int, ...],
    where: tuple[slice, ...] | None,
    ctx: ReadContext,
) -> None:
    """A unit of sparse rows (every column), as one CSR matrix."""
    rows = (where or source.block_slices(block))[0]
    dsk[key] = (read_csr_block, source, rows.start, rows.stop, ctx.for_tasks())


@_add_block.register
def _(
    source: DaskSource,
    dsk: dict[Key, Any],
    key: Key,
    block: tuple[int, ...],
    where: tuple[slice, ...] | None,
    ctx: ReadContext,
) -> None:
    block_key = (source.array.name, *block)
    dsk.update(cull(source.graph, [block_key])[0])
    if where is None:
        dsk[key] = (read_block_result, block_key)
        return
    whole = source.block_slices(block)
    local_part = tuple(
        slice(w.start - s.start, w.stop - s.start) for w, s in zip(where, whole, strict=True)
    )
    dsk[key] = (read_block_part, block_key, local_part)


def shard_graph(
    source: SliceSource,
    blocks: Sequence[tuple[int, ...]],
    token: str,
    transform: Callable[[np.ndarray], Any] | None = None,
    ctx: ReadContext = DEFAULT_CONTEXT,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph reading the inner ``blocks`` of one shard with one task.

    Its result is a list of :data:`ShardItem`, one per block, in order.
    """
    dsk: dict[Key, Any] = {}
    key = (f"dzb-shard-{token}", *blocks[0])
    slices = tuple(source.block_slices(block) for block in blocks)
    dsk[key] = (
        read_shard, source.array, source.name, tuple(blocks), slices, ctx.for_tasks(), transform
    )  # fmt: skip
    return dsk, key
