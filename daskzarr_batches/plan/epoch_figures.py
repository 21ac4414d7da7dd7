"""An epoch plan's figures, computed from its windows without reading data.

What :class:`~daskzarr_batches.plan.epoch.EpochPlan` tells about itself beside
its order: :func:`summary` (per window: samples, batches, chunks, bytes decoded
and held, and :func:`store_reads`, the shards and store requests a window
makes, an estimate), and a buffered epoch's neighbour entropy and batch mixing
in expectation given its own windows (:func:`expected_entropy`,
:func:`expected_mixing`: what ``shuffle_buffer_size="auto"`` holds a candidate
buffer to).  The plan's methods of the same names call these.  Pure numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from .batching import batches_completed
from .buffer_search import pair_bins
from .exact_figures import (
    ENTROPY_BINS,
    _bins,
    _entropy,
    exact_entropy,
    exact_mixing_bits,
    expected_batch_bits,
)
from .shards import shard_requests
from .summary import PlanSummary, WindowSummary
from .windows import ChunkPiece, Window

if TYPE_CHECKING:
    from .epoch import EpochPlan

__all__ = ["expected_entropy", "expected_mixing", "store_reads", "summary"]


#: An exact window of ``m`` of ``n`` samples misses a chunk of ``r`` rows with
#: probability at most ``exp(-m r / n)``; at or past this ``m r / n`` (a miss below
#: ``exp(-24)``, 4e-11, per chunk and window) the summary counts every chunk read
#: without drawing the window's ids.
DENSE_ROWS = 24


#: An exact epoch's quality figures are taken over its first this many positions when
#: it is longer (of a uniform permutation, a uniform sample of its neighbours and
#: batches): for batches of 256, the mixing is a mean over 1,024 batches (a uniform
#: batch's bits over 153 to 15,259 strata vary by under 1%, so the mean is within
#: about 1e-3 of the epoch's), the neighbour entropy's plug-in bias on 2**18
#: differences is 7e-4 bits (1e-4 of the figure), the displacement's standard
#: error 0.1%.
EXACT_QUALITY_SAMPLES = 2**18


def summary(plan: EpochPlan, task_count: Callable[[Window], int] | None = None) -> PlanSummary:
    """:meth:`EpochPlan.summary`."""
    if plan._exact_alone():
        return _exact_summary(plan, task_count)
    row_bytes = plan.row_bytes or (0,) * len(plan.offsets)
    rows = []
    quality = plan.quality_counter()
    for window in plan.windows():
        quality.add(window.samples, range(window.position, window.position + window.size))
        batches = batches_completed(window.position, window.size, plan.batch_size, plan.n_used)
        chunks = tuple(tuple(piece.chunk for piece in pieces) for pieces in window.pieces)
        decoded = sum(
            sum(piece.rows for piece in pieces) * size
            for pieces, size in zip(window.pieces, row_bytes, strict=True)
        )
        shards, requests = store_reads(plan, window)
        rows.append(
            WindowSummary(
                index=window.index,
                samples=window.size,
                batches=batches,
                chunks=chunks,
                bytes_decoded=decoded,
                bytes_held=window.size * sum(row_bytes),
                tasks=None if task_count is None else task_count(window),
                shards=shards,
                requests=requests,
            )
        )
    return PlanSummary(
        windows=tuple(rows),
        shuffle=plan.shuffle,
        batch_size=plan.batch_size,
        n_samples=plan.n_samples,
        n_batches=plan.n_batches,
        bytes_yielded=plan.n_used * sum(row_bytes),
        dataset_bytes=plan.n_samples * sum(row_bytes),
        quality=quality.quality(),
    )


def _exact_summary(
    plan: EpochPlan, task_count: Callable[[Window], int] | None = None
) -> PlanSummary:
    """:func:`summary` of an exact order in O(windows x chunks), not O(samples).

    A window whose every chunk expects at least :data:`DENSE_ROWS` of its
    samples reads every chunk (but with probability below ``exp(-24)`` per
    chunk), so it is counted so, its ids never drawn; a sparser window's ids
    are drawn (O(window)) and counted exactly.  The quality figures are of the
    first :data:`EXACT_QUALITY_SAMPLES` positions (see there).
    """
    row_bytes = plan.row_bytes or (0,) * len(plan.offsets)
    smallest = min((int(np.diff(off).min(initial=plan.n_samples)) for off in plan.offsets),
                   default=plan.n_samples)  # fmt: skip
    whole = tuple(tuple(int(c) for c in np.flatnonzero(np.diff(off) > 0)) for off in plan.offsets)
    dense_reads: tuple[int, int] | None = None
    dense_tasks: int | None = None
    rows = []
    step = max(plan.window_rows, 1)
    ramp = np.cumsum(plan._exact_ramp())
    for lo, hi in plan._exact_bounds():
        index = lo // step + len(ramp) - 1 if lo >= step else int((ramp <= lo).sum())
        size = hi - lo
        if size * smallest >= DENSE_ROWS * max(plan.n_samples, 1):
            if dense_reads is None:
                window = _whole_chunks(plan, index, lo)
                dense_reads = store_reads(plan, window)
                dense_tasks = None if task_count is None else task_count(window)
            chunks, (shards, requests), tasks = whole, dense_reads, dense_tasks
            decoded = sum(
                int(off[-1] - off[0]) * b for off, b in zip(plan.offsets, row_bytes, strict=True)
            )
        else:
            window = plan.part(next(plan._exact_windows(lo)), 0, size)
            chunks = tuple(tuple(piece.chunk for piece in pieces) for pieces in window.pieces)
            decoded = sum(
                sum(piece.rows for piece in pieces) * b
                for pieces, b in zip(window.pieces, row_bytes, strict=True)
            )
            shards, requests = store_reads(plan, window)
            tasks = None if task_count is None else task_count(window)
        rows.append(
            WindowSummary(
                index=index,
                samples=size,
                batches=batches_completed(lo, size, plan.batch_size, plan.n_used),
                chunks=chunks,
                bytes_decoded=decoded,
                bytes_held=size * sum(row_bytes),
                tasks=tasks,
                shards=shards,
                requests=requests,
            )
        )
    quality = plan.quality_counter()
    taken = min(plan.n_used, EXACT_QUALITY_SAMPLES)
    quality.add(plan._exact_ids(0, taken), range(taken))
    return PlanSummary(
        windows=tuple(rows),
        shuffle=plan.shuffle,
        batch_size=plan.batch_size,
        n_samples=plan.n_samples,
        n_batches=plan.n_batches,
        bytes_yielded=plan.n_used * sum(row_bytes),
        dataset_bytes=plan.n_samples * sum(row_bytes),
        quality=quality.quality(),
    )


def _whole_chunks(plan: EpochPlan, index: int, position: int) -> Window:
    """A window reading every chunk whole: what a dense exact window reads (its tasks)."""
    pieces = []
    for off in plan.offsets:
        mine = []
        for chunk in np.flatnonzero(np.diff(off) > 0).tolist():
            start, stop = int(off[chunk]), int(off[chunk + 1])
            mine.append(ChunkPiece(chunk, start, stop, slice(0, stop - start), slice(start, stop)))
        pieces.append(tuple(mine))
    return Window(index, position, range(plan.n_samples), tuple(pieces))


def store_reads(plan: EpochPlan, window: Window) -> tuple[int, int]:
    """Shards a window touches and the store requests it makes (an estimate, no I/O).

    Per shard: one request when it is read whole, else the index and the
    coalesced runs of needed chunks (:func:`shard_requests`); an unsharded
    chunk is one request per stored object.  Arrays not in a store count 0.
    """
    shards = requests = 0
    for pieces, offsets, layout in zip(window.pieces, plan.offsets, plan.shards, strict=False):
        if layout is None:
            continue
        total = len(offsets) - 1
        rows: dict[int, list[int]] = {}
        for piece in pieces:
            rows.setdefault(piece.chunk // layout.chunks, []).append(piece.chunk % layout.chunks)
        for row, needed in rows.items():
            existing = min(layout.chunks, total - row * layout.chunks)
            requests += shard_requests(sorted(needed), existing, layout)
            shards += layout.keys if layout.sharded else 0
    return shards, requests


def expected_entropy(plan: EpochPlan, most_pairs: int = 2**24) -> float | None:
    """:meth:`EpochPlan.expected_entropy`."""
    if plan.shuffle != "buffer" or plan.mix is not None or plan.n_used < 2:
        return None
    rng = plan.rng()
    order = rng.permutation(len(plan.units) - 1)
    groups = list(plan._unit_groups(order.tolist()))
    counts = np.asarray([len(group) for group in groups], dtype=np.int64)
    pairs = counts * counts
    pairs[1:] += counts[1:] * counts[:-1]  # each window's pairs, with the one before
    if int(pairs.sum()) > most_pairs:
        return None
    unit = np.concatenate([np.asarray(group, dtype=np.int64) for group in groups])
    starts, sizes = plan.units[:-1][unit], np.diff(plan.units)[unit]
    window = np.repeat(np.arange(len(groups)), counts)
    first = np.cumsum(counts) - counts  # each window's first unit in `unit`
    rows = np.bincount(window, weights=sizes, minlength=len(groups)).astype(np.int64)
    before = np.cumsum(rows) - rows
    used = np.clip(plan.n_used - before, 0, rows)  # rows each window delivers
    live = used > 0
    # within a window: (used - 1) pairs, each uniform over its R (R - 1) ordered pairs
    inner = np.where(rows > 1, (used - 1) / np.maximum(rows * (rows - 1), 1), 0.0)
    inner[~live] = 0.0
    # across windows: the first row of a window after the last of the one before
    cross = np.zeros(len(groups))
    cross[1:] = np.where(live[1:], 1.0 / (rows[1:] * rows[:-1]), 0.0)
    n = plan.quality_counter().n
    hist = np.zeros(ENTROPY_BINS)
    # windows in batches of about 2**20 pairs: bounded memory
    cuts = np.searchsorted(np.cumsum(pairs), np.arange(2**20, int(pairs.sum()), 2**20))
    bounds = np.unique(np.concatenate([[0], cuts + 1, [len(groups)]]).clip(0, len(groups)))
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        units_of = np.arange(first[lo], first[hi - 1] + counts[hi - 1])
        for other, weight in ((0, inner), (1, cross)):
            mine = units_of if other == 0 else units_of[window[units_of] >= 1]
            w_of = window[mine] - other  # the window each unit pairs with
            rep = counts[w_of]
            i = np.repeat(mine, rep)
            j = np.repeat(first[w_of], rep) + (
                np.arange(len(i)) - np.repeat(np.cumsum(rep) - rep, rep)
            )
            pair_weight = weight[window[i]]
            keep = pair_weight > 0
            i, j, pair_weight = i[keep], j[keep], pair_weight[keep]
            hist += pair_bins(starts[i], sizes[i], starts[j], sizes[j], pair_weight, n)
            if other == 0:  # a row never neighbours itself: d = 0 of a unit with itself
                same = i == j
                hist[int(_bins(np.zeros(1, dtype=np.int64), n)[0])] -= float(
                    (sizes[i[same]] * pair_weight[same]).sum()
                )
    exact = exact_entropy(n)
    return _entropy(np.maximum(hist, 0.0)) / exact if exact else 1.0


def expected_mixing(plan: EpochPlan) -> float | None:
    """:meth:`EpochPlan.expected_mixing`."""
    if plan.shuffle != "buffer" or plan.mix is not None:
        return None
    strata = plan.strata()
    exact = exact_mixing_bits(strata, plan.batch_size)
    if exact <= 0 or plan.n_used < 1:
        return 1.0
    order = plan.rng().permutation(len(plan.units) - 1)
    groups = list(plan._unit_groups(order.tolist()))
    counts = np.asarray([len(group) for group in groups], dtype=np.int64)
    unit = np.concatenate([np.asarray(group, dtype=np.int64) for group in groups])
    window = np.repeat(np.arange(len(groups)), counts)
    lo, hi = plan.units[:-1][unit], plan.units[1:][unit]
    # each unit's rows per stratum: a unit may span several strata
    first = np.searchsorted(strata, lo, side="right") - 1
    last = np.searchsorted(strata, hi - 1, side="right") - 1
    span = last - first + 1
    piece = np.repeat(np.arange(len(unit)), span)
    stratum = np.repeat(first, span) + (
        np.arange(len(piece)) - np.repeat(np.cumsum(span) - span, span)
    )
    rows_in = np.minimum(hi[piece], strata[stratum + 1]) - np.maximum(lo[piece], strata[stratum])
    rows = np.bincount(window, weights=hi - lo, minlength=len(groups))
    before = np.cumsum(rows) - rows
    used = np.clip(plan.n_used - before, 0, rows)
    share = rows_in / rows[window[piece]]
    bits = expected_batch_bits(share, plan.batch_size)
    per_window = np.bincount(window[piece], weights=bits, minlength=len(groups))
    weight = used / max(plan.batch_size, 1)
    mean = float((per_window * weight).sum() / weight.sum()) if weight.sum() else 0.0
    return min(mean / exact, 1.0)
