"""The cluster tier of the chunk cache: the read tasks whose results a cache keeps as
cluster futures, and the tasks that cut a window's rows or a block from them.

``execute.runners.Keeper`` keeps the futures; the graph builders (:mod:`.graphs`,
:mod:`.blocks`) ask it (``ReadContext.kept``) and build these tasks on what it keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..plan.windows import ChunkPiece
from ..store.cache import CacheCounts
from ..store.layout import block_key
from ..store.policy import ReadPolicy, ReadReport
from .context import ReadContext
from .shard_tasks import read_shard
from .tasks import read_block
from .window import _taken, _without, in_subset, read_window

__all__ = ["cut_kept_block", "cut_kept_chunks", "read_kept_chunk", "read_kept_part"]


def read_kept_chunk(
    array: Any, name: str, piece: ChunkPiece, row_bytes: int, policy: ReadPolicy
) -> tuple[np.ndarray, ReadReport]:
    """Every row of one axis-0 chunk (``piece`` takes all), kept on a cluster by a cache.

    The chunk task a :class:`ChunkCache` holds as a cluster future: the read
    of a one-chunk window, with the stream's read policy (missing chunks,
    ``on_error``, retries), its result read-only (windows on an in-process
    cluster share it).
    """
    ctx = ReadContext(policy)
    rows, report = read_window(array, name, piece.rows, row_bytes, (piece,), ctx)
    rows.setflags(write=False)
    return rows, report


def cut_kept_chunks(
    parts: Sequence[tuple[np.ndarray, ReadReport]],
    pieces: Sequence[ChunkPiece],
    size: int,
    plan_order: bool,
    made: Sequence[bool],
    local: dict[int, tuple[int, int, int]] | None = None,
) -> tuple[np.ndarray, ReadReport]:
    """One window's rows cut from the kept chunks ``parts`` (one per piece), and its report.

    As :func:`read_window` returns them: ascending sample order, or plan
    order; the rows of chunks skipped as undecodable left out.  ``made``:
    whether each chunk's task was made for this window (a cache miss; its
    retries are counted here), else it was kept from before (a hit).
    ``local``: a chunk subset's window (the pieces mapped to its base
    array), its report in the subset's chunks as :func:`read_subset_window`
    gives it.
    """
    first = parts[0][0]
    out = np.empty((size, *first.shape[1:]), first.dtype)
    skipped: list[tuple[ChunkPiece, int]] = []
    missing_keys: dict[str, None] = {}
    missing_chunks: list[int] = []
    counts = CacheCounts()
    retries, at = 0, 0
    for (rows, report), piece, new in zip(parts, pieces, made, strict=True):
        taken = _taken(piece)
        if new:
            counts.misses += 1
            retries += report.retries
        else:
            counts.hits += 1
            counts.bytes_hit += rows.nbytes
        missing_keys.update(dict.fromkeys(report.missing_keys))
        if report.missing_chunks:
            missing_chunks.append(piece.chunk)
        if report.skipped:
            skipped.append((piece, at))
        elif plan_order:
            out[piece.dest] = rows[piece.take]
        else:
            out[at : at + taken] = rows[piece.take]
        at += taken
    report = ReadReport(
        cache=counts,
        missing_keys=tuple(missing_keys),
        missing_chunks=tuple(missing_chunks),
        retries=retries,
        skipped=tuple((p.chunk, p.start, p.stop) for p, _ in skipped),
    )
    rows = _without(out, skipped, size, plan_order)
    return rows, report if local is None else in_subset(report, local)


def read_kept_part(
    array: Any,
    name: str,
    blocks: Sequence[tuple[int, ...]],
    slices: Sequence[tuple[slice, ...]],
    region: tuple[slice, ...],
    policy: ReadPolicy,
) -> tuple[np.ndarray | None, ReadReport]:
    """Stored ``blocks`` (at ``slices``) decoded into one array covering ``region``.

    The part of an array a cache keeps on a cluster for chunk streams and
    patches (``Keeper.block``): one block (:func:`read_block`), or every
    inner block of one shard, fetched once by the shard reader
    (:func:`read_shard`), with ``policy`` (missing chunks, ``on_error``,
    retries); read-only (tasks on an in-process cluster share it).  A block
    skipped as undecodable is listed in the report (its rows left
    unwritten): whoever cuts it reads that block again on its own.
    """
    if len(blocks) == 1:
        data, report = read_block(array, name, blocks[0], slices[0], ReadContext(policy))
    else:
        items = read_shard(array, name, blocks, slices, ReadContext(policy))
        data = np.empty(tuple(s.stop - s.start for s in region), dtype=array.dtype)
        skipped: list[tuple[int, int, int]] = []
        for (_, item, report, _), where in zip(items, slices, strict=True):
            skipped.extend(report.skipped)
            if item is not None:
                data[tuple(slice(w.start - r.start, w.stop - r.start)
                           for w, r in zip(where, region, strict=True))] = item  # fmt: skip
        first = items[0][2]
        report = ReadReport(
            missing_keys=first.missing_keys,
            missing_chunks=first.missing_chunks,
            retries=sum(item[2].retries for item in items),
            skipped=tuple(skipped),
        )
    if data is not None:
        data.setflags(write=False)
    return data, report


def cut_kept_block(
    part: tuple[np.ndarray | None, ReadReport],
    origin: tuple[int, ...],
    made: bool,
    array: Any,
    name: str,
    block: tuple[int, ...],
    slices: tuple[slice, ...],
    ctx: ReadContext,
) -> tuple[np.ndarray | None, ReadReport]:
    """Stored ``block`` (at ``slices``) cut from its kept axis-0 chunk ``part``, and its report.

    A chunk stream's block on a cluster with a cache: ``part`` is what the
    cache keeps for it, the block itself (``read_block``) or, for a block
    spanning every column, its whole axis-0 chunk (:func:`read_kept_chunk`),
    starting at ``origin`` in the array; the block is a copy of its part
    (the caller owns it), a miss if ``made`` for this block, else a hit.
    The part's missing keys are reported if they are the block's own.  If
    the part was skipped as undecodable, the block is read alone
    (:func:`read_block`, ``ctx.policy`` less its cache), so that it is skipped
    (or read) as without a cache.
    """
    kept, report = part
    if report.skipped or kept is None:
        return read_block(array, name, block, slices, ctx.uncached())
    local = tuple(slice(s.start - o, s.stop - o) for s, o in zip(slices, origin, strict=True))
    data = np.array(kept[local], copy=True)
    own = set(block_key(array, block))
    missing = tuple(key for key in report.missing_keys if key in own)
    counts = CacheCounts()
    if made:
        counts.misses = 1
    else:
        counts.hits, counts.bytes_hit = 1, data.nbytes
    return data, ReadReport(
        cache=counts,
        missing_keys=missing,
        missing_chunks=(block[0],) if missing else (),
        retries=report.retries if made else 0,
    )
