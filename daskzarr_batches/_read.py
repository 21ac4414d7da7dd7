"""Reading: a planned window (or one stored block) becomes one dask graph.

This layer owns every task function and graph builder; it reads the
descriptions of :mod:`._sources` and the plan of :mod:`._plan`, and nothing
below it knows about tasks.  The task functions at the top run inside dask
tasks (threads or distributed workers), so they are plain module-level
functions of picklable arguments.  The graph builders below them only
arrange those tasks; they do no I/O.

A window graph holds, per array of the stream, the window's samples in
*ascending sample order*; the plan's order is applied later, while batches
are cut (``_batching``).

Zarr and numpy arrays (:class:`~._sources.SliceSource`) are one task per
array and window (:func:`read_window`): it reads runs of consecutive chunks
with one slice each and hands several runs at once to Zarr's asynchronous
pipeline, which decodes them concurrently::

    read_window (features: runs of chunks) ─┐
    read_window (labels: runs of chunks)   ─┴─> window (tuple of arrays)

Other dask arrays (:class:`~._sources.DaskSource`) are one task per axis-0
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

import asyncio
import contextlib
import dataclasses
import itertools
import mmap
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import zarr
from dask.optimization import cull

from ._batching import join_rows
from ._errors import (
    ChunkReadError,
    CorruptChunkError,
    MissingChunkError,
    ReadCancelledError,
    StoreGoneError,
)
from ._plan import ChunkPiece, Selector, Window
from ._policy import (
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
from ._shards import read_sharded, sharding_codec
from ._sources import DaskSource, SliceSource, Source

__all__ = [
    "DECODE_GROUP_BYTES",
    "block_graph",
    "blocks_by_shard",
    "count_tasks",
    "read_threads",
    "read_window",
    "release_free_memory",
    "shard_graph",
    "window_graph",
]

Key = Any  # a dask key: str or tuple starting with str

#: Decoded bytes of stored chunks one window read holds at once (at least one
#: chunk); bounds the transient memory of an exact-shuffle window.
DECODE_GROUP_BYTES = 64 * 2**20


# --------------------------------------------------------------------------
# Task functions (run on the scheduler's workers)


def read_rows(
    array: Any, name: str, piece: ChunkPiece, ledger: Ledger, scope: CancelScope | None = None
) -> np.ndarray:
    """Decode the axis-0 chunk of ``piece`` and keep its rows ``take``.

    A failure becomes an error naming the array, the chunk, its key(s) and
    samples: :class:`MissingChunkError` as raised by the policy store,
    :class:`ChunkReadError` when the store failed (after its retries),
    :class:`CorruptChunkError` when the bytes arrived and did not decode.
    """
    try:
        slab = np.asarray(read_array(array, (slice(piece.start, piece.stop),), scope))
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:
        raise chunk_error(array, name, f"axis-0 chunk {piece.chunk}", piece, ledger, exc) from exc
    return slab[piece.take]


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


def read_window(
    array: Any,
    name: str,
    size: int,
    row_bytes: int,
    pieces: Sequence[ChunkPiece],
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
    plan_order: bool = False,
    decode_bytes: int | None = None,
) -> tuple[np.ndarray, ReadReport]:
    """Read the rows of one window from a Zarr or numpy array, by sample id.

    Returns the rows, in ascending sample order (see :func:`window_graph`),
    or with ``plan_order`` in the window's plan order (each chunk's rows
    written to the pieces' ``dest``), and a :class:`ReadReport` of what the
    read policy saw: missing chunks, retries, chunks skipped because they do
    not decode (their rows are left out, in either order).

    A window that is one run of consecutive chunks in order (sequential) is
    read with one slice and returned as read.  Otherwise Zarr arrays read
    their chunks concurrently on Zarr's event loop, each chunk's rows
    ``take`` copied into place as soon as it is decoded, while the chunks in
    flight hold at most ``DECODE_GROUP_BYTES`` of decoded rows (at least one
    chunk).  When the window keeps only some rows of its chunks (exact
    shuffle), that limit is also at most ``max(window / 16, one chunk per
    CPU)``, so decoding adds little to the window's memory.  Each chunk is
    its own read on the event loop, so a failure cancels every other read of
    the window before the window is read again run by run (numpy arrays are
    read that way in the first place), chunk by chunk, so that the error
    names the chunk that fails (or, with ``on_error="skip"``, the chunks that
    do not decode are left out).

    ``decode_bytes`` (the exact shuffle's share of its ``memory_budget``)
    bounds the decoded rows in flight instead (at least one chunk; two once
    it reaches half a chunk, so that one is read while one decodes), and each
    chunk's rows are then always placed as it arrives, so that the chunks of
    a window are not all held beside its output.
    """
    ledger = Ledger()

    def keys() -> list[str]:  # the store keys of the window's chunk rows
        return [key for piece in pieces for key in storage_keys(array, piece.start, piece.stop)]

    fast, array = _views(array, name, policy, ledger, keys, scope)
    largest = max(piece.rows for piece in pieces)
    limit_rows = DECODE_GROUP_BYTES // max(row_bytes, 1)
    partial = not all(_keeps_all(piece) for piece in pieces)
    if partial:
        limit_rows = min(limit_rows, max(size // 16, largest * (os.cpu_count() or 1)))
    streaming = partial
    if decode_bytes is not None:
        limit_rows, streaming = decode_bytes // max(row_bytes, 1), True
        if 2 * limit_rows >= largest:  # half a chunk or more: one decoding, the next read
            limit_rows = max(limit_rows, 2 * largest)
    limit_rows = max(limit_rows, largest)
    runs = _runs(pieces, limit_rows)
    # zarrs reads shards natively; Zarr's own pipeline reads them through _shards
    sharded = fast is array and sharding_codec(array) is not None
    whole_run = len(runs) == 1 and _is_whole(runs[0], size)
    if whole_run and not sharded and (not plan_order or _in_plan_order(runs[0])):
        with contextlib.suppress(Exception):  # read again below, chunk by chunk
            whole = (slice(runs[0][0].start, runs[0][-1].stop),)
            rows = _owned(np.asarray(read_array(fast, whole, scope)))
            return rows, _report(array, pieces, ledger, ())
    shape, dtype = (size, *array.shape[1:]), np.dtype(array.dtype)
    out = np.empty(shape, dtype) if decode_bytes is None else _mapped(shape, dtype)

    def place(run: Sequence[ChunkPiece], slab: np.ndarray, at: int, kept: bool = False) -> None:
        if kept:  # the rows ``take`` of a one-chunk run, read as such
            if plan_order:
                put_rows(out, run[0].dest, slab)
            else:
                out[at : at + len(slab)] = slab
            return
        lo = run[0].start
        for piece in run:
            local = piece.start - lo
            rows = slab[local : local + piece.rows][piece.take]
            if plan_order:
                put_rows(out, piece.dest, rows)
            else:
                out[at : at + len(rows)] = rows
            at += len(rows)

    if sharded:
        ordered = [piece for run in runs for piece in run]
        shard_rows = max(array.shards[0], 1)
        try:
            coro = read_sharded(
                array, ordered, _starts([[p] for p in ordered]), out, _keeps_all,
                shards_in_flight=max(2, limit_rows // shard_rows),
                scatter=(lambda p, rows: put_rows(out, p.dest, rows)) if plan_order else None,
            )  # fmt: skip
            _run(coro, scope)
            return out, _report(array, pieces, ledger, ())
        except ReadCancelledError:
            raise
        except Exception:  # the other reads were cancelled; read again run by run,
            pass  # so that the error names the chunk that fails
    inner = getattr(fast, "_async_array", None)
    if inner is not None and not sharded and (len(runs) > 1 or fast is not array):
        chunks = [[piece] for run in runs for piece in run]
        try:
            _read_runs_concurrently(
                inner, chunks, _starts(chunks), place, limit_rows, streaming, scope=scope,
                kept_rows=fast is array,  # zarrs reads an orthogonal selection through Zarr
            )  # fmt: skip
            return out, _report(array, pieces, ledger, ())
        except Exception:  # the other reads were cancelled; read again run by run,
            pass  # so that the error names the chunk that fails
    _raise_failed_read(array, name, pieces, ledger)  # retries spent: do not read it again
    skipped: list[tuple[ChunkPiece, int, CorruptChunkError]] = []
    for run, at in zip(runs, _starts(runs), strict=True):
        try:
            span = (slice(run[0].start, run[-1].stop),)
            place(run, _owned(np.asarray(read_array(array, span, scope))), at)
            continue
        except Exception:
            pass  # chunk by chunk, so that the error names the chunk that fails
        for piece, where in zip(run, _starts([[p] for p in run]), strict=True):
            try:
                rows = read_rows(array, name, piece, ledger, scope)
            except CorruptChunkError as exc:
                if policy.on_error != "skip":
                    raise
                skipped.append((piece, at + where, exc))
                continue
            if plan_order:
                put_rows(out, piece.dest, rows)
            else:
                out[at + where : at + where + len(rows)] = rows
    if skipped:
        drop = np.concatenate(
            [
                np.arange(size)[p.dest] if plan_order else np.arange(w, w + _taken(p))
                for p, w, _ in skipped
            ]
        )
        out = np.delete(out, drop, axis=0)
    return out, _report(array, pieces, ledger, [p for p, _, _ in skipped])


def release_free_memory() -> None:
    """Return the C heap's free memory to the system (glibc ``malloc_trim``).

    Zarr decodes chunks on several threads; glibc gives each its own arena
    and keeps freed blocks there, so after a window's chunks are freed the
    process may hold several chunks' worth per thread.  A no-op elsewhere.
    """
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _malloc_trim() -> Any:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def _mapped(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` in memory of its own (an anonymous ``mmap``).

    Its pages return to the system when the array is freed: the C heap
    neither keeps them nor raises its threshold for mapping large blocks
    (which would leave later chunk-sized blocks in per-thread arenas).
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < 2**20 or dtype.hasobject:
        return np.empty(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).reshape(shape)


def _views(
    array: Any,
    name: str,
    policy: ReadPolicy,
    ledger: Ledger,
    keys: Callable[[], list[str]],
    scope: CancelScope | None,
) -> tuple[Any, Any]:
    """The array a read task tries first, and the one it reads again through.

    The second is always the policy view (:func:`~._policy.policy_view`);
    the first is the array itself when zarrs reads its store natively
    (:func:`~._policy.native_view`, missing chunks looked up first), else
    the policy view too.  The first read of a window or block uses the
    first; any failure is read again through the second, which retries,
    classifies and names it as for any other array.
    """
    view = policy_view(array, name, policy, ledger)
    native = native_view(array, name, policy, ledger, keys, scope)
    return (view if native is None else native), view


def _raise_failed_read(array: Any, name: str, pieces: Sequence[ChunkPiece], ledger: Ledger) -> None:
    """Raise the error of a key whose read failed for good, naming its chunk.

    First :class:`StoreGoneError` if the array turned out to be gone: its
    chunks are not read again one by one.
    """
    ledger.check_gone()
    for key, exc in ledger.failed.items():
        for piece in pieces:
            if key in storage_keys(array, piece.start, piece.stop):
                what = f"axis-0 chunk {piece.chunk}"
                raise chunk_error(array, name, what, piece, ledger, exc) from exc
        raise ChunkReadError(
            f"could not read {key!r} of array {name} after {ledger.retries} retries: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _report(
    array: Any, pieces: Sequence[ChunkPiece], ledger: Ledger, skipped: Sequence[ChunkPiece]
) -> ReadReport:
    """What the policy saw while reading ``pieces`` (cheap when nothing happened)."""
    missing_keys = tuple(dict.fromkeys(ledger.missing))
    missing_chunks: tuple[int, ...] = ()
    if missing_keys:
        absent = set(missing_keys)
        missing_chunks = tuple(
            piece.chunk
            for piece in pieces
            if absent.intersection(storage_keys(array, piece.start, piece.stop))
        )
    return ReadReport(
        missing_keys=missing_keys,
        missing_chunks=missing_chunks,
        retries=ledger.retries,
        skipped=tuple((p.chunk, p.start, p.stop) for p in skipped),
    )


def _starts(runs: Sequence[Sequence[ChunkPiece]]) -> list[int]:
    """Where each run's rows start in the window's output."""
    return np.cumsum([0] + [sum(_taken(p) for p in run) for run in runs[:-1]]).tolist()


def _taken(piece: ChunkPiece) -> int:
    take = piece.take
    return len(range(piece.rows)[take]) if isinstance(take, slice) else len(take)


def _read_runs_concurrently(
    inner: Any,
    runs: Sequence[Sequence[ChunkPiece]],
    starts: Sequence[int],
    place: Any,
    limit_rows: int,
    streaming: bool,
    scope: CancelScope | None = None,
    kept_rows: bool = False,
) -> None:
    """Read runs on Zarr's event loop, at most ``limit_rows`` rows in flight.

    When one run fails, the others are cancelled (a task group) before the
    error propagates.  Zarr does not cancel the other chunks of a failed
    multi-chunk slice, so callers pass runs of one chunk each: then no read
    of the window is left running.
    ``streaming``: place each run's rows as it arrives (on the event loop) to
    free its decoded chunks at once; else place them all afterwards on this
    thread, which measured faster when every row is kept (a full copy per run
    would otherwise hold up the loop).  When streaming, with ``kept_rows``
    a one-chunk run that keeps some rows asks Zarr for
    those rows only (``take``, an orthogonal selection), so Zarr allocates no
    copy of the whole chunk (not with zarrs, which would hand such a
    selection back to Zarr's own pipeline).
    """

    arrived: list[tuple[Sequence[ChunkPiece], np.ndarray, int]] = []

    async def read_all() -> None:
        ready = asyncio.Condition()
        in_flight = 0

        async def one(run: Sequence[ChunkPiece], at: int) -> None:
            nonlocal in_flight
            rows = run[-1].stop - run[0].start
            async with ready:
                await ready.wait_for(lambda: in_flight == 0 or in_flight + rows <= limit_rows)
                in_flight += rows
            try:
                if kept_rows and streaming and len(run) == 1 and not isinstance(run[0].take, slice):
                    kept = (run[0].start + run[0].take,)
                    place(run, np.asarray(await inner.get_orthogonal_selection(kept)), at, True)
                    return
                slab = await inner.getitem((slice(run[0].start, run[-1].stop),))
                if streaming:
                    place(run, np.asarray(slab), at)
                    del slab
                else:
                    arrived.append((run, np.asarray(slab), at))
            finally:
                async with ready:
                    in_flight -= rows
                    ready.notify_all()

        async with asyncio.TaskGroup() as group:  # a failure cancels the siblings
            for run, at in zip(runs, starts, strict=True):
                group.create_task(one(run, at))

    _run(read_all(), scope)
    for run, slab, at in arrived:
        place(run, slab, at)


def _run(coro: Any, scope: CancelScope | None) -> Any:
    """Run ``coro`` on Zarr's event loop: through ``scope`` (cancellable) if given."""
    from zarr.core.sync import sync

    return sync(coro) if scope is None else scope.run(coro)


def _runs(pieces: Sequence[ChunkPiece], max_rows: int) -> list[list[ChunkPiece]]:
    """Pieces grouped into runs of consecutive chunks of at most ``max_rows``."""
    ordered = sorted(pieces, key=lambda piece: piece.chunk)
    runs: list[list[ChunkPiece]] = []
    rows = 0
    for piece in ordered:
        if runs and runs[-1][-1].chunk + 1 == piece.chunk and rows + piece.rows <= max_rows:
            runs[-1].append(piece)
            rows += piece.rows
        else:
            runs.append([piece])
            rows = piece.rows
    return runs


def _is_whole(run: Sequence[ChunkPiece], size: int) -> bool:
    """Whether ``run`` is the whole window: every row of its chunks.

    The output is in ascending sample order whatever the plan order (``dest``,
    applied when batches are cut), so such a window is the slice as read: a
    buffered window of one chunk (the fast-start ramp's first) too.
    """
    if run[-1].stop - run[0].start != size:
        return False
    return all(_keeps_all(piece) for piece in run)


def _in_plan_order(run: Sequence[ChunkPiece]) -> bool:
    """Whether a whole run, as read, is also in the window's plan order (sequential)."""
    lo = run[0].start
    return all(
        isinstance(p.dest, slice) and p.dest == slice(p.start - lo, p.stop - lo) for p in run
    )


def _keeps_all(piece: ChunkPiece) -> bool:
    """Whether the window keeps every row of the chunk, in chunk order."""
    return isinstance(piece.take, slice) and piece.take == slice(0, piece.rows)


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


def apply_transform(
    transform: Callable[[np.ndarray], Any],
    read: tuple[Any, ReadReport],
    scope: CancelScope | None = None,
) -> Any:
    """``transform`` applied to a block read by :func:`read_block` (not to a skipped one).

    Locally, at most one transform per CPU runs at once (``scope.cpu``),
    however many reads the stream keeps in flight.
    """
    block, report = read
    if block is None:
        return None, report
    with contextlib.nullcontext() if scope is None else scope.cpu:
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
                item, _ = apply_transform(transform, (item, report), scope)
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


def window_graph(
    sources: Sequence[Source],
    window: Window,
    token: str,
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
    plan_order: bool = False,
    decode_bytes: int | None = None,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph of one window; its result is one ``(rows, ReadReport)`` per source.

    Each array holds the window's samples in *ascending sample order* (chunk
    by chunk, ``take`` ascending), the same order for every source, so each
    array is filled with contiguous copies.  The window's own order is applied
    while batches are cut (``window.gather_index()``), in the copy that makes
    each batch an owned array anyway: permuting here as well would cost a
    scattered write of the whole window.

    ``plan_order=True`` (results that travel to another process: a cluster)
    writes each chunk's rows straight to their place in the window's plan
    order instead (the pieces' ``dest``): the scattered write replaces the
    contiguous one on the worker, and the consumer cuts batches by slicing.

    ``decode_bytes``: see :func:`read_window` (shared by the window's arrays, in
    proportion to their row sizes).
    """
    dsk: dict[Key, Any] = {}
    outputs = []
    for position, (source, pieces) in enumerate(zip(sources, window.pieces, strict=True)):
        out_key = (f"dzb-array-{token}", window.index, position)
        outputs.append(out_key)
        if isinstance(source, SliceSource):
            array_key = _place_array(dsk, source)
            dsk[out_key] = (
                read_window, array_key, source.name, window.size, source.row_bytes,
                tuple(pieces), policy, scope, plan_order,
                _share(decode_bytes, source, sources),
            )  # fmt: skip
            continue
        assert isinstance(source, DaskSource)
        piece_keys = []
        for piece in pieces:
            key = (f"dzb-read-{token}", window.index, position, piece.chunk)
            _add_dask_rows(dsk, source, key, piece)
            piece_keys.append(key)
        dests = [piece.dest for piece in pieces] if plan_order else None
        dsk[out_key] = (join_pieces, piece_keys, dests)
    window_key = (f"dzb-window-{token}", window.index)
    dsk[window_key] = (tuple, outputs)
    return dsk, window_key


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
    """
    if all(isinstance(source, SliceSource) for source in sources):
        return 4 * len(sources)
    return None


def block_graph(
    source: Source,
    block: tuple[int, ...],
    token: str,
    transform: Callable[[np.ndarray], Any] | None = None,
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph reading one stored block (all axes) of ``source``.

    With ``transform``, a second task applies it to the block; the scheduler
    runs it where the block was read, so only its result moves.
    """
    dsk: dict[Key, Any] = {}
    key = (f"dzb-block-{token}", *block)
    if isinstance(source, SliceSource):
        array_key = _place_array(dsk, source)
        dsk[key] = (
            read_block, array_key, source.name, block, source.block_slices(block), policy, scope
        )  # fmt: skip
    else:
        assert isinstance(source, DaskSource)
        block_key = (source.array.name, *block)
        dsk.update(cull(source.graph, [block_key])[0])
        dsk[key] = (read_block_result, block_key)
    if transform is None:
        return dsk, key
    mapped = (f"dzb-map-{token}", *block)
    dsk[mapped] = (apply_transform, transform, key, scope)
    return dsk, mapped


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


def blocks_by_shard(source: Source) -> list[tuple[tuple[int, ...], ...]] | None:
    """``source``'s stored blocks grouped by shard (``None``: not a sharded Zarr array).

    Shards in C order, each with its non-empty inner blocks in C order; a
    shard's first block comes before the next shard's in the C order of the
    blocks.
    """
    if not isinstance(source, SliceSource) or not isinstance(source.array, zarr.Array):
        return None
    shards = source.array.shards
    if shards is None:
        return None
    per_shard = [
        max(shard // chunk, 1) for shard, chunk in zip(shards, source.array.chunks, strict=True)
    ]
    units: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for block in source.blocks():
        shard = tuple(i // n for i, n in zip(block, per_shard, strict=True))
        units.setdefault(shard, []).append(block)
    return [tuple(blocks) for blocks in units.values()]


def shard_graph(
    source: SliceSource,
    blocks: Sequence[tuple[int, ...]],
    token: str,
    transform: Callable[[np.ndarray], Any] | None = None,
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
) -> tuple[dict[Key, Any], Key]:
    """The dask graph reading the inner ``blocks`` of one shard with one task.

    Its result is a list of :data:`ShardItem`, one per block, in order.
    """
    dsk: dict[Key, Any] = {}
    array_key = _place_array(dsk, source)
    key = (f"dzb-shard-{token}", *blocks[0])
    slices = tuple(source.block_slices(block) for block in blocks)
    dsk[key] = (
        read_shard, array_key, source.name, tuple(blocks), slices, policy, scope, transform
    )  # fmt: skip
    return dsk, key


def _place_array(dsk: dict[Key, Any], source: SliceSource) -> Any:
    """The array object as a read task's argument: inline, not a key of its own."""
    return source.array


def _add_dask_rows(dsk: dict[Key, Any], source: DaskSource, key: Key, piece: ChunkPiece) -> None:
    """Add task ``key``: rows ``piece.take`` of an axis-0 chunk of a dask array."""
    grid = [range(len(sizes)) for sizes in source.chunks[1:]]
    keys = [(source.array.name, piece.chunk, *rest) for rest in itertools.product(*grid)]
    dsk.update(cull(source.graph, keys)[0])
    layout = tuple(len(sizes) for sizes in source.chunks[1:])
    dsk[key] = (
        assemble_rows, source.name, piece.chunk, piece.start, piece.stop, piece.take, layout, keys
    )  # fmt: skip
