"""Reading a window of a CSR source: its rows' stored chunks decoded once, rows gathered.

:func:`read_csr_window` is the task of a :class:`~daskzarr_batches.store.sparse.CsrSource`'s
window: the stored chunks of ``data`` and ``indices`` that hold the window's
rows' non-zeros, each decoded once by :func:`read_window` (the array's own
chunk reader: the shard reader for annbatch's sharded layout, the read
policy's retries, missing chunks and cache, errors naming the chunk), then
the rows gathered into one ``scipy.sparse.csr_matrix`` (``store.sparse``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CorruptChunkError
from ..plan.windows import ChunkPiece
from ..store.policy import ReadReport, is_program_error
from ..store.sparse import CsrSource, Decoded, chunk_runs, gather_rows, needed_chunks
from ..store.threads import DaemonExecutor
from .context import DEFAULT_CONTEXT, ReadContext
from .window import read_window

__all__ = ["read_csr_block", "read_csr_rows", "read_csr_window", "window_rows"]


_POOL: list[DaemonExecutor] = []
_POOL_LOCK = threading.Lock()


def _parts_pool() -> DaemonExecutor:
    """The threads that read a window's ``indices`` beside its ``data`` (made once)."""
    with _POOL_LOCK:
        if not _POOL or _POOL[0]._shutdown:
            _POOL[:] = [DaemonExecutor(8, "dzb_csr_indices")]
        return _POOL[0]


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
    """Rows ``rows`` of ``source`` (global ids, in that order) as a CSR matrix, and its report."""
    wanted = np.unique(rows)
    inner = ctx.narrowed(plan_order=False, pool=None, decode_bytes=None)
    parts: dict[str, Decoded] = {}
    decoded: list[tuple[Any, int]] = []
    missing: list[str] = []
    retries = 0
    # indices on a thread of their own while data is read here: both decode at once
    later = _parts_pool().submit(_read_chunks, source, "indices", source.indices, wanted, inner)
    try:
        first = _read_chunks(source, "data", source.data, wanted, inner)
    finally:
        second = later.result()
    for (part, array), (values, starts, at, report) in zip(
        (("data", source.data), ("indices", source.indices)), (first, second), strict=True
    ):
        parts[part] = (values, starts, at)
        itemsize = np.dtype(array.dtype).itemsize
        decoded += [((part, chunk), nbytes * itemsize) for chunk, nbytes in report.decoded or ()]
        missing += report.missing_keys
        retries += report.retries
    matrix = gather_rows(source, rows, parts)
    return matrix, ReadReport(missing_keys=tuple(missing), retries=retries, decoded=tuple(decoded))


def _read_chunks(
    source: CsrSource, part: str, array: Any, rows: np.ndarray, ctx: ReadContext
) -> tuple[np.ndarray, np.ndarray, np.ndarray, ReadReport]:
    """The stored chunks of ``array`` that ``rows`` need, decoded once each, as runs."""
    unit = source.unit_of(array)
    length = int(array.shape[0])
    chunks = needed_chunks(source, rows, unit)
    runs = chunk_runs(chunks)
    starts = np.array([first * unit for first, _ in runs], dtype=np.int64)
    lengths = [min(end * unit, length) - first * unit for first, end in runs]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if runs else starts
    sizes = tuple((int(c), min((int(c) + 1) * unit, length) - int(c) * unit) for c in chunks)
    if _sliced_directly(ctx):
        try:
            values = _read_runs(array, starts, lengths)
            return values, starts, offsets, ReadReport(decoded=sizes)
        except Exception as exc:  # read again through the read policy, which names the chunk
            if is_program_error(exc):
                raise
    pieces, at = [], 0
    for chunk in chunks.tolist():
        stop = min((chunk + 1) * unit, length)
        pieces.append(
            ChunkPiece(chunk, chunk * unit, stop, slice(None), slice(at, at + stop - chunk * unit))
        )
        at += stop - chunk * unit
    name = f"{source.name}/{part}"
    values, report = read_window(array, name, at, np.dtype(array.dtype).itemsize, pieces, ctx)
    if report.skipped:
        raise CorruptChunkError(
            f"{name}: stored chunks {[c for c, _, _ in report.skipped]} do not decode; a "
            "csr_matrix's rows cannot leave out part of their non-zeros, so on_error='skip' "
            "is not supported for sparse rows (use on_error='raise')"
        )
    return (
        values,
        starts,
        offsets,
        ReadReport(report.missing_keys, (), report.retries, (), sizes),
    )


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


def _read_runs(array: Any, starts: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
    """The runs ``starts[i] : starts[i] + lengths[i]`` of ``array``, one after another."""
    if len(lengths) == 1:
        start = int(starts[0])
        return np.asarray(array[start : start + lengths[0]])
    out = np.empty(int(sum(lengths)), dtype=array.dtype)
    at = 0
    for start, size in zip(starts.tolist(), lengths, strict=True):
        out[at : at + size] = array[start : start + size]
        at += size
    return out
