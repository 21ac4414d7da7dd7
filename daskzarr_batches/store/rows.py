"""A window's chunk pieces as the readers place them: runs, kept rows, the output's rows.

Pure arithmetic on :class:`~daskzarr_batches.plan.windows.ChunkPiece` and
one output array, shared by the chunk readers (:mod:`.readers`) and the
window task (``read.window``): the runs of consecutive chunks a window reads,
the rows each piece keeps, where they go (ascending sample order or plan
order) and what the direct decode reads for each piece.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..plan.windows import ChunkPiece, Selector

__all__ = [
    "Placer",
    "dest_start",
    "direct_at_once",
    "direct_items",
    "direct_targets",
    "in_plan_order",
    "is_whole",
    "keeps_all",
    "one_slice",
    "owned",
    "put_rows",
    "runs_of",
    "span",
    "starts",
    "taken",
]


def put_rows(out: np.ndarray, dest: Selector, rows: np.ndarray) -> None:
    """``out[dest] = rows``, scattering whole rows as single items where it can.

    numpy copies a row of a 2-d (or more) array item by item when it scatters
    by an index array; viewed as one opaque ``void`` item per row, the same
    scatter costs less CPU (measured in docs/benchmarks.md, *Cluster delivery*).
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


def owned(array: np.ndarray) -> np.ndarray:
    """``array`` if the caller may own it (its own writeable data), else a copy."""
    if array.flags.owndata and array.flags.writeable:
        return array
    return array.copy()


class Placer:
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
        if not all(keeps_all(piece) for piece in run):
            return None
        rows = run[-1].stop - run[0].start
        if self.plan_order:
            if not in_plan_order(run, run[0].start - dest_start(run[0])):
                return None
            at = dest_start(run[0])
        return self.out[at : at + rows]

    def piece(self, piece: ChunkPiece, rows: np.ndarray, at: int) -> None:
        """Place the kept rows of one chunk at ``at`` (or at its ``dest``, in plan order)."""
        if self.plan_order:
            put_rows(self.out, piece.dest, rows)
        else:
            self.out[at : at + len(rows)] = rows


def runs_of(pieces: Sequence[ChunkPiece], max_rows: int) -> list[list[ChunkPiece]]:
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


def starts(runs: Sequence[Sequence[ChunkPiece]]) -> list[int]:
    """Where each run's rows start in the window's output."""
    return np.cumsum([0] + [sum(taken(p) for p in run) for run in runs[:-1]]).tolist()


def taken(piece: ChunkPiece) -> int:
    take = piece.take
    return len(range(piece.rows)[take]) if isinstance(take, slice) else len(take)


def one_slice(runs: Sequence[Sequence[ChunkPiece]], size: int, plan_order: bool) -> bool:
    """Whether the window is one slice of the array, returned as read."""
    if len(runs) != 1 or not is_whole(runs[0], size):
        return False
    return not plan_order or in_plan_order(runs[0])


def is_whole(run: Sequence[ChunkPiece], size: int) -> bool:
    """Whether ``run`` is the whole window: every row of its chunks.

    The output is in ascending sample order whatever the plan order (``dest``,
    applied when batches are cut), so such a window is the slice as read: a
    buffered window of one chunk (the fast-start ramp's first) too.
    """
    if run[-1].stop - run[0].start != size:
        return False
    return all(keeps_all(piece) for piece in run)


def in_plan_order(run: Sequence[ChunkPiece], lo: int | None = None) -> bool:
    """Whether a whole run, as read, is also in the window's plan order (sequential).

    ``lo``: the sample at the window's plan position 0 (default the run's first).
    """
    lo = run[0].start if lo is None else lo
    return all(
        isinstance(p.dest, slice) and p.dest == slice(p.start - lo, p.stop - lo) for p in run
    )


def dest_start(piece: ChunkPiece) -> int:
    """Where a piece's rows start in plan order (-1 when they are not one slice there)."""
    dest = piece.dest
    return int(dest.start or 0) if isinstance(dest, slice) and dest.step in (None, 1) else -1


def keeps_all(piece: ChunkPiece) -> bool:
    """Whether the window keeps every row of the chunk, in chunk order."""
    return isinstance(piece.take, slice) and piece.take == slice(0, piece.rows)


def span(piece: ChunkPiece) -> tuple[int, int] | None:
    """The samples a piece keeps when they are one run of its chunk (else ``None``)."""
    take = piece.take
    if not isinstance(take, slice):
        return None
    first, stop, step = take.indices(piece.rows)
    if step != 1 or stop <= first:
        return None
    return piece.start + first, piece.start + stop


def direct_at_once(limit_rows: int, pieces: Sequence[ChunkPiece]) -> int:
    """Chunks ``store.direct`` decodes at once within ``limit_rows`` decoded rows in flight.

    Each holds its stored bytes and its decoded chunk (a scratch chunk, or
    the rows it fills), so two chunks' worth each (at least one at once).
    """
    return max(1, limit_rows // (2 * max(piece.rows for piece in pieces)))


def direct_items(
    pieces: Sequence[ChunkPiece],
) -> list[tuple[tuple[int, int], np.ndarray | None]] | None:
    """What ``store.direct`` reads for each piece: its span, and the rows it keeps.

    A piece that keeps one run of its chunk's rows is that run (``None``:
    every row of it); any other keeps the rows of ``take`` from its chunk's
    rows, gathered in that order.  ``None`` if a piece keeps no row.
    """
    items: list[tuple[tuple[int, int], np.ndarray | None]] = []
    for piece in pieces:
        run = span(piece)
        if run is not None:
            items.append((run, None))
            continue
        take = piece.take
        rows = np.arange(piece.rows)[take] if isinstance(take, slice) else np.asarray(take)
        if not len(rows):
            return None
        items.append(((piece.start, piece.stop), rows.astype(np.intp, copy=False)))
    return items


def direct_targets(
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
        targets.append(out[at : at + taken(piece)])
        at += taken(piece)
    return spans, takes, targets
