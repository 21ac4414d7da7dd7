"""Reading one window of one array: its chunk pieces decoded concurrently into the window's rows.

The task behind every batch stream's window of a Zarr or numpy array
(:func:`read_window`), with the exact shuffle's memory care (an output in its
own mmap, the C heap trimmed after each window) and the fallback that names a
chunk that failed."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import MissingChunkError, ReadCancelledError, StoreGoneError
from ..plan.budget import DECODE_GROUP_BYTES
from ..plan.windows import ChunkPiece
from ..store.direct import DirectLayout, concurrency_limit
from ..store.layout import storage_keys
from ..store.policy import (
    DEFAULT_POLICY,
    CancelScope,
    Ledger,
    ReadPolicy,
    ReadReport,
    is_program_error,
    policy_view,
    program_error,
)
from ..store.reader_hook import LibraryReader, Planned, planned, raise_users_failure, reader_of
from ..store.readers import Access, RowsWindow, poolable, reader_for, run_on_loop
from ..store.requests import ChunkRequest, read_each, window_requests
from ..store.rows import (
    Placer,
    direct_at_once,
    direct_items,
    direct_targets,
    keeps_all,
    runs_of,
    starts,
    taken,
)
from .context import DEFAULT_CONTEXT, ReadContext
from .failures import raise_failed_read, read_again
from .tasks import join_members, mapped, window_output

_taken = taken  # read.kept's name

__all__ = [
    "MemberRead",
    "MemberWindow",
    "read_member_window",
    "read_members",
    "read_subset_window",
    "read_window",
    "release_free_memory",
]


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
    ``ctx.allocator``, when given, allocates the output instead (and
    instead of ``decode_bytes``' mmap): the array the requests point at.
    """
    policy, scope, plan_order = ctx.policy, ctx.scope, ctx.plan_order
    decode_bytes = ctx.decode_bytes
    ledger = Ledger()

    def keys() -> list[str]:  # the store keys of the window's chunk rows
        return [key for piece in pieces for key in storage_keys(array, piece.start, piece.stop)]

    engine = reader_for(array, policy)
    access = Access(array, name, policy, ledger, scope, keys, engine.native)
    view = access.view
    limit_rows, streaming = _decode_limit(pieces, size, row_bytes, decode_bytes)
    runs = runs_of(pieces, limit_rows)
    shape, dtype = (size, *view.shape[1:]), np.dtype(view.dtype)
    if into is not None:
        assert not plan_order and into.shape == shape, (into.shape, shape)
        out = into
    elif decode_bytes is not None and ctx.allocator is None:
        out = mapped(shape, dtype)  # the exact shuffle's: an mmap of its own
    else:  # the context's allocator, else the pool's buffer or numpy's
        out = ctx.allocate(shape, dtype, poolable(view))

    window = RowsWindow(
        runs, size, plan_order, limit_rows, streaming, decode_bytes is None, lambda: out, out
    )
    requests = window_requests(array, window.ordered(), out, plan_order)

    def narrow(some: Sequence[ChunkRequest]) -> Callable[[], Any]:
        """The engine's read of the pieces of ``some`` only, each to its rows of ``out``."""
        chunks = {request.chunk[0] for request in some}
        ats = starts([[piece] for piece in window.ordered()])
        fewer = [
            piece if plan_order else dataclasses.replace(piece, dest=slice(at, at + taken(piece)))
            for piece, at in zip(window.ordered(), ats, strict=True)
            if piece.chunk in chunks
        ]
        part = dataclasses.replace(window, runs=runs_of(fewer, limit_rows), plan_order=True)

        def run() -> np.ndarray:
            if engine.read_rows(access, part) is None:  # not the engine's read: chunk by chunk
                read_each(view, some, lambda coro: run_on_loop(coro, scope))
            return out

        return run

    plan = Planned(
        requests, lambda: engine.read_rows(access, window), view,
        lambda coro: run_on_loop(coro, scope), counts=ledger.cache, narrow=narrow,
    )  # fmt: skip
    reader = reader_of(array, policy)  # a factory's failure is raised, not read around
    try:
        with planned(plan):
            reader.read(requests)
        rows = plan.result if plan.ran else out
        if rows is not None:
            return rows, _report(view, pieces, ledger, ())
    except ReadCancelledError:
        raise
    except Exception as exc:  # the other reads were cancelled; read again run by run,
        if is_program_error(exc):  # so that the error names the chunk that fails
            error = program_error(exc, f"a window of array {name}")
            raise error from error.__cause__
        raise_users_failure(plan, reader, name, exc)
    place = Placer(window.output(), plan_order)
    skipped = read_again(view, name, runs, place, ledger, policy, scope)
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
    ``out`` from its ``starts`` on (ascending sample order).  Each member's
    chunks are asked of its own reader (``reader_of``: the user's from
    ``ReadOptions(reader=...)``, else the library's), as its requests
    (``store.requests``), member after member (:class:`_Members`).  The
    library's read of the members with a ``store.direct`` layout is one
    read for all of them: their chunks fetched through a policy store of
    their own and decoded straight into their rows (the kept rows of a chunk
    kept in part gathered from it), every member's chunks at once on Zarr's
    event loop, as many at a time as :func:`read_window` decodes for one
    array (``decode_bytes``: an exact shuffle's share of its budget): one
    read, where one task per member paid its own task, view and selection
    for two or three chunks (docs/benchmarks.md, *Collections*).  Any other
    member, or one whose chunk does not decode, is read on its own by
    :func:`read_window` (which names, skips or fills its chunks as for one
    array); a fetch that failed for good is raised, named.  Returns each
    member's ``(rows, report)``, as :func:`read_window` would.
    """
    results: list[tuple[np.ndarray, ReadReport] | None] = [None] * len(reads)
    every = [piece for read in reads for piece in read[3]]
    at_once = None
    if every:
        row_bytes = max(read[2] for read in reads)
        limit_rows, _ = _decode_limit(every, len(out), row_bytes, decode_bytes)
        at_once = direct_at_once(limit_rows, every)
    members = _Members(reads, out, starts, policy, scope, decode_bytes, at_once, results)
    members.ask_all()
    done = []
    for result, (array, name, row_bytes, pieces, _), start in zip(
        results, reads, starts, strict=True
    ):
        if result is None:
            size = sum(taken(piece) for piece in pieces)
            into = out[start : start + size]
            ctx = ReadContext(policy, scope, decode_bytes=decode_bytes)
            result = read_window(array, name, size, row_bytes, pieces, ctx, into)
        done.append(result)
    return done


#: Readers of other members asked inside one another's read at most (:class:`_Members`).
MEMBERS_NESTED = 32


@dataclass(eq=False)
class _Members:
    """The members of :func:`read_members` with a ``store.direct`` layout, asked of their readers.

    Each member's requests go to its reader (``reader_of``), the member's
    part of the combined read as their planned read (:meth:`enlist`).  The
    library's own reader runs its planned read and returns at once, so a
    member it reads is enlisted and the next one asked; the combined read of
    the enlisted members runs when every member was asked (:meth:`gather`).
    Any other reader (a user's wrapper) must return with its requests
    filled, so its planned read enlists the member and then asks the next
    members (and runs the combined read at the end) *inside* that reader's
    read: every reader sees its own requests, and the chunks are still
    decoded in one read.  At most :data:`MEMBERS_NESTED` readers are asked
    inside one another; then the read so far runs and the next members are
    asked from the top.  A member whose reader filled its requests itself
    (the planned read not run) has its rows and an empty report.
    """

    reads: Sequence[MemberRead]
    out: np.ndarray
    starts: Sequence[int]
    policy: ReadPolicy
    scope: CancelScope | None
    decode_bytes: int | None
    at_once: int | None
    results: list[tuple[np.ndarray, ReadReport] | None]
    enlisted: list[Any] = dataclasses.field(default_factory=list)

    def ask_all(self) -> None:
        """Ask every direct member's reader, the combined read run as they ask for it."""
        direct = [
            i
            for i, read in enumerate(self.reads)
            if read[4] is not None and direct_items(read[3]) is not None
        ]
        k = 0
        while k < len(direct):
            k = self.ask(direct, k, 0)
        self.gather()

    def ask(self, direct: Sequence[int], k: int, depth: int) -> int:
        """Ask the readers of members ``direct[k:]``; the position where the asking stopped."""
        while k < len(direct):
            i = direct[k]
            array, name, _, pieces, _ = self.reads[i]
            reader = reader_of(array, self.policy)
            library = type(reader) is LibraryReader
            if not library and depth >= max(MEMBERS_NESTED, 1):
                self.gather()  # the readers asked so far are filled: they may return
                return k
            ledger = Ledger()
            rows = slice(self.starts[i], self.starts[i] + sum(taken(p) for p in pieces))
            requests = window_requests(array, pieces, self.out, False, at=rows.start)
            stopped = [len(direct)]

            def run(
                i: int = i, k: int = k, ledger: Ledger = ledger, rows: slice = rows,
                library: bool = library, stopped: list[int] = stopped,
            ) -> None:  # fmt: skip
                self.enlisted.append((i, ledger, rows))
                if not library:  # the rest asked, and read, before this reader returns
                    stopped[0] = self.ask(direct, k + 1, depth + 1)
                    self.gather()

            view = array if library else policy_view(array, name, self.policy, ledger)
            plan = Planned(
                requests, run, view, lambda coro: run_on_loop(coro, self.scope),
                counts=ledger.cache,
            )  # fmt: skip
            with planned(plan):
                reader.read(requests)
            if not plan.ran:  # the reader filled the member's rows itself
                self.results[i] = (self.out[rows], _report(array, pieces, ledger, ()))
            elif not library:
                return stopped[0]
            k += 1
        return k

    def gather(self) -> None:
        """The combined read of the members enlisted so far: their chunks at once, one read."""
        enlisted, self.enlisted = self.enlisted, []
        if not enlisted:
            return
        jobs = []
        for i, ledger, rows in enlisted:
            array, name, _, pieces, layout = self.reads[i]
            items = direct_items(pieces)
            assert layout is not None and items is not None
            reader = layout.policy_reader(array, name, self.policy, ledger)
            spans, takes, targets = direct_targets(pieces, items, self.out, rows.start)
            jobs.append((reader, spans, targets, takes))
        keep = self.decode_bytes is None

        async def read_all() -> list[Any]:
            limit = concurrency_limit(self.at_once)
            return await asyncio.gather(
                *(
                    reader.read(spans, targets, limit, takes, keep)
                    for reader, spans, targets, takes in jobs
                ),
                return_exceptions=True,
            )

        outcomes = run_on_loop(read_all(), self.scope)
        for (i, ledger, rows), outcome in zip(enlisted, outcomes, strict=True):
            array, name, _, pieces, _ = self.reads[i]
            if isinstance(outcome, MissingChunkError | StoreGoneError | ReadCancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                # a key whose retries are spent is not read again: named here; a chunk
                # that did not decode is read again alone, by read_window (named, or skipped)
                named = [(f"axis-0 chunk {piece.chunk}", piece) for piece in pieces]
                raise_failed_read(array, name, named, ledger)
                continue
            self.results[i] = (self.out[rows], _report(array, pieces, ledger, ()))


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
    partial = not all(keeps_all(piece) for piece in pieces)
    if partial:
        limit_rows = min(limit_rows, max(size // 16, largest * (os.cpu_count() or 1)))
    streaming = partial
    if decode_bytes is not None:
        limit_rows, streaming = decode_bytes // max(row_bytes, 1), True
        if 2 * limit_rows >= largest:  # half a chunk or more: one decoding, the next read
            limit_rows = max(limit_rows, 2 * largest)
    return max(limit_rows, largest), streaming


def _without(
    out: np.ndarray, skipped: Sequence[tuple[ChunkPiece, int]], size: int, plan_order: bool
) -> np.ndarray:
    """``out`` without the rows of the chunks left out."""
    if not skipped:
        return out
    drop = np.concatenate(
        [np.arange(size)[p.dest] if plan_order else np.arange(w, w + taken(p)) for p, w in skipped]
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
