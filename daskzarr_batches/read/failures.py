"""Naming a failed read: the one fallback routine of every read task.

A read task reads several chunks at once (a window's runs, a shard's inner
blocks); when that read fails, the error says nothing of which chunk failed.
Every task then does the same: :func:`raise_failed_read` raises at once if the
store is gone or a key's retries are spent (naming the chunk that key holds;
that key is not read again), else the task reads its pieces again one by one
through :func:`read_named`, whose error names the chunk (array, chunk, keys,
samples) and says what failed: :class:`ChunkReadError` (the store),
:class:`CorruptChunkError` (the bytes did not decode), or passes
:class:`MissingChunkError`, :class:`StoreGoneError` and the cancellation on.
:func:`read_again` is that fallback for a window (run by run, then chunk by
chunk through :func:`read_rows`), whichever chunk reader (``store.readers``)
failed.  A failure of the program itself (``store.policy.is_program_error``) is raised
as what it is, with a note naming the chunk: never a corrupt or unreadable
chunk, never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import zarr

from ..errors import (
    ChunkReadError,
    CorruptChunkError,
    MissingChunkError,
    ReadCancelledError,
    StoreGoneError,
)
from ..plan.windows import ChunkPiece
from ..store.backends import error_text
from ..store.layout import storage_keys
from ..store.policy import (
    CancelScope,
    Ledger,
    ReadPolicy,
    is_program_error,
    is_transient,
    program_error,
    read_array,
)
from ..store.rows import Placer, owned, starts

__all__ = ["chunk_error", "raise_failed_read", "read_again", "read_named", "read_rows"]

T = TypeVar("T")


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
    axis-0 chunk row).  A failure of the program itself
    (:func:`~daskzarr_batches.store.policy.is_program_error`: an ImportError,
    an AttributeError, a TypeError no codec raised) is no chunk's fault: it
    is raised here as what it is, with a note naming the chunk.
    """
    if keys is None:
        keys = storage_keys(array, piece.start, piece.stop) if piece is not None else []
    where = what
    if piece is not None:
        shown = ", ".join(repr(k) for k in keys[:3]) + (", ..." if len(keys) > 3 else "")
        where += f" (samples {piece.start}:{piece.stop}" + (f", key {shown})" if keys else ")")
    where += f" of array {name}"
    if is_program_error(exc):
        error = program_error(exc, where)
        raise error from error.__cause__
    failed = [key for key in ledger.failed if not keys or key in keys]
    if failed or is_transient(exc) or not isinstance(array, zarr.Array):
        retried = f" after {ledger.retries} retries" if ledger.retries else ""
        return ChunkReadError(f"could not read {where}{retried}: {error_text(exc)}")
    return CorruptChunkError(f"{where} does not decode: {error_text(exc)}")


def read_named(
    read: Callable[[], T],
    array: Any,
    name: str,
    what: str,
    piece: ChunkPiece,
    ledger: Ledger,
    keys: list[str] | None = None,
) -> T:
    """``read()``, its failure raised as :func:`chunk_error` naming chunk ``what``."""
    try:
        return read()
    except (MissingChunkError, StoreGoneError, ReadCancelledError):
        raise
    except Exception as exc:
        raise chunk_error(array, name, what, piece, ledger, exc, keys) from exc


def raise_failed_read(
    array: Any, name: str, named: Sequence[tuple[str, ChunkPiece]], ledger: Ledger
) -> None:
    """Raise the error of a key whose read failed for good, naming its chunk.

    ``named``: the task's pieces, each with how errors call it.  First
    :class:`StoreGoneError` if the array turned out to be gone: its chunks
    are not read again one by one.
    """
    ledger.check_gone()
    for key, exc in ledger.failed.items():
        for what, piece in named:
            if key in storage_keys(array, piece.start, piece.stop):
                raise chunk_error(array, name, what, piece, ledger, exc) from exc
        raise ChunkReadError(
            f"could not read {key!r} of array {name} after {ledger.retries} retries: "
            f"{error_text(exc)}"
        ) from exc


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


def read_again(
    view: Any,
    name: str,
    runs: Sequence[Sequence[ChunkPiece]],
    place: Placer,
    ledger: Ledger,
    policy: ReadPolicy,
    scope: CancelScope | None,
) -> list[tuple[ChunkPiece, int]]:
    """A failed window read again run by run, then chunk by chunk, to name the chunk that fails.

    The fallback of every window read (``read.window``), whichever chunk
    reader failed; ``place`` puts the rows into the window's output.

    Returns the chunks left out (``on_error="skip"``) and where their rows
    would have gone.  A key whose retries are spent is not read again.
    """
    named = [(f"axis-0 chunk {piece.chunk}", piece) for run in runs for piece in run]
    raise_failed_read(view, name, named, ledger)
    skipped: list[tuple[ChunkPiece, int]] = []
    for run, at in zip(runs, starts(runs), strict=True):
        try:
            span = (slice(run[0].start, run[-1].stop),)
            place(run, owned(np.asarray(read_array(view, span, scope))), at)
            continue
        except Exception as exc:  # chunk by chunk, so that the error names the chunk that fails
            if is_program_error(exc):
                error = program_error(exc, f"axis-0 chunks {run[0].chunk}.. of array {name}")
                raise error from error.__cause__
        for piece, where in zip(run, starts([[p] for p in run]), strict=True):
            try:
                rows = read_rows(view, name, piece, ledger, scope)
            except CorruptChunkError:
                if policy.on_error != "skip":
                    raise
                skipped.append((piece, at + where))
                continue
            place.piece(piece, rows, at + where)
    return skipped
