"""Reading: a planned window (or one stored block) becomes one dask graph.

This layer owns every task function and graph builder; it reads the
descriptions of :mod:`._sources` and the plan of :mod:`._plan`, and nothing
below it knows about tasks.  The task functions at the top run inside dask
tasks (threads or distributed workers), so they are plain module-level
functions of picklable arguments.  The graph builders below them only
arrange those tasks; they do no I/O.

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
the rows the window needs.  :func:`block_graph` reads one stored block (all
axes) for chunk streams, optionally followed by a transform task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zarr

from ..errors import (
    ChunkReadError,
    CorruptChunkError,
    MissingChunkError,
    ReadCancelledError,
    StoreGoneError,
)
from ..plan.batching import join_rows
from ..plan.windows import ChunkPiece, Selector
from ..store.policy import (
    DEFAULT_POLICY,
    NO_REPORT,
    CancelScope,
    Ledger,
    ReadPolicy,
    ReadReport,
    is_transient,
    native_view,
    policy_view,
    read_array,
    storage_keys,
)

__all__ = []

Key = Any  # a dask key: str or tuple starting with str


# --------------------------------------------------------------------------
# Task functions (run on the scheduler's workers)


def chunk_error(
    array: Any,
    name: str,
    what: str,
    piece: ChunkPiece | None,
    ledger: Ledger,
    exc: Exception,
    keys: list[str] | None = None,
) -> ChunkReadError:
    """The library error for a chunk whose read raised ``exc``.

    ``keys``: the chunk's store keys, if known (default: every key of its
    axis-0 chunk row).
    """
    if keys is None:
        keys = storage_keys(array, piece.start, piece.stop) if piece is not None else []
    where = what
    if piece is not None:
        shown = ", ".join(repr(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
        where += f" (samples {piece.start}:{piece.stop}" + (f", key {shown})" if keys else ")")
    where += f" of array {name}"
    failed = [key for key in ledger.failed if not keys or key in keys]
    if failed or is_transient(exc) or not isinstance(array, zarr.Array):
        retried = f" after {ledger.retries} retries" if ledger.retries else ""
        return ChunkReadError(f"could not read {where}{retried}: {type(exc).__name__}: {exc}")
    return CorruptChunkError(f"{where} does not decode: {type(exc).__name__}: {exc}")


def _views(
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
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
) -> tuple[np.ndarray | None, ReadReport]:
    """Decode one stored block, as an array the caller owns, and its report.

    With ``on_error="skip"`` a block that does not decode is ``None``, and
    the report lists it as skipped.
    """
    ledger = Ledger()
    piece = ChunkPiece(block[0], slices[0].start, slices[0].stop, slice(None), slice(None))
    fast, view = _views(array, name, policy, ledger, lambda: _stored_keys(array, block), scope)
    skipped: tuple[tuple[int, int, int], ...] = ()
    result: np.ndarray | None = None
    if fast is not view:
        with contextlib.suppress(Exception):  # read again below, through the policy
            result = _owned(np.asarray(read_array(fast, slices, scope)))
    try:
        if result is None:
            result = _owned(np.asarray(read_array(view, slices, scope)))
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:
        error = chunk_error(
            view, name, f"chunk {block}", piece, ledger, exc, _block_keys(view, block)
        )
        if not isinstance(error, CorruptChunkError) or policy.on_error != "skip":
            raise error from exc
        result, skipped = None, ((block[0], piece.start, piece.stop),)
    missing = tuple(dict.fromkeys(ledger.missing))
    return result, ReadReport(
        missing_keys=missing,
        missing_chunks=(block[0],) if missing else (),
        retries=ledger.retries,
        skipped=skipped,
    )


def _block_keys(array: Any, block: tuple[int, ...]) -> list[str] | None:
    """The store key of a block of an unsharded Zarr array (``None``: not known)."""
    if not isinstance(array, zarr.Array) or array.shards is not None:
        return None
    return _stored_keys(array, block)


def _stored_keys(array: Any, block: tuple[int, ...]) -> list[str]:
    """The store key holding a block of a Zarr array: its chunk's, or its shard's."""
    if not isinstance(array, zarr.Array):
        return []
    if array.shards is not None:
        block = tuple(b * c // s for b, c, s in zip(block, array.chunks, array.shards, strict=True))
    prefix = f"{array.path}/" if array.path else ""
    return [prefix + array.metadata.encode_chunk_key(block)]


def apply_transform(transform: Callable[[np.ndarray], Any], read: tuple[Any, ReadReport]) -> Any:
    """``transform`` applied to a block read by :func:`read_block` (not to a skipped one).

    How many run at once is the runner's choice (``Runner.cpu_bound`` wraps
    the transform before it reaches a graph).
    """
    block, report = read
    if block is None:
        return None, report
    return transform(block), report


#: One inner block of a shard read by :func:`read_shard`: its index, the block (or
#: ``transform(block)``; ``None`` if skipped), its report, and the transform's error.
ShardItem = tuple[tuple[int, ...], Any, ReadReport, BaseException | None]


def read_shard(
    array: Any,
    name: str,
    blocks: Sequence[tuple[int, ...]],
    slices: Sequence[tuple[slice, ...]],
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
    transform: Callable[[np.ndarray], Any] | None = None,
) -> list[ShardItem]:
    """Read the stored blocks of one shard with one read; one item per block, in order.

    One Zarr read of the shard's region fetches the whole shard with one
    request and decodes its inner chunks concurrently; each block is copied
    out as an array the caller owns (``transform`` applied to it here, its
    error returned beside the block so the stream names that block).  If the
    read fails, the blocks are read again one by one (:func:`read_block`), so
    errors name the block and ``on_error="skip"`` skips single blocks; a read
    whose retries were spent is not tried again.
    """
    ledger = Ledger()
    view, region = _whole_shard(
        policy_view(array, name, policy, ledger),
        tuple(
            slice(min(s[axis].start for s in slices), max(s[axis].stop for s in slices))
            for axis in range(len(slices[0]))
        ),
    )
    try:
        slab: np.ndarray | None = np.asarray(read_array(view, region, scope))
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:
        if ledger.failed:  # the shard's retries are spent: name its first block
            first = ChunkPiece(
                blocks[0][0], slices[0][0].start, slices[0][0].stop, slice(None), slice(None)
            )
            raise chunk_error(view, name, f"chunk {blocks[0]}", first, ledger, exc) from exc
        slab = None  # read again block by block, so that the error names the block
    items: list[ShardItem] = []
    missing = tuple(dict.fromkeys(ledger.missing))
    for number, (block, where) in enumerate(zip(blocks, slices, strict=True)):
        if slab is None:
            item, report = read_block(array, name, block, where, policy, scope)
        else:
            local = tuple(
                slice(s.start - r.start, s.stop - r.start)
                for s, r in zip(where, region, strict=True)
            )
            item = np.array(slab[local], copy=True)
            report = ReadReport(
                missing_keys=missing,
                missing_chunks=(block[0],) if missing else (),
                retries=ledger.retries if number == 0 else 0,  # counted once per shard
            )
        error: BaseException | None = None
        if item is not None and transform is not None:
            try:
                item, _ = apply_transform(transform, (item, report))
            except Exception as exc:
                item, error = None, exc
        items.append((block, item, report, error))
    return items


def read_block_result(block: Any) -> tuple[np.ndarray, ReadReport]:
    """Copy a dask array's block result into an array the caller owns.

    Always a copy: the result may be an object held by the graph itself (a
    literal or delayed array) or shared between blocks, even when it owns its
    data.  Dask arrays are read through their own graph: no policy applies.
    """
    return np.array(block, copy=True), NO_REPORT


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


def put_rows(out: np.ndarray, dest: Selector, rows: np.ndarray) -> None:
    """``out[dest] = rows``, scattering whole rows as single items where it can.

    numpy copies a row of a 2-d (or more) array item by item when it scatters
    by an index array; viewed as one opaque ``void`` item per row, the same
    scatter is faster (16 MiB of 256-byte rows: 5.9 ms instead of 7.2 ms of CPU,
    docs/benchmarks.md, *Cluster delivery*).
    """
    width = out[:1].nbytes
    if (
        isinstance(dest, np.ndarray)
        and out.ndim > 1
        and width
        and len(rows)
        and rows.dtype == out.dtype
        and not out.dtype.hasobject
        and out.flags.c_contiguous
        and rows.flags.c_contiguous
    ):
        row = np.dtype((np.void, width))
        items = out.reshape(len(out), -1).view(row)[:, 0]  # a view of out: one item per row
        items[dest] = rows.reshape(len(rows), -1).view(row)[:, 0]
        return
    out[dest] = rows


def _owned(array: np.ndarray) -> np.ndarray:
    if array.flags.owndata and array.flags.writeable:
        return array
    return array.copy()


# --------------------------------------------------------------------------
# Graph builders (run on the client, no I/O)


def _whole_shard(view: Any, region: tuple[slice, ...]) -> tuple[Any, tuple[slice, ...]]:
    """``view`` and ``region`` widened to the whole shard holding ``region``.

    Zarr fetches a shard with one request only when the selection covers the
    whole shard; a shard at the array's edge is cropped, and Zarr would read
    its index and then each inner chunk (a request each).  A shard is stored
    at its full shape whatever the array's, so the view gets a shape rounded
    up to whole shards (the metadata only; no I/O) and the region the whole
    shard; the rows past the array's end are dropped by the caller.
    """
    shards = view.shards if isinstance(view, zarr.Array) else None
    if shards is None:
        return view, region
    whole = tuple(slice(r.start, r.start + n) for r, n in zip(region, shards, strict=True))
    if all(w.stop <= size for w, size in zip(whole, view.shape, strict=True)):
        return view, whole
    from zarr.core.array import AsyncArray

    inner = view._async_array
    shape = tuple(-(-size // n) * n for size, n in zip(view.shape, shards, strict=True))
    metadata = dataclasses.replace(inner.metadata, shape=shape)
    return zarr.Array(AsyncArray(metadata, inner.store_path, config=inner.config)), whole
