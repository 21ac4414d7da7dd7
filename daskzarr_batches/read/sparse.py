"""Reading a window of a CSR source: its rows' stored chunks decoded once, rows gathered.

:func:`read_csr_window` is the task of a :class:`~daskzarr_batches.store.sparse.CsrSource`'s
window: the stored chunks of ``data`` and ``indices`` that hold the window's
rows' non-zeros, each decoded once by :func:`read_window` (the array's own
chunk reader: the shard reader for annbatch's sharded layout, the read
policy's retries, missing chunks and cache, errors naming the chunk), then
the rows gathered into one ``scipy.sparse.csr_matrix`` (``store.sparse``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CorruptChunkError
from ..plan.windows import ChunkPiece
from ..store.pipelines import codec_pipeline_of, is_zarrs_pipeline, with_codec_pipeline
from ..store.policy import ReadReport, is_program_error
from ..store.reader_hook import Planned, planned, reader_of
from ..store.requests import ChunkRequest
from ..store.sparse import CsrSource, Decoded, chunk_runs, gather_rows, needed_chunks
from ..store.threads import DaemonExecutor
from ..store.zarr_adapter import codec_pipeline
from .context import DEFAULT_CONTEXT, ReadContext
from .window import read_window

__all__ = ["read_csr_block", "read_csr_rows", "read_csr_window", "window_rows"]


_POOL: list[DaemonExecutor] = []
_POOL_LOCK = threading.Lock()


def _parts_pool() -> DaemonExecutor:
    """The threads that decode a window's slices of ``data`` and ``indices`` (made once).

    Only read tasks submit to it, and its threads never wait on it: no deadlock.
    """
    with _POOL_LOCK:
        if not _POOL or _POOL[0]._shutdown:
            _POOL[:] = [DaemonExecutor(8, "dzb_csr_slices")]
        return _POOL[0]


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads are not there, a new pool is made."""
    _POOL.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool)


def window_rows(pieces: Sequence[ChunkPiece], size: int, plan_order: bool) -> np.ndarray:
    """The window's global row ids: ascending (chunk by chunk), or in plan order."""
    parts = [np.arange(p.start, p.stop, dtype=np.int64)[p.take] for p in pieces]
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    if not plan_order:
        return rows
    ordered = np.empty(size, dtype=np.int64)
    at = 0
    for piece, part in zip(pieces, parts, strict=True):
        ordered[piece.dest] = rows[at : at + len(part)]
        at += len(part)
    return ordered


def read_csr_window(
    source: CsrSource,
    pieces: Sequence[ChunkPiece],
    size: int,
    ctx: ReadContext = DEFAULT_CONTEXT,
) -> tuple[Any, ReadReport]:
    """One window of ``source``: its rows as a CSR matrix, and what was read.

    Rows in ascending sample order, or with ``ctx.plan_order`` in the
    window's plan order; the report lists every stored chunk decoded
    (``decoded``: ``(("data" or "indices", chunk), bytes)``), so
    ``stats.read_amplification`` is how often each was decoded.
    """
    rows = window_rows(pieces, size, ctx.plan_order)
    return read_csr_rows(source, rows, ctx)


def read_csr_block(
    source: CsrSource, start: int, stop: int, ctx: ReadContext = DEFAULT_CONTEXT
) -> tuple[Any, ReadReport]:
    """Rows ``start:stop`` of ``source`` (a chunk stream's block: a unit) as a CSR matrix."""
    return read_csr_rows(source, np.arange(start, stop, dtype=np.int64), ctx)


def read_csr_rows(
    source: CsrSource, rows: np.ndarray, ctx: ReadContext = DEFAULT_CONTEXT
) -> tuple[Any, ReadReport]:
    """Rows ``rows`` of ``source`` (global ids, in that order) as a CSR matrix, and its report.

    The default read policy (:func:`_sliced_directly`) reads the runs of
    stored chunks the rows need with one slice each, in pieces of at most
    ``SLICE_CHUNKS`` chunks decoded at once on a small pool (``data`` and
    ``indices`` together); a failure, or another policy, reads through
    :func:`read_window`, which retries, counts missing chunks and names the
    chunk that fails.
    """
    wanted = np.unique(rows)
    inner = ctx.narrowed(plan_order=False, pool=None, decode_bytes=None)
    arrays = {"data": source.data, "indices": source.indices}
    runs = {part: _Runs.of(source, array, wanted) for part, array in arrays.items()}
    values: dict[str, np.ndarray] = {}
    if _sliced_directly(ctx):
        try:
            values = _ask_sliced(arrays, runs, ctx)
        except Exception as exc:  # read again through the read policy, which names the chunk
            if is_program_error(exc):
                raise
    parts: dict[str, Decoded] = {}
    decoded: list[tuple[Any, int]] = []
    missing: list[str] = []
    retries = 0
    for part, array in arrays.items():
        plan = runs[part]
        if part in values:
            report = ReadReport()
        else:
            values[part], report = _read_through_policy(source, part, array, plan, inner)
        parts[part] = (values[part], plan.starts, plan.offsets)
        itemsize = np.dtype(array.dtype).itemsize
        decoded += [((part, chunk), n * itemsize) for chunk, n in plan.sizes]
        missing += report.missing_keys
        retries += report.retries
    matrix = gather_rows(source, rows, parts)
    return matrix, ReadReport(missing_keys=tuple(missing), retries=retries, decoded=tuple(decoded))


#: Stored chunks one slice decodes at most: a window's runs are cut into pieces of this
#: many, decoded at once on the pool (one slice decodes its chunks one after another).
SLICE_CHUNKS = 16


@dataclasses.dataclass(frozen=True)
class _Runs:
    """The stored chunks of one array a read needs: as runs, and their elements."""

    unit: int
    length: int
    chunks: np.ndarray
    starts: np.ndarray  # where each run starts in the array
    lengths: tuple[int, ...]
    offsets: np.ndarray  # where each run starts among the values read
    sizes: tuple[tuple[int, int], ...]  # (chunk, elements) of every chunk

    @classmethod
    def of(cls, source: CsrSource, array: Any, rows: np.ndarray) -> _Runs:
        unit, length = source.unit_of(array), int(array.shape[0])
        chunks = needed_chunks(source, rows, unit)
        runs = chunk_runs(chunks)
        starts = np.array([first * unit for first, _ in runs], dtype=np.int64)
        lengths = tuple(min(end * unit, length) - first * unit for first, end in runs)
        offsets = np.zeros(len(runs), dtype=np.int64)
        if runs:
            offsets[1:] = np.cumsum(lengths)[:-1]
        sizes = tuple((c, min((c + 1) * unit, length) - c * unit) for c in chunks.tolist())
        return cls(unit, length, chunks, starts, lengths, offsets, sizes)

    def requests(self, out: np.ndarray) -> list[ChunkRequest]:
        """The requests of every chunk, its elements to ``out`` (the runs one after another)."""
        requests, at = [], 0
        for chunk, size in self.sizes:
            start = chunk * self.unit
            whole = slice(0, size)
            here = slice(at, at + size)
            requests.append(
                ChunkRequest((chunk,), (slice(start, start + size),), (whole,), out, (here,))
            )
            at += size
        return requests

    def slices(self) -> list[tuple[int, int, int]]:
        """``(start, stop, at)``: the runs cut into slices of at most ``SLICE_CHUNKS`` chunks."""
        step = self.unit * SLICE_CHUNKS
        out = []
        for start, size, at in zip(
            self.starts.tolist(), self.lengths, self.offsets.tolist(), strict=True
        ):
            for lo in range(0, size, step):
                out.append((start + lo, start + min(lo + step, size), at + lo))
        return out


def _ask_sliced(
    arrays: dict[str, Any], runs: dict[str, _Runs], ctx: ReadContext
) -> dict[str, np.ndarray]:
    """Every part's runs asked of its array's reader, the library's read one for both parts.

    Each part's stored chunks are its requests (``store.requests``) to the
    reader of its array (``reader_of``); ``data``'s planned read asks for
    ``indices`` inside it, and the innermost planned read slices every part
    whose reader ran its planned read, all at once on the pool
    (:func:`_read_sliced`), so a wrapper's read returns with its requests
    filled and the parts are still decoded together.  A part whose reader
    filled its requests itself is not read again.
    """
    here = {part: _readable_here(array) for part, array in arrays.items()}
    outs = {part: np.empty(int(sum(runs[part].lengths)), here[part].dtype) for part in here}
    requests = {part: runs[part].requests(outs[part]) for part in arrays}
    enlisted: list[str] = []

    def ask(parts: Sequence[str]) -> None:
        if not parts:
            _read_sliced(here, runs, outs, enlisted)
            return
        part, rest = parts[0], parts[1:]

        def run() -> None:
            enlisted.append(part)
            ask(rest)

        plan = Planned(requests[part], run, here[part])
        with planned(plan):
            reader_of(arrays[part], ctx.policy).read(requests[part])
        if not plan.ran:  # filled by the reader itself: the other parts are read still
            ask(rest)

    ask(list(arrays))
    return outs


def _read_sliced(
    arrays: dict[str, Any],
    runs: dict[str, _Runs],
    outs: dict[str, np.ndarray],
    parts: Sequence[str],
) -> None:
    """Runs of ``parts`` read by slicing their arrays, the slices decoded at once on the pool."""
    jobs = [
        (outs[part], arrays[part], start, stop, at)
        for part in parts
        for start, stop, at in runs[part].slices()
    ]
    if len(jobs) <= 1:
        for job in jobs:
            _read_slice(*job)
        return
    futures = [_parts_pool().submit(_read_slice, *job) for job in jobs[1:]]
    try:
        _read_slice(*jobs[0])
    finally:
        concurrent.futures.wait(futures)
    for future in futures:
        future.result()


def _readable_here(array: Any) -> Any:
    """``array``, or a view of it on zarr's pipeline in a process forked after zarrs was
    used (zarrs' threads do not survive a fork: a read there would wait forever)."""
    if is_zarrs_pipeline(codec_pipeline(array)) and codec_pipeline_of(array) == "zarr":
        return with_codec_pipeline(array, "zarrs")  # zarrs refused here: zarr's pipeline
    return array


def _read_slice(out: np.ndarray, array: Any, start: int, stop: int, at: int) -> None:
    out[at : at + stop - start] = array[start:stop]


def _read_through_policy(
    source: CsrSource, part: str, array: Any, runs: _Runs, ctx: ReadContext
) -> tuple[np.ndarray, ReadReport]:
    """``runs`` of ``array`` read by :func:`read_window`: the read policy, errors named."""
    pieces, at = [], 0
    for chunk, size in runs.sizes:
        pieces.append(ChunkPiece(chunk, chunk * runs.unit, chunk * runs.unit + size,
                                 slice(None), slice(at, at + size)))  # fmt: skip
        at += size
    name = f"{source.name}/{part}"
    values, report = read_window(array, name, at, np.dtype(array.dtype).itemsize, pieces, ctx)
    if report.skipped:
        raise CorruptChunkError(
            f"{name}: stored chunks {[c for c, _, _ in report.skipped]} do not decode; a "
            "csr_matrix's rows cannot leave out part of their non-zeros, so on_error='skip' "
            "is not supported for sparse rows (use on_error='raise')"
        )
    return values, report


def _sliced_directly(ctx: ReadContext) -> bool:
    """Whether runs of chunks are read by slicing the array: the default read policy.

    One slice per run of consecutive stored chunks decodes them with the
    array's pipeline (zarrs when installed) at zarr's own speed; missing
    chunks are then read as the fill value, as ``missing="fill"`` does.  A
    failed slice is read again through :func:`read_window`.  With another
    ``missing``, a cache or ``on_error="skip"``, every read goes through it.
    """
    policy = ctx.policy
    return policy.missing == "fill" and policy.cache is None and policy.on_error == "raise"
