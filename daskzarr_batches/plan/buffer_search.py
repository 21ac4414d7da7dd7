"""The search behind ``shuffle_buffer_size="auto"``: a buffered shuffle's figures by buffer.

:func:`buffer_entropy` estimates the neighbour entropy of a buffered shuffle
from a sample of its windows (the mean over epochs, cached), :func:`pair_bins`
sums the differences of pairs of ranges in closed form
(``EpochPlan.expected_entropy``), and :func:`smallest_buffer` finds the
smallest buffer of whole units whose epoch meets a target (from the
estimate's crossing, bracketed and bisected on the epoch's own figure).  The
targets' defaults live here.  Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import ArgumentValueError
from .exact_figures import ENTROPY_BINS, _bins, _entropy, exact_entropy

__all__ = [
    "AUTO_EXACT_SAMPLES",
    "AUTO_EXPECTED_MARGIN",
    "DEFAULT_SHUFFLE_QUALITY",
    "buffer_entropy",
    "pair_bins",
    "smallest_buffer",
]


#: ``shuffle_quality`` of ``shuffle_buffer_size="auto"``: the fraction of an exact
#: shuffle's batch mixing (:attr:`ShuffleQuality.mixing`) the buffer must reach.
#: Measured on scikit-learn's digits, training rows sorted by label, chunks of 128,
#: batch 32, an MLP for 8 epochs, 3 seeds (``python -m benchmarks --only
#: quality-training``): buffers of mixing 0.82 trained 1.5 points below the exact
#: shuffle, of 0.88 within 0.4 points; 0.85 is the first target between them.
DEFAULT_SHUFFLE_QUALITY = 0.85


#: Neighbour entropy at length: epochs of up to this many samples are best measured by
#: their planned figure (every row shuffle drawn: about 0.1 s per candidate buffer here), a
#: longer epoch to its figure given its own windows with the rows of each window
#: shuffled in expectation (``EpochPlan.expected_entropy``: milliseconds at any
#: length) less ``AUTO_EXPECTED_MARGIN`` (measured from 1e7 to 1e8 samples, chunks of
#: 4,096 to 65,536 rows, buffers of 2 to 30 chunks: within 7e-5 of the planned figure).
AUTO_EXACT_SAMPLES = 2**23


AUTO_EXPECTED_MARGIN = 0.0005


#: Neighbour differences :func:`buffer_entropy` draws per estimate, and the windows
#: they are drawn from.
ESTIMATE_DRAWS = 2**17


ESTIMATE_WINDOWS = 64


def pair_bins(
    a: npt.NDArray[np.int64],
    p: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
    q: npt.NDArray[np.int64],
    weight: npt.NDArray[np.float64],
    n: int,
) -> npt.NDArray[np.float64]:
    """The histogram (:data:`ENTROPY_BINS` bins over ``(-n, n)``) of ``x - y`` over pairs of ranges.

    Pair ``i`` counts every ``x`` in ``[a, a + p)`` and ``y`` in ``[b, b + q)``
    once, times ``weight[i]``, in closed form (the differences of two ranges
    form a trapezoid; its mass in a bin is a difference of the counts below
    the bin's edges), so the cost is per pair and bin touched, not per row.
    """
    a, p, b, q = (np.asarray(v, dtype=np.int64) for v in (a, p, b, q))
    weight = np.asarray(weight, dtype=np.float64)
    lo_d, hi_d = a - b - q + 1, a - b + p - 1  # the differences' range
    first, last = _bins(lo_d, n), _bins(hi_d, n)
    one = first == last  # most pairs: the whole trapezoid in one bin
    hist = np.zeros(ENTROPY_BINS, dtype=np.float64)
    hist += np.bincount(first[one], weights=(p * q * weight)[one], minlength=ENTROPY_BINS)
    if one.all():
        return hist
    a, p, b, q, weight, first, last = (v[~one] for v in (a, p, b, q, weight, first, last))
    span = last - first + 1
    pair = np.repeat(np.arange(len(a)), span)
    within = np.arange(len(pair)) - np.repeat(np.cumsum(span) - span, span)
    bin_ = first[pair] + within
    edges = -((-2 * n * np.arange(ENTROPY_BINS + 1)) // ENTROPY_BINS) - n  # first d of bin
    edges[0], edges[-1] = np.iinfo(np.int64).min // 4, np.iinfo(np.int64).max // 4
    pa, pp, pb, pq = a[pair], p[pair], b[pair], q[pair]

    def below(t: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        # pairs with x - y <= t: sum over y of clip(t - a + b + v + 1, 0, p), v < q
        t = np.clip(t, pa - pb - pq, pa - pb + pp)  # saturated beyond the trapezoid
        s = (t - pa + pb + 1).astype(np.float64)
        fp, fq = pp.astype(np.float64), pq.astype(np.float64)

        def upto(z: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:  # sum clip(w,0,p), w<=z
            z = np.maximum(z, 0.0)
            low = np.minimum(z, fp)
            return low * (low + 1) / 2 + np.maximum(z - fp, 0.0) * fp

        return upto(s + fq - 1) - upto(s - 1)

    mass = below(edges[bin_ + 1] - 1) - below(edges[bin_] - 1)
    hist += np.bincount(bin_, weights=mass * weight[pair], minlength=ENTROPY_BINS)
    return hist


def buffer_entropy(units: npt.NDArray[np.int64], window_rows: int, seed: int = 0) -> float:
    """Estimated neighbour entropy of a buffered shuffle, as a fraction of an exact one's.

    The plan permutes the units (``units``: their offsets, ``[0, ..., n]``),
    groups consecutive ones into windows of at least ``window_rows`` samples
    and permutes each window's rows, so neighbours are two samples drawn from
    one window, and an epoch's histogram mixes its windows'.  This simulates
    epochs of seeded unit permutations, drawing about ``ESTIMATE_DRAWS /
    ESTIMATE_WINDOWS`` pairs per window (in proportion to its rows) from
    ``ESTIMATE_WINDOWS`` windows in all, and returns the mean entropy of an
    epoch's differences (Miller-Madow corrected for the few draws) over
    :func:`exact_entropy`.  An epoch of more windows
    is cut at ``ESTIMATE_WINDOWS``: its mixture then covers fewer bins than
    the whole epoch's, so the estimate errs low (a larger buffer).  A few
    milliseconds whatever ``n`` (the permutation of the units is the largest
    cost).  Cached by the units and the window.
    """
    units = np.ascontiguousarray(units, dtype=np.int64)
    digest = f"{len(units)}:{hash(units.tobytes())}"
    return _buffer_entropy(digest, units, int(window_rows), int(seed))


_ESTIMATES: dict[tuple[str, int, int], float] = {}


def _buffer_entropy(
    digest: str, units: npt.NDArray[np.int64], window_rows: int, seed: int
) -> float:
    key = (digest, window_rows, seed)  # within this process
    if key in _ESTIMATES:
        return _ESTIMATES[key]
    units = np.asarray(units, dtype=np.int64)
    n = int(units[-1] - units[0])
    sizes = np.diff(units)
    rng = np.random.default_rng(seed)
    per_window = max(ESTIMATE_DRAWS // ESTIMATE_WINDOWS, 2)
    epochs: list[float] = []
    windows = 0
    while windows < ESTIMATE_WINDOWS and len(sizes):
        # one epoch's windows (at most ESTIMATE_WINDOWS of them): its figure is the
        # entropy of their mixture, as the epoch's own histogram mixes its windows
        counts = np.zeros(ENTROPY_BINS, dtype=np.int64)
        order = rng.permutation(len(sizes))
        ends = np.cumsum(sizes[order])
        start = done = 0  # first unit (in order) and rows before the window
        while start < len(order) and windows < ESTIMATE_WINDOWS:
            stop = min(int(np.searchsorted(ends, done + window_rows, side="left")) + 1, len(order))
            chosen = order[start:stop]
            at = np.concatenate([[0], np.cumsum(sizes[chosen])])
            rows = int(at[-1])
            draws = max(2, round(per_window * min(rows / max(window_rows, 1), 4.0)))
            if rows >= 2:
                a = rng.integers(0, rows, draws)
                b = rng.integers(0, rows - 1, draws)
                b += b >= a  # two distinct rows of the window
                starts = units[chosen]
                pa = np.searchsorted(at, a, "right") - 1
                pb = np.searchsorted(at, b, "right") - 1
                diffs = (starts[pa] + a - at[pa]) - (starts[pb] + b - at[pb])
                counts += np.bincount(_bins(diffs, n), minlength=ENTROPY_BINS)
            done = int(ends[stop - 1])
            start = stop
            windows += 1
        # Miller-Madow: the plug-in entropy of N draws is (bins - 1) / (2 N ln 2) bits
        # low; an epoch's own histogram has n - 1 differences, far more than drawn here
        drawn = int(counts.sum())
        bias = (np.count_nonzero(counts) - 1) / (2 * drawn * math.log(2)) if drawn else 0.0
        epochs.append(_entropy(counts) + bias)
    exact = exact_entropy(n)
    figure = min(float(np.mean(epochs)) / exact, 1.0) if exact and epochs else 1.0
    if len(_ESTIMATES) > 4096:
        _ESTIMATES.clear()
    _ESTIMATES[key] = figure
    return figure


def smallest_buffer(
    units_for: Callable[[int], npt.NDArray[np.int64]],
    unit_rows: int,
    most_rows: int,
    target: float,
    n: int,
    planned: Callable[[int], float] | None = None,
    estimate_rows: Callable[[int], float] | None = None,
    largest: bool = False,
) -> tuple[int, float]:
    """The smallest buffer of whole units whose epoch meets ``target``.

    Buffers of ``k * unit_rows`` samples, ``k = 1, 2, ...`` (``unit_rows``: the
    largest unit, so a window holds at least ``k`` units) up to ``most_rows``
    (what the memory budget holds) or the whole dataset.  ``units_for(rows)``:
    the plan's units for a buffer of ``rows`` (shards become units once they
    fit).  ``planned(rows)``: the neighbour-entropy fraction of the epoch
    itself with that buffer (``EpochPlan.entropy``, this ``(seed, epoch)``),
    the figure the answer is held to.

    The search starts where :func:`buffer_entropy` (an estimate of the mean
    over epochs, a few milliseconds) crosses ``target`` (doubling from one
    unit, then bisecting), then brackets and bisects on ``planned``: the
    answer ``k`` meets the target by ``planned`` and ``k - 1`` does not (the
    figure of one seed is nondecreasing in ``k`` but for noise, so the first
    crossing is taken).  A buffer of the whole
    dataset meets any target: one window, a uniform permutation, is the
    exact shuffle the figures are fractions of (on small datasets its own
    figure is below 1 by the plug-in bias of its few differences).  Without ``planned`` the
    estimate is the figure (every seed gets the same size).

    ``estimate_rows(rows)``: the figure the search starts from (default
    :func:`buffer_entropy` of the units, the neighbour entropy); a cheap
    figure (``EpochPlan.expected_mixing``) is its own estimate.
    ``largest``: when no buffer within ``most_rows`` meets the target, the
    largest one is the answer (its figure below ``target`` says so) instead
    of an error.

    Returns
    -------
    (rows, figure)
        The buffer in samples and its figure (``planned``, else the estimate).

    Raises
    ------
    ArgumentValueError
        ``target`` is not in ``(0, 1]``, no unit fits ``most_rows``, or (not
        ``largest``) no buffer within ``most_rows`` meets it.
    """
    if not 0 < target <= 1:
        raise ArgumentValueError(f"shuffle_quality must be in (0, 1], got {target!r}")
    unit_rows = max(int(unit_rows), 1)
    whole = max(math.ceil(n / unit_rows), 1)
    top = min(whole, most_rows // unit_rows)

    def estimate(k: int) -> float:
        rows = k * unit_rows
        if estimate_rows is not None:
            return estimate_rows(rows)
        return buffer_entropy(units_for(rows), rows)

    figures: dict[int, float] = {}

    def figure(k: int) -> float:
        if k not in figures:
            figures[k] = planned(k * unit_rows) if planned is not None else estimate(k)
        return figures[k]

    def refuse(best: float) -> ArgumentValueError:
        whole_note = (
            ""
            if top >= whole
            else f" (the whole dataset in one buffer reaches {figure(whole):.3f})"
        )
        return ArgumentValueError(
            f"shuffle_buffer_size='auto': no buffer within the memory budget reaches "
            f"shuffle_quality={target}: the largest, {max(top, 0)} units of {unit_rows} "
            f"samples, reaches {best:.3f}{whole_note}; raise memory_budget, lower "
            "shuffle_quality, or use the exact shuffle"
        )

    def meets(k: int) -> bool:
        # one buffer of the whole dataset is a uniform permutation: the reference itself
        return k >= whole or figure(k) >= target

    if top < 1:
        raise refuse(0.0)
    # where the estimate crosses the target (top if it never does): the start, found
    # by doubling from one unit (buffers are usually a few units of many) and bisecting
    lo, hi = 0, 1  # estimate(lo) < target (k = 0: no buffer)
    while hi < top and estimate(hi) < target:
        lo, hi = hi, min(2 * hi, top)
    while hi - lo > 1 and estimate(hi) >= target:  # (top may not meet it either)
        mid = (lo + hi) // 2
        if estimate(mid) >= target:
            hi = mid
        else:
            lo = mid
    start = hi
    # bracket the crossing of the figure itself: not meets(lo), meets(hi)
    if meets(start):
        hi, step = start, 1
        lo = max(start - step, 0)
        while lo > 0 and meets(lo):
            hi, step = lo, step * 2
            lo = max(hi - step, 0)
    else:
        lo, step = start, 1
        hi = min(start + step, top)
        while not meets(hi):
            if hi >= top:
                if largest:
                    return top * unit_rows, figure(top)
                raise refuse(figure(top))
            lo, step = hi, step * 2
            hi = min(lo + step, top)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi * unit_rows, figure(hi)
