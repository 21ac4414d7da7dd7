"""Reading one window of one array: its chunk pieces decoded concurrently into the window's rows.

The task behind every batch stream's window of a Zarr or numpy array
(:func:`read_window`), with the exact shuffle's memory care (an output in its
own mmap, the C heap trimmed after each window) and the fallback that names a
chunk that failed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

from ..errors import CorruptChunkError, MissingChunkError, ReadCancelledError, StoreGoneError
from ..plan.budget import DECODE_GROUP_BYTES
from ..plan.windows import ChunkPiece
from ..store.direct import DirectLayout, concurrency_limit, direct_reader
from ..store.layout import object_shape, storage_keys
from ..store.pipelines import codec_pipeline_of
from ..store.policy import (
    DEFAULT_POLICY,
    CancelScope,
    Ledger,
    ReadPolicy,
    ReadReport,
    is_program_error,
    native_view,
    policy_view,
    program_error,
    read_array,
    read_into,
)
from ..store.shards import read_sharded, sharding_codec
from ..store.zarr_adapter import async_array, nd_buffer
from .context import DEFAULT_CONTEXT, ReadContext
from .failures import raise_failed_read, read_named
from .tasks import (
    _owned,
    join_members,
    mapped,
    put_rows,
    run_on_loop,
    window_output,
)

__all__ = [
    "MemberRead",
    "MemberWindow",
    "read_member_window",
    "read_members",
    "read_rows",
    "read_subset_window",
    "read_window",
    "release_free_memory",
]


def read_rows(
    array: Any, name: str, piece: ChunkPiece, ledger: Ledger, scope: CancelScope | None = None
) -> np.ndarray:
    """Decode the axis-0 chunk of ``piece`` and keep its rows ``take``.

    A failure becomes an error naming the array, the chunk, its key(s) and
    samples: :class:`MissingChunkError` as raised by the policy store,
    :class:`ChunkReadError` when the store failed (after its retries),
    :class:`CorruptChunkError` when the bytes arrived and did not decode.
    """
    span = (slice(piece.start, piece.stop),)
    slab = read_named(
        lambda: np.asarray(read_array(array, span, scope)),
        array, name, f"axis-0 chunk {piece.chunk}", piece, ledger,
    )  # fmt: skip
    return slab[piece.take]


def read_window(
    array: Any,
    name: str,
    size: int,
    row_bytes: int,
    pieces: Sequence[ChunkPiece],
    ctx: ReadContext = DEFAULT_CONTEXT,
    into: np.ndarray | None = None,
) -> tuple[np.ndarray, ReadReport]:
    """Read the rows of one window from a Zarr or numpy array, by sample id.

    ``ctx``: the stream's :class:`~daskzarr_batches.read.context.ReadContext`
    (its policy, scope, plan order, decode limit and pool, as below).
    Returns the rows, in ascending sample order (see :func:`window_graph`),
    or with ``plan_order`` in the window's plan order (each chunk's rows
    written to the pieces' ``dest``), and a :class:`ReadReport` of what the
    read policy saw: missing chunks, retries, chunks skipped because they do
    not decode (their rows are left out, in either order).

    A window of a plain zstd array (``store.direct``) whose pieces each keep
    one run of their chunk's rows has each chunk decompressed straight into
    its rows (a chunk kept in part through a scratch chunk), chunks concurrently,
    through the policy view (with zarrs too, but for a sequential window,
    which zarrs reads in one call).  Otherwise a window that is one run of
    consecutive chunks in order (sequential) is read with one slice.  A
    sharded array read by Zarr's own pipeline goes through the shard reader
    (``store.shards``).  Otherwise
    Zarr arrays read their chunks concurrently on Zarr's event loop, each
    chunk's rows ``take`` copied into place as soon as it is decoded, while
    the chunks in flight hold at most ``DECODE_GROUP_BYTES`` of decoded rows
    (at least one chunk).  When the window keeps only some rows of its chunks
    (exact shuffle), that limit is also at most ``max(window / 16, one chunk
    per CPU)``, so decoding adds little to the window's memory.  Each chunk is
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

    ``into``: ``size`` rows of an output made by the caller (a collection's
    member writes its rows straight into its part of the window's shared
    output, ascending order only); the rows returned are then ``into``, or,
    when chunks were skipped, a shorter array of their own.

    ``pool``: where a Zarr array's window output is taken from (the
    consumer gives it back once its batches are cut, so the next window
    writes into pages already faulted in); not with ``decode_bytes``.
    """
    policy, scope, plan_order = ctx.policy, ctx.scope, ctx.plan_order
    decode_bytes, pool = ctx.decode_bytes, ctx.pool
    ledger = Ledger()

    def keys() -> list[str]:  # the store keys of the window's chunk rows
        return [key for piece in pieces for key in storage_keys(array, piece.start, piece.stop)]

    view = policy_view(array, name, policy, ledger)
    # zarrs reads the store natively (read_views), unless the direct decode reads the window
    native = policy.cache is None and codec_pipeline_of(array) == "zarrs"
    limit_rows, streaming = _decode_limit(pieces, size, row_bytes, decode_bytes)
    runs = _runs(pieces, limit_rows)
    # zarrs reads shards natively; Zarr's own pipeline reads them through store.shards
    sharded = not native and sharding_codec(view) is not None
    shape, dtype = (size, *view.shape[1:]), np.dtype(view.dtype)
    out = None
    if into is not None:
        assert not plan_order and into.shape == shape, (into.shape, shape)
        out = into
    elif pool is not None and decode_bytes is None and _poolable(view, dtype):
        out = pool.take(shape, dtype)
    # a plain zstd array: whole chunks decoded straight into the rows (a chunk kept in part,
    # one run of its rows, through a scratch chunk), except a slice that zarrs reads in one
    # call (per chunk, zarrs costs more than this: issue 20)
    one_slice = not sharded and _one_slice(runs, size, plan_order)
    direct = None
    if not sharded and not plan_order and not (one_slice and native):
        direct = direct_reader(view)
    ordered = [piece for run in runs for piece in run]  # ascending chunks, as placed
    items = None if direct is None else _direct_items(ordered)
    if items is None:
        direct = None
    # the missing-key lookups of a native read only when zarrs reads the window
    fast = view
    if direct is None and native:
        fast = native_view(array, name, policy, ledger, keys, scope) or view
    if direct is None and one_slice:
        with contextlib.suppress(Exception):  # read again below, chunk by chunk
            whole = (slice(runs[0][0].start, runs[0][-1].stop),)
            if out is not None and _poolable(view, dtype):  # decoded straight into it
                read_into(fast, whole, out, scope)
                return out, _report(view, pieces, ledger, ())
            rows = np.asarray(read_array(fast, whole, scope))
            if out is not None:
                out[...] = rows
                return out, _report(view, pieces, ledger, ())
            return _owned(rows), _report(view, pieces, ledger, ())
    if out is None:
        out = np.empty(shape, dtype) if decode_bytes is None else mapped(shape, dtype)
    place = _Placer(out, plan_order)
    try:
        if sharded:
            _read_shards(view, runs, place, limit_rows, scope)
            return place.out, _report(view, pieces, ledger, ())
        if direct is not None and items is not None:
            spans, takes, targets = _direct_targets(ordered, items, place.out, 0)
            at_once = _direct_at_once(limit_rows, ordered)
            keep = decode_bytes is None  # an exact window's buffers are budgeted: not kept
            run_on_loop(direct.read(spans, targets, at_once, takes, keep), scope)
            return place.out, _report(view, pieces, ledger, ())
        inner = async_array(fast)
        if inner is not None and (len(runs) > 1 or fast is not view):
            chunks = [[piece] for run in runs for piece in run]
            _read_runs_concurrently(
                inner, chunks, _starts(chunks), place, limit_rows, streaming, scope=scope,
                kept_rows=fast is view,  # zarrs reads an orthogonal selection through Zarr
                direct=True,  # zarrs too decodes a whole chunk straight into out= (Rust)
            )  # fmt: skip
            return place.out, _report(view, pieces, ledger, ())
    except ReadCancelledError:
        raise
    except Exception as exc:  # the other reads were cancelled; read again run by run,
        if is_program_error(exc):  # so that the error names the chunk that fails
            error = program_error(exc, f"a window of array {name}")
            raise error from error.__cause__
    skipped = _read_again(view, name, runs, place, ledger, policy, scope)
    out = _without(place.out, skipped, size, plan_order)
    return out, _report(view, pieces, ledger, [p for p, _ in skipped])


#: One member's read in :func:`read_members`: the array, its name, its row bytes, its
#: pieces and its ``store.direct`` layout (``None``: read by :func:`read_window`).
MemberRead = tuple[Any, str, int, tuple[ChunkPiece, ...], DirectLayout | None]


@dataclass(frozen=True, eq=False)
class MemberWindow:
    """A collection window read here whose members :func:`read_members` reads together.

    The reads (:data:`MemberRead` per member touched, ascending), where each
    member's rows start in the window's output, each member's chunk -> the
    collection's chunk map and first sample (as :func:`join_members` takes
    them), the output's rows, trailing shape and dtype, a chunk subset's
    chunk map (``local``) and an exact window's ``decode_bytes``.  One value,
    opaque to dask: dask walks a task's tuple and list arguments for keys,
    item by item, and a window's pieces are many small tuples holding none.
    """

    reads: tuple[MemberRead, ...]
    starts: tuple[int, ...]
    maps: tuple[tuple[Any, int], ...]
    size: int
    trailing: tuple[int, ...]
    dtype: Any
    local: dict[int, tuple[int, int, int]] | None = None
    decode_bytes: int | None = None


def read_member_window(
    window: MemberWindow, ctx: ReadContext = DEFAULT_CONTEXT
) -> tuple[np.ndarray, ReadReport]:
    """One task for a local collection window: its output, its members' read, the join.

    The output as :func:`window_output` makes it (an exact window's in an
    mmap of its own, else from ``ctx.pool``), filled by :func:`read_members`,
    the reports joined by :func:`join_members`: the window's rows in
    ascending sample order and its report in the collection's chunks, as
    the task per member and the join give them.
    """
    out = window_output(
        window.size, window.trailing, window.dtype, window.decode_bytes is not None, ctx.pool
    )
    parts = read_members(
        window.reads, out, window.starts, ctx.policy, ctx.scope, window.decode_bytes
    )
    return join_members(parts, window.maps, None, window.local, (out, window.starts))


def read_members(
    reads: Sequence[MemberRead],
    out: np.ndarray,
    starts: Sequence[int],
    policy: ReadPolicy = DEFAULT_POLICY,
    scope: CancelScope | None = None,
    decode_bytes: int | None = None,
) -> list[tuple[np.ndarray, ReadReport]]:
    """Windows of several arrays (a collection's members) read into one output, as one read.

    ``reads`` are :data:`MemberRead` per member, each member's rows going to
    ``out`` from its ``starts`` on (ascending sample order).  The members
    with a ``store.direct`` layout have their chunks fetched through a policy
    store of their own and decoded straight into their rows (the kept rows
    of a chunk kept in part gathered from it), every member's chunks at
    once on Zarr's event loop, as many at a time as :func:`read_window`
    decodes for one array (``decode_bytes``: an exact shuffle's share of its
    budget): one read, where one task per member paid its own task, view
    and selection for two or three chunks (docs/benchmarks.md,
    *Collections*).  Any other member, or one whose chunk does not decode,
    is read on its own by :func:`read_window` (which names, skips or fills
    its chunks as for one array); a fetch that failed for good is raised,
    named.  Returns each member's ``(rows, report)``, as :func:`read_window`
    would.
    """
    results: list[tuple[np.ndarray, ReadReport] | None] = [None] * len(reads)
    jobs = []
    for i, ((array, name, _, pieces, layout), start) in enumerate(zip(reads, starts, strict=True)):
        items = None if layout is None else _direct_items(pieces)
        if layout is None or items is None:
            continue
        ledger = Ledger()
        reader = layout.policy_reader(array, name, policy, ledger)
        spans, takes, targets = _direct_targets(pieces, items, out, start)
        rows = slice(start, start + sum(_taken(piece) for piece in pieces))
        jobs.append((i, reader, spans, targets, takes, ledger, rows))
    every = [piece for read in reads for piece in read[3]]
    at_once = None
    if every:
        row_bytes = max(read[2] for read in reads)
        limit_rows, _ = _decode_limit(every, len(out), row_bytes, decode_bytes)
        at_once = _direct_at_once(limit_rows, every)

    async def read_all() -> list[Any]:
        limit = concurrency_limit(at_once)
        return await asyncio.gather(
            *(job[1].read(job[2], job[3], limit, job[4], decode_bytes is None) for job in jobs),
            return_exceptions=True,
        )

    if jobs:
        outcomes = run_on_loop(read_all(), scope)
        for (i, *_, ledger, rows), outcome in zip(jobs, outcomes, strict=True):
            array, name, _, pieces, _ = reads[i]
            if isinstance(outcome, MissingChunkError | StoreGoneError | ReadCancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                # a key whose retries are spent is not read again: named here; a chunk
                # that did not decode is read again alone, below (named, or skipped)
                named = [(f"axis-0 chunk {piece.chunk}", piece) for piece in pieces]
                raise_failed_read(array, name, named, ledger)
                continue
            results[i] = (out[rows], _report(array, pieces, ledger, ()))
    done = []
    for result, (array, name, row_bytes, pieces, _), start in zip(
        results, reads, starts, strict=True
    ):
        if result is None:
            size = sum(_taken(piece) for piece in pieces)
            into = out[start : start + size]
            ctx = ReadContext(policy, scope, decode_bytes=decode_bytes)
            result = read_window(array, name, size, row_bytes, pieces, ctx, into)
        done.append(result)
    return done


def in_subset(report: ReadReport, local: dict[int, tuple[int, int, int]]) -> ReadReport:
    """``report`` of a read of a chunk subset's base chunks, in the subset's chunks.

    ``local`` maps a base chunk to the subset's chunk and the samples it
    holds (``SubsetSource.local_chunks``), so that the stream counts and
    names missing and skipped chunks as it planned them.
    """
    if report.missing_chunks or report.skipped:
        report = dataclasses.replace(
            report,
            missing_chunks=tuple(local[chunk][0] for chunk in report.missing_chunks),
            skipped=tuple(local[chunk] for chunk, _, _ in report.skipped),
        )
    return report


def read_subset_window(
    local: dict[int, tuple[int, int, int]], *args: Any
) -> tuple[np.ndarray, ReadReport]:
    """:func:`read_window` of a chunk subset's window, its report in the subset's chunks.

    ``args`` are :func:`read_window`'s, the pieces already mapped to the base
    array's chunks (``SubsetSource.base_piece``); ``local``: see :func:`in_subset`.
    """
    rows, report = read_window(*args)
    return rows, in_subset(report, local)


def _decode_limit(
    pieces: Sequence[ChunkPiece], size: int, row_bytes: int, decode_bytes: int | None
) -> tuple[int, bool]:
    """Decoded rows a window keeps in flight, and whether it places each chunk as it arrives."""
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
    return max(limit_rows, largest), streaming


def _one_slice(runs: Sequence[Sequence[ChunkPiece]], size: int, plan_order: bool) -> bool:
    """Whether the window is one slice of the array, returned as read."""
    if len(runs) != 1 or not _is_whole(runs[0], size):
        return False
    return not plan_order or _in_plan_order(runs[0])


class _Placer:
    """Puts decoded rows into a window's output, in ascending sample order or plan order."""

    def __init__(self, out: np.ndarray, plan_order: bool) -> None:
        self.out = out
        self.plan_order = plan_order

    def __call__(
        self, run: Sequence[ChunkPiece], slab: np.ndarray, at: int, kept: bool = False
    ) -> None:
        """Place run ``run`` decoded as ``slab`` at ``at`` (``kept``: one chunk's rows ``take``)."""
        if kept:
            self.piece(run[0], slab, at)
            return
        lo = run[0].start
        for piece in run:
            local = piece.start - lo
            rows = slab[local : local + piece.rows][piece.take]
            self.piece(piece, rows, at)
            at += len(rows)

    def target(self, run: Sequence[ChunkPiece], at: int) -> np.ndarray | None:
        """The rows of the output ``run`` fills as read, if it keeps every row of its chunks.

        Then Zarr decodes the run straight into them (no slab of its own, no copy
        after it): in ascending sample order, or in plan order when each chunk's
        rows also sit there in chunk order.
        """
        if not all(_keeps_all(piece) for piece in run):
            return None
        rows = run[-1].stop - run[0].start
        if self.plan_order:
            if not _in_plan_order(run, run[0].start - _dest_start(run[0])):
                return None
            at = _dest_start(run[0])
        return self.out[at : at + rows]

    def piece(self, piece: ChunkPiece, rows: np.ndarray, at: int) -> None:
        """Place the kept rows of one chunk at ``at`` (or at its ``dest``, in plan order)."""
        if self.plan_order:
            put_rows(self.out, piece.dest, rows)
        else:
            self.out[at : at + len(rows)] = rows


def _read_shards(
    view: Any,
    runs: Sequence[Sequence[ChunkPiece]],
    place: _Placer,
    limit_rows: int,
    scope: CancelScope | None,
) -> None:
    """Read a window of a sharded array with the shard reader, shard rows in parallel."""
    ordered = [piece for run in runs for piece in run]
    shard_rows = max(object_shape(view)[0], 1)
    coro = read_sharded(
        view, ordered, _starts([[p] for p in ordered]), place.out, _keeps_all,
        shards_in_flight=max(2, limit_rows // shard_rows),
        scatter=(lambda p, rows: place.piece(p, rows, 0)) if place.plan_order else None,
    )  # fmt: skip
    run_on_loop(coro, scope)


def _read_again(
    view: Any,
    name: str,
    runs: Sequence[Sequence[ChunkPiece]],
    place: _Placer,
    ledger: Ledger,
    policy: ReadPolicy,
    scope: CancelScope | None,
) -> list[tuple[ChunkPiece, int]]:
    """A failed window read again run by run, then chunk by chunk, to name the chunk that fails.

    Returns the chunks left out (``on_error="skip"``) and where their rows
    would have gone.  A key whose retries are spent is not read again.
    """
    named = [(f"axis-0 chunk {piece.chunk}", piece) for run in runs for piece in run]
    raise_failed_read(view, name, named, ledger)
    skipped: list[tuple[ChunkPiece, int]] = []
    for run, at in zip(runs, _starts(runs), strict=True):
        try:
            span = (slice(run[0].start, run[-1].stop),)
            place(run, _owned(np.asarray(read_array(view, span, scope))), at)
            continue
        except Exception as exc:  # chunk by chunk, so that the error names the chunk that fails
            if is_program_error(exc):
                error = program_error(exc, f"axis-0 chunks {run[0].chunk}.. of array {name}")
                raise error from error.__cause__
        for piece, where in zip(run, _starts([[p] for p in run]), strict=True):
            try:
                rows = read_rows(view, name, piece, ledger, scope)
            except CorruptChunkError:
                if policy.on_error != "skip":
                    raise
                skipped.append((piece, at + where))
                continue
            place.piece(piece, rows, at + where)
    return skipped


def _without(
    out: np.ndarray, skipped: Sequence[tuple[ChunkPiece, int]], size: int, plan_order: bool
) -> np.ndarray:
    """``out`` without the rows of the chunks left out."""
    if not skipped:
        return out
    drop = np.concatenate(
        [np.arange(size)[p.dest] if plan_order else np.arange(w, w + _taken(p)) for p, w in skipped]
    )
    return np.delete(out, drop, axis=0)


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


def _poolable(view: Any, dtype: np.dtype) -> bool:
    """Whether a window of ``view`` may go into a pooled buffer: a Zarr array of plain values."""
    return isinstance(view, zarr.Array) and not dtype.hasobject and dtype.kind in "biufcmMSUV"


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
        cache=ledger.cache,
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
    direct: bool = False,
) -> None:
    """Read runs on Zarr's event loop, at most ``limit_rows`` rows in flight.

    With ``direct``, a run that keeps every row of its chunks is decoded
    straight into its rows of the output (``place.target``: Zarr's ``out=``),
    which saves a slab allocated per run and a copy of every row (measured in
    docs/benchmarks.md, *Big samples*).

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
                target = place.target(run, at) if direct else None
                if target is not None:  # decoded straight into the window's rows
                    selection = (slice(run[0].start, run[-1].stop),)
                    await inner.get_orthogonal_selection(selection, out=nd_buffer(target))
                    return
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

    run_on_loop(read_all(), scope)
    for run, slab, at in arrived:
        place(run, slab, at)


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


def _in_plan_order(run: Sequence[ChunkPiece], lo: int | None = None) -> bool:
    """Whether a whole run, as read, is also in the window's plan order (sequential).

    ``lo``: the sample at the window's plan position 0 (default the run's first).
    """
    lo = run[0].start if lo is None else lo
    return all(
        isinstance(p.dest, slice) and p.dest == slice(p.start - lo, p.stop - lo) for p in run
    )


def _dest_start(piece: ChunkPiece) -> int:
    """Where a piece's rows start in plan order (-1 when they are not one slice there)."""
    dest = piece.dest
    return int(dest.start or 0) if isinstance(dest, slice) and dest.step in (None, 1) else -1


def _direct_at_once(limit_rows: int, pieces: Sequence[ChunkPiece]) -> int:
    """Chunks ``store.direct`` decodes at once within ``limit_rows`` decoded rows in flight.

    Each holds its stored bytes and its decoded chunk (a scratch chunk, or
    the rows it fills), so two chunks' worth each (at least one at once).
    """
    return max(1, limit_rows // (2 * max(piece.rows for piece in pieces)))


def _direct_items(
    pieces: Sequence[ChunkPiece],
) -> list[tuple[tuple[int, int], np.ndarray | None]] | None:
    """What ``store.direct`` reads for each piece: its span, and the rows it keeps.

    A piece that keeps one run of its chunk's rows is that run (``None``:
    every row of it); any other keeps the rows of ``take`` from its chunk's
    rows, gathered in that order.  ``None`` if a piece keeps no row.
    """
    items: list[tuple[tuple[int, int], np.ndarray | None]] = []
    for piece in pieces:
        span = _span(piece)
        if span is not None:
            items.append((span, None))
            continue
        take = piece.take
        rows = np.arange(piece.rows)[take] if isinstance(take, slice) else np.asarray(take)
        if not len(rows):
            return None
        items.append(((piece.start, piece.stop), rows.astype(np.intp, copy=False)))
    return items


def _direct_targets(
    pieces: Sequence[ChunkPiece],
    items: Sequence[tuple[tuple[int, int], np.ndarray | None]],
    out: np.ndarray,
    at: int,
) -> tuple[list[tuple[int, int]], list[np.ndarray | None], list[np.ndarray]]:
    """Spans, kept rows and targets of ``pieces`` (ascending) written into ``out`` from ``at``."""
    spans, takes, targets = [], [], []
    for piece, (span, take) in zip(pieces, items, strict=True):
        spans.append(span)
        takes.append(take)
        targets.append(out[at : at + _taken(piece)])
        at += _taken(piece)
    return spans, takes, targets


def _span(piece: ChunkPiece) -> tuple[int, int] | None:
    """The samples a piece keeps when they are one run of its chunk (else ``None``)."""
    take = piece.take
    if not isinstance(take, slice):
        return None
    first, stop, step = take.indices(piece.rows)
    if step != 1 or stop <= first:
        return None
    return piece.start + first, piece.start + stop


def _keeps_all(piece: ChunkPiece) -> bool:
    """Whether the window keeps every row of the chunk, in chunk order."""
    return isinstance(piece.take, slice) and piece.take == slice(0, piece.rows)
