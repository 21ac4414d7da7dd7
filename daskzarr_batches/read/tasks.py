"""Task functions: what a read task does with one block, one shard or a window's pieces.

The read layer owns every task function (this module and :mod:`.window`) and
graph builder (:mod:`.graphs`); it reads the descriptions of
:mod:`~daskzarr_batches.store.sources` and the plan, and nothing below it
knows about tasks.  Task functions run inside dask tasks (threads or
distributed workers), so they are plain module-level functions of picklable
arguments; a failed read is named by :mod:`.failures`.

A window graph holds, per array of the stream, the window's samples in
*ascending sample order*; the plan's order is applied later, while batches
are cut (``plan.batching``).

Zarr and numpy arrays (:class:`~daskzarr_batches.store.sources.SliceSource`) are one task per
array and window (:func:`read_window`): it reads runs of consecutive chunks
with one slice each and hands several runs at once to Zarr's asynchronous
pipeline, which decodes them concurrently::

    read_window (features: runs of chunks) ─┐
    read_window (labels: runs of chunks)   ─┴─> window (tuple of arrays)

Other dask arrays (:class:`~daskzarr_batches.store.sources.DaskSource`) are one task per axis-0
chunk, built on the array's own culled graph, and a join per array::

    assemble_rows (chunk c0) ─┐
    assemble_rows (chunk c1) ─┼─> join_pieces ─┐
    ...                      ─┘                ├─> window
    (same for labels) ─────────────────────────┘

Each stored chunk is decoded by exactly one task per window, which keeps only
the rows the window needs.  ``read.blocks.block_graph`` reads one stored block (all
axes) for chunk streams, optionally followed by a transform task; ``read.shard_tasks``
reads the inner blocks of one shard.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import (
    ChunkReadError,
    CorruptChunkError,
    MissingChunkError,
    MissingChunksWarning,
    ReadCancelledError,
    StoreGoneError,
)
from ..plan.batching import join_rows, row_count, take_rows
from ..plan.windows import ChunkPiece, Selector
from ..store.layout import block_key
from ..store.policy import (
    NO_REPORT,
    CancelScope,
    Ledger,
    ReadPolicy,
    ReadReport,
    is_program_error,
    native_view,
    policy_view,
    program_error,
    read_array,
)
from ..store.reader_hook import Planned, planned, raise_users_failure, reader_of
from ..store.readers import Access, reader_for, run_on_loop
from ..store.requests import block_requests
from ..store.rows import owned, put_rows
from .context import DEFAULT_CONTEXT, ReadContext
from .failures import raise_failed_read, read_named

__all__ = []

Key = Any  # a dask key: str or tuple starting with str


# --------------------------------------------------------------------------
# Task functions (run on the scheduler's workers)


def cache_tokens(policy: ReadPolicy, arrays: list[Any]) -> tuple[tuple[str, str], ...]:
    """The cache tokens of ``arrays`` now (``ReadPolicy.tokened``): a task of an epoch array.

    A dask array is computed any time after it is built, as often as asked,
    so its reads look its arrays' stored versions up when it is computed,
    once per compute, as a stream does when it is made (see
    :func:`fresh_tokens`).
    """
    return policy.tokened(arrays).cache_tokens


def fresh_tokens(tokens: tuple[tuple[str, str], ...], func: Callable[..., Any], *args: Any) -> Any:
    """``func(*args)``, each read context among ``args`` with the cache tokens ``tokens``."""
    fresh = [arg.with_cache_tokens(tokens) if isinstance(arg, ReadContext) else arg for arg in args]
    return func(*fresh)


def read_views(
    array: Any,
    name: str,
    policy: ReadPolicy,
    ledger: Ledger,
    keys: Callable[[], list[str]],
    scope: CancelScope | None,
) -> tuple[Any, Any]:
    """The array a read task tries first, and the one it reads again through.

    The second is always the policy view (:func:`~daskzarr_batches.store.policy.policy_view`);
    the first is the array itself when zarrs reads its store natively
    (:func:`~daskzarr_batches.store.policy.native_view`, missing chunks looked up first), else
    the policy view too.  The first read of a window or block uses the
    first; any failure is read again through the second, which retries,
    classifies and names it as for any other array.
    """
    view = policy_view(array, name, policy, ledger)
    native = native_view(array, name, policy, ledger, keys, scope)
    return (view if native is None else native), view


def read_block(
    array: Any,
    name: str,
    block: tuple[int, ...],
    slices: tuple[slice, ...],
    ctx: ReadContext = DEFAULT_CONTEXT,
) -> tuple[np.ndarray | None, ReadReport]:
    """Decode one stored block, as an array the caller owns, and its report.

    With ``on_error="skip"`` (``ctx.policy``) a block that does not decode is
    ``None``, and the report lists it as skipped.  The block's chunks are
    requests to the array's reader (``store.reader_hook``), into an output
    of ``ctx.allocate``: the library's runs the read below
    (:func:`_planned_block`, whose array it returns instead).
    """
    out = ctx.allocate(tuple(s.stop - s.start for s in slices), array.dtype)
    mine = None if isinstance(array, zarr.Array) else block
    requests = block_requests(array, slices, out, mine)
    ledger = Ledger()
    plan = Planned(
        requests, lambda: _planned_block(array, name, block, slices, ctx), array,
        lambda coro: run_on_loop(coro, ctx.scope), counts=ledger.cache,
    )  # fmt: skip
    reader = reader_of(array, ctx.policy)  # a factory's failure is raised, not read around
    try:
        with planned(plan):
            reader.read(requests)
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:
        if plan.ran or is_program_error(exc):
            raise
        raise_users_failure(plan, reader, name, exc)
        return _planned_block(array, name, block, slices, ctx)  # the library's: named
    if plan.ran:
        return plan.result
    return out, _block_report(ledger, block)


def _planned_block(
    array: Any,
    name: str,
    block: tuple[int, ...],
    slices: tuple[slice, ...],
    ctx: ReadContext = DEFAULT_CONTEXT,
) -> tuple[np.ndarray | None, ReadReport]:
    """:func:`read_block`'s own read: the array's engine, else through the policy view, named."""
    policy, scope = ctx.policy, ctx.scope
    piece = _block_piece(block, slices)
    reader = reader_for(array, policy)
    ledger = Ledger()
    keys = lambda: block_key(array, block)  # noqa: E731
    access = Access(array, name, policy, ledger, scope, keys, reader.native)
    result: np.ndarray | None = None
    try:  # the direct decode, or zarrs' native read (whose failure is read again, below)
        result = reader.read_block(access, slices)
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:  # a key whose retries are spent is not read again: named here
        if is_program_error(exc):
            error = program_error(exc, f"chunk {block} of array {name}")
            raise error from error.__cause__
        raise_failed_read(array, name, [(f"chunk {block}", piece)], ledger)
        ledger = Ledger()  # it did not decode: read again (named, or skipped)
        access = Access(array, name, policy, ledger, scope, keys)
    if result is not None:
        return result, _block_report(ledger, block)
    view = access.view
    skipped: tuple[tuple[int, int, int], ...] = ()
    unsharded = isinstance(view, zarr.Array) and view.shards is None
    block_keys = block_key(view, block) if unsharded else None  # else: its chunk row's
    try:
        result = read_named(
            lambda: owned(np.asarray(read_array(view, slices, scope))),
            view, name, f"chunk {block}", piece, ledger, block_keys,
        )  # fmt: skip
    except CorruptChunkError:
        if policy.on_error != "skip":
            raise
        result, skipped = None, ((block[0], piece.start, piece.stop),)
    return result, _block_report(ledger, block, skipped)


def _block_report(
    ledger: Ledger, block: tuple[int, ...], skipped: tuple[tuple[int, int, int], ...] = ()
) -> ReadReport:
    """What the policy saw while reading one block (its axis-0 chunk named if missing)."""
    missing = tuple(dict.fromkeys(ledger.missing))
    return ReadReport(
        cache=ledger.cache,
        missing_keys=missing,
        missing_chunks=(block[0],) if missing else (),
        retries=ledger.retries,
        skipped=skipped,
    )


def apply_transform(transform: Callable[[np.ndarray], Any], read: tuple[Any, ReadReport]) -> Any:
    """``transform`` applied to a block read by :func:`read_block` (not to a skipped one).

    How many run at once is the runner's choice (``Runner.cpu_bound`` wraps
    the transform before it reaches a graph).
    """
    block, report = read
    if block is None:
        return None, report
    return transform(block), report


def _block_piece(block: tuple[int, ...], where: tuple[slice, ...]) -> ChunkPiece:
    """Block ``block`` (at ``where`` in the array) as the piece errors name."""
    return ChunkPiece(block[0], where[0].start, where[0].stop, slice(None), slice(None))


def window_block(
    result: Sequence[tuple[np.ndarray, ReadReport]],
    output: int,
    order: np.ndarray | None,
    size: int,
    missing: str,
) -> np.ndarray:
    """One output of a window's result as a dask array's block (``stream.to_dask()``).

    ``result`` is what a window graph computes, one ``(rows, ReadReport)`` per
    output, each output's rows in ascending sample order, put in the window's
    delivery order here by ``order`` (``Window.gather_index()``, as the stream
    cuts its batches), or already in it (``order`` is ``None``: a
    ``plan_order`` graph or a sequential window).  ``size`` is the block's
    planned length, which a dask array knows before it is computed.  Missing
    chunks warn here (``missing="warn"``: a :class:`MissingChunksWarning` per
    block that met one) since no stream consumes the report; a block short of
    its planned rows (samples left out as undecodable) raises
    :class:`ChunkReadError`.
    """
    rows, report = result[output]
    if row_count(rows) != size or report.skipped:
        raise ChunkReadError(
            f"a window of the epoch array holds {row_count(rows)} of its {size} planned samples: "
            f"chunks {[chunk for chunk, _, _ in report.skipped]} were left out"
        )
    if report.missing_keys and missing == "warn":
        warnings.warn(
            MissingChunksWarning(
                f"{len(report.missing_keys)} stored object(s) were missing from the store and "
                f"read as the fill value (first: {report.missing_keys[0]!r}); pass "
                "missing='fill' if the array leaves empty chunks unwritten on purpose, or "
                "missing='error' to raise"
            ),
            stacklevel=2,
        )
    if order is None:
        return rows
    if not isinstance(rows, np.ndarray):  # sparse rows
        return take_rows(rows, order)
    # np.take needs aligned rows (a result received from a worker may not be)
    return np.take(np.require(rows, requirements=["A"]), order, axis=0)


def read_block_result(block: Any) -> tuple[np.ndarray, ReadReport]:
    """Copy a dask array's block result into an array the caller owns.

    Always a copy: the result may be an object held by the graph itself (a
    literal or delayed array) or shared between blocks, even when it owns its
    data.  Dask arrays are read through their own graph: no policy applies.
    """
    return np.array(block, copy=True), NO_REPORT


def read_block_part(block: Any, where: tuple[slice, ...]) -> tuple[np.ndarray, ReadReport]:
    """Part ``where`` of a dask array's block result, copied (a chunk subset's block)."""
    return read_block_result(np.asarray(block)[where])


def assemble_rows(
    name: str,
    chunk: int,
    start: int,
    stop: int,
    take: Selector,
    layout: tuple[int, ...],
    blocks: Sequence[np.ndarray],
) -> np.ndarray:
    """Join the blocks of one axis-0 chunk of a dask array and keep ``take``."""
    if len(blocks) == 1:
        slab = np.asarray(blocks[0])
    else:
        nested: Any = np.empty(layout, dtype=object)
        for index, block in zip(itertools.product(*map(range, layout)), blocks, strict=True):
            nested[index] = np.asarray(block)
        slab = np.block(nested.tolist()) if layout else np.asarray(blocks[0])
    if slab.shape[0] != stop - start:
        raise ChunkReadError(
            f"axis-0 chunk {chunk} of array {name} has {slab.shape[0]} rows, "
            f"expected {stop - start} (samples {start}:{stop})"
        )
    return slab[take]


def join_pieces(
    pieces: Sequence[np.ndarray], dests: Sequence[Selector] | None = None
) -> tuple[np.ndarray, ReadReport]:
    """Join a window's pieces of one array, in ascending sample order.

    With ``dests`` (the pieces' ``dest``), each piece's rows go to those
    positions instead: the window's plan order.
    """
    if dests is None:
        return join_rows(pieces), NO_REPORT
    first = pieces[0]
    out = np.empty((sum(len(piece) for piece in pieces), *first.shape[1:]), dtype=first.dtype)
    for rows, dest in zip(pieces, dests, strict=True):
        put_rows(out, dest, rows)
    return out, NO_REPORT


# --------------------------------------------------------------------------
# Collections: a window's rows read per member, joined


#: How :func:`join_members` places a member's rows in plan order: per piece of the
#: member, its chunk (the member's), its ``dest`` in the window and its row count.
Placement = tuple[int, Sequence[Sequence[tuple[int, Selector, int]]]]


def join_members(
    parts: Sequence[tuple[np.ndarray, ReadReport]],
    maps: Sequence[tuple[Sequence[int], int]],
    placement: Placement | None = None,
    local: dict[int, tuple[int, int, int]] | None = None,
    within: tuple[np.ndarray, Sequence[int]] | None = None,
) -> tuple[np.ndarray, ReadReport]:
    """Join the reads of a collection's members touched by one window.

    ``parts`` are the members' reads, in ascending member order, each in
    ascending sample order (less its skipped chunks); ``maps`` gives, per
    part, its member's chunk -> global chunk and where the member starts, so
    the report names the collection's chunks and samples.  Without
    ``placement`` the rows are concatenated (ascending sample order of the
    collection); with it (``(size, pieces per part)``: a cluster) each
    piece's rows go to its ``dest``, the window's plan order, and the rows of
    skipped chunks are then left out.  ``local`` maps the collection's
    chunks to a chunk subset's (``SubsetSource.local_chunks``).

    ``within`` (``(out, starts)``: read in this process): the window's
    output, made by :func:`window_output`, and where each part's rows begin
    in it.  A part read straight into its rows there (a member of Zarr or
    numpy arrays) is not copied; any other is copied in; if a part left
    chunks out (``on_error="skip"``) the parts are concatenated as without it.
    """
    report = _merged(
        [
            _global(rep, to_global, shift)
            for (_, rep), (to_global, shift) in zip(parts, maps, strict=True)
        ]
    )
    rows = [part for part, _ in parts]
    if within is not None and not report.skipped:
        out, starts = within
        for part, start in zip(rows, starts, strict=True):
            target = out[start : start + len(part)]
            if not np.may_share_memory(part, target):  # not read into place
                target[...] = part
    elif placement is None:
        out = join_rows(rows)
    elif not isinstance(rows[0], np.ndarray):  # sparse rows: stacked, then in plan order
        positions = [
            np.arange(placement[0])[dest] for pieces in placement[1] for _, dest, _ in pieces
        ]
        out = take_rows(join_rows(rows), np.argsort(np.concatenate(positions), kind="stable"))
    else:
        size, per_part = placement
        first = rows[0]
        out = np.empty((size, *first.shape[1:]), dtype=first.dtype)
        dropped = []
        for part, pieces, (_, rep) in zip(rows, per_part, parts, strict=True):
            gone = {chunk for chunk, _, _ in rep.skipped}
            at = 0
            for chunk, dest, count in pieces:
                if chunk in gone:
                    dropped.append(np.arange(size)[dest])
                    continue
                put_rows(out, dest, part[at : at + count])
                at += count
        if dropped:
            out = np.delete(out, np.concatenate(dropped), axis=0)
    if local is not None and (report.missing_chunks or report.skipped):
        report = dataclasses.replace(
            report,
            missing_chunks=tuple(local[chunk][0] for chunk in report.missing_chunks),
            skipped=tuple(local[chunk] for chunk, _, _ in report.skipped),
        )
    return out, report


def window_output(
    size: int, trailing: tuple[int, ...], dtype: Any, own_map: bool, pool: Any = None
) -> np.ndarray:
    """A collection window's output, which its member reads fill in place (local reads).

    ``own_map`` (an exact-shuffle window): in an anonymous ``mmap`` of its
    own, as :func:`~daskzarr_batches.read.window.read_window` makes one;
    else from ``pool`` (a ``BufferPool``: the stream gives it back once its
    batches are cut) when one is given and the values are plain.
    """
    shape, dtype = (size, *trailing), np.dtype(dtype)
    if own_map:
        return mapped(shape, dtype)
    if pool is not None and not dtype.hasobject and dtype.kind in "biufcmMSUV":
        return pool.take(shape, dtype)
    return np.empty(shape, dtype)


def mapped(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` in memory of its own (an anonymous ``mmap``).

    Its pages return to the system when the array is freed: the C heap
    neither keeps them nor raises its threshold for mapping large blocks
    (which would leave later chunk-sized blocks in per-thread arenas).
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < 2**20 or dtype.hasobject:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


def _global(report: ReadReport, to_global: Sequence[int], shift: int) -> ReadReport:
    """A member's report in the collection's chunks and samples."""
    if not (report.missing_chunks or report.skipped):
        return report
    return dataclasses.replace(
        report,
        missing_chunks=tuple(int(to_global[chunk]) for chunk in report.missing_chunks),
        skipped=tuple(
            (int(to_global[chunk]), lo + shift, hi + shift) for chunk, lo, hi in report.skipped
        ),
    )


def _merged(reports: Sequence[ReadReport]) -> ReadReport:
    if len(reports) == 1:
        return reports[0]
    if all(report is NO_REPORT or report == NO_REPORT for report in reports):
        return NO_REPORT
    return ReadReport(
        missing_keys=tuple(key for report in reports for key in report.missing_keys),
        missing_chunks=tuple(chunk for report in reports for chunk in report.missing_chunks),
        retries=sum(report.retries for report in reports),
        skipped=tuple(item for report in reports for item in report.skipped),
    )


#: Nothing decoded: the provenance output counts no chunk and no byte read.
NOTHING_DECODED = ReadReport(decoded=())


def read_sources(
    offsets: np.ndarray, pieces: Sequence[ChunkPiece], size: int, plan_order: bool
) -> tuple[np.ndarray, ReadReport]:
    """``(member, position within it)`` of a window's samples, from their ids: no I/O.

    ``pieces`` are in the collection's coordinates (a chunk subset's mapped
    to them); ``offsets`` where each member starts.  Rows in ascending
    sample order, or with ``plan_order`` at the pieces' ``dest``.
    """
    ids = np.empty(size, dtype=np.int64)
    at = 0
    for piece in pieces:
        taken = piece.start + np.arange(piece.rows, dtype=np.int64)[piece.take]
        if plan_order:
            ids[piece.dest] = taken
        else:
            ids[at : at + len(taken)] = taken
        at += len(taken)
    member = np.searchsorted(offsets, ids, side="right") - 1
    out = np.empty((size, 2), dtype=np.int64)
    out[:, 0] = member
    out[:, 1] = ids - offsets[member]
    return out, NOTHING_DECODED
