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
import numpy.typing as npt

from .batching import batches_completed
from .buffer_search import pair_bins
from .exact_figures import (
    ENTROPY_BINS,
    _bins,
    _entropy,
    exact_displacement,
    exact_entropy,
    exact_mixing_bits,
    expected_batch_bits,
)
from .quality import ShuffleQuality
from .shards import shard_requests
from .summary import PlanSummary, WindowSummary
from .windows import ChunkPiece, Window

if TYPE_CHECKING:
    from .epoch import EpochPlan

__all__ = ["expected_entropy", "expected_mixing", "planned_mixing", "store_reads", "summary"]


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


#: A buffered epoch of fewer samples is summarised by drawing its rows (a few tenths of a
#: second): its realised figures then differ from their expectation given the windows
#: by more than the plug-in noise; from here on they agree within it (``plan.quality``).
BUFFERED_ROWS_DRAWN = 2**20


def summary(plan: EpochPlan, task_count: Callable[[Window], int] | None = None) -> PlanSummary:
    """:meth:`EpochPlan.summary`."""
    if plan._exact_alone():
        return _exact_summary(plan, task_count)
    fast = _buffered_summary(plan, task_count)
    if fast is not None:
        return fast
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


def _buffered_summary(
    plan: EpochPlan, task_count: Callable[[Window], int] | None = None
) -> PlanSummary | None:
    """:func:`summary` of a buffered order in O(units), not O(samples); ``None``: not one.

    A buffered window reads the chunks of its units (whichever way its rows
    are shuffled), so its figures come from the unit permutation alone (the
    grouping ``expected_mixing`` uses); the quality is the epoch's given its
    windows, each window's row shuffle in expectation (``expected_entropy``,
    ``expected_mixing`` and the displacement's closed form, :func:`_displacement`).
    ``None`` (the summary then draws every row) for collections, mixtures,
    samplers, an epoch whose last window is cut (``drop_remainder``), one of
    fewer than :data:`BUFFERED_ROWS_DRAWN` samples or of too many unit pairs
    for ``expected_entropy``.
    """
    if plan.shuffle != "buffer" or plan.mix is not None or plan.sampler is not None:
        return None
    if plan.members or plan.n_used != plan.n_samples or plan.n_used < BUFFERED_ROWS_DRAWN:
        return None
    entropy = expected_entropy(plan)
    mixing = expected_mixing(plan)
    if entropy is None or mixing is None:
        return None
    row_bytes = plan.row_bytes or (0,) * len(plan.offsets)
    order = plan.rng().permutation(len(plan.units) - 1)
    rows, position, distance = [], 0, 0.0
    for index, group in enumerate(plan._unit_groups(order.tolist())):
        units = np.asarray(group, dtype=np.int64)
        lo, hi = plan.units[units], plan.units[units + 1]
        size = int((hi - lo).sum())
        chunks = tuple(_chunks_of(off, lo, hi) for off in plan.offsets)
        window = _whole_chunks(plan, index, position, chunks)
        shards, requests = store_reads(plan, window)
        decoded = sum(
            sum(piece.rows for piece in pieces) * b
            for pieces, b in zip(window.pieces, row_bytes, strict=True)
        )
        distance += float(_displacement(lo, hi - lo, position, size).sum())
        rows.append(
            WindowSummary(
                index=index,
                samples=size,
                batches=batches_completed(position, size, plan.batch_size, plan.n_used),
                chunks=chunks,
                bytes_decoded=decoded,
                bytes_held=size * sum(row_bytes),
                tasks=None if task_count is None else task_count(window),
                shards=shards,
                requests=requests,
            )
        )
        position += size
    n = plan.n_samples
    exact_bits, exact_mix = exact_entropy(n), exact_mixing_bits(plan.strata(), plan.batch_size)
    far = exact_displacement(n)
    quality = ShuffleQuality(
        samples=plan.n_used,
        entropy=entropy,
        entropy_bits=entropy * exact_bits,
        exact_entropy_bits=exact_bits,
        displacement=distance / plan.n_used / far if far else 1.0,
        mixing=mixing,
        mixing_bits=mixing * exact_mix,
        exact_mixing_bits=exact_mix,
    )
    return PlanSummary(
        windows=tuple(rows),
        shuffle=plan.shuffle,
        batch_size=plan.batch_size,
        n_samples=plan.n_samples,
        n_batches=plan.n_batches,
        bytes_yielded=plan.n_used * sum(row_bytes),
        dataset_bytes=plan.n_samples * sum(row_bytes),
        quality=quality,
    )


def _chunks_of(offsets: npt.NDArray[np.int64], lo: np.ndarray, hi: np.ndarray) -> tuple[int, ...]:
    """The non-empty chunks of ``offsets`` that ranges ``lo[i]:hi[i]`` overlap, ascending."""
    first = np.searchsorted(offsets, lo, side="right") - 1
    last = np.searchsorted(offsets, hi - 1, side="right") - 1
    span = last - first + 1
    chunk = np.repeat(first, span) + (
        np.arange(int(span.sum())) - np.repeat(np.cumsum(span) - span, span)
    )
    chunk = np.unique(chunk)
    return tuple(int(c) for c in chunk[offsets[chunk + 1] > offsets[chunk]])


def _sum_positive(t0: np.ndarray, count: np.ndarray, q: int | np.ndarray) -> np.ndarray:
    """``sum over t = t0 .. t0 + count - 1`` of ``sum_{j < q} max(t - j, 0)`` (float64).

    The inner sum is 0 for ``t <= 0``, ``t (t + 1) / 2`` for ``0 < t <= q`` and
    ``q t - q (q - 1) / 2`` past ``q``; each piece is summed in closed form.
    """
    t0, count = t0.astype(np.float64), count.astype(np.float64)
    q = np.asarray(q, dtype=np.float64)
    end = t0 + count - 1  # last t

    def sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # over integers a..b (empty if b < a): count, sum t, sum t**2
        k = np.maximum(b - a + 1, 0)
        s1 = np.where(k > 0, (a + b) * k / 2, 0.0)
        s2 = np.where(k > 0, (b * (b + 1) * (2 * b + 1) - (a - 1) * a * (2 * a - 1)) / 6, 0.0)
        return k, s1, s2

    _, s1, s2 = sums(np.maximum(t0, 1), np.minimum(end, q))
    k3, t3, _ = sums(np.maximum(t0, q + 1), end)
    return (s2 + s1) / 2 + q * t3 - k3 * q * (q - 1) / 2


def _displacement(start: np.ndarray, size: np.ndarray, position: int, rows: int) -> np.ndarray:
    """Each unit's expected ``sum |id - position|``: ids ``start + [0, size)``, positions uniform.

    A buffered window permutes its ``rows`` rows uniformly over positions
    ``position + [0, rows)``, so a row at id ``x`` lands at each with
    probability ``1 / rows``: the unit's sum is ``sum_x sum_y |x - y| / rows``,
    with ``|z| = 2 max(z, 0) - z`` summed in closed form (:func:`_sum_positive`).
    """
    start, size = start.astype(np.int64), size.astype(np.int64)
    t0 = start - position  # x - y for the first x and y
    above = _sum_positive(t0, size, rows)  # sum max(x - y, 0)
    total = size * rows * ((start + (size - 1) / 2) - (position + (rows - 1) / 2))
    return (2 * above - total) / rows


def _whole_chunks(
    plan: EpochPlan, index: int, position: int, chunks: tuple[tuple[int, ...], ...] | None = None
) -> Window:
    """A window reading chunks whole (default every chunk): what a window of them reads."""
    pieces = []
    for a, off in enumerate(plan.offsets):
        mine = []
        every = np.flatnonzero(np.diff(off) > 0).tolist() if chunks is None else chunks[a]
        for chunk in every:
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
    if plan.shuffle != "buffer":
        return None
    if plan.mix is not None:
        return planned_mixing(plan)
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
    bits = expected_batch_bits(share, min(plan.batch_size, plan.n_used))
    per_window = np.bincount(window[piece], weights=bits, minlength=len(groups))
    weight = used / max(plan.batch_size, 1)
    mean = float((per_window * weight).sum() / weight.sum()) if weight.sum() else 0.0
    return min(mean / exact, 1.0)


def planned_mixing(plan: EpochPlan) -> float:
    """The batch mixing of the epoch's planned ids, counted batch by batch (no pieces).

    ``summary().quality.mixing`` without the other figures or the windows'
    pieces: what a mixture's buffer is held to, whose windows deliver each
    source's own order (not a row shuffle of the window, which
    `expected_mixing` takes in expectation).  Per sample (the ids are there).
    """
    counter = plan.quality_counter()
    mixing = counter._mixing
    assert mixing is not None
    before = 0
    for samples in plan.window_samples():
        ids = np.asarray(samples, dtype=np.int64)
        if len(ids):
            mixing.add(ids, before)
            before += len(ids)
    return mixing.figure()[0]
