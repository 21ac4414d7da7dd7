"""The exact shuffle's figures in closed form: what a uniform permutation scores.

The references the shuffle quality figures (``plan.quality``) are fractions
of: the neighbour-difference histogram's bins (:data:`ENTROPY_BINS`) and its
entropy, an exact shuffle's neighbour entropy, displacement, per-batch source
entropy and per-batch mixing bits (binomial marginals of a uniformly drawn
batch), and its expected label distance.  Pure numpy.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

__all__ = [
    "ENTROPY_BINS",
    "exact_displacement",
    "exact_entropy",
    "exact_label_distance",
    "exact_mixing_bits",
    "exact_source_entropy",
    "expected_batch_bits",
]


#: Bins of the neighbour-difference histogram (over ``(-n, n)``).
ENTROPY_BINS = 256


def _bins(diffs: npt.NDArray[np.int64], n: int) -> npt.NDArray[np.int64]:
    """The histogram bin of each difference (``-n < d < n``): ``(d + n) * bins // 2n``."""
    return np.clip(((diffs + n) * ENTROPY_BINS) // (2 * n), 0, ENTROPY_BINS - 1)


def _entropy(counts: npt.NDArray[np.int64] | npt.NDArray[np.float64]) -> float:
    total = counts.sum()
    if total <= 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


@functools.lru_cache(maxsize=64)
def exact_entropy(n: int) -> float:
    """Neighbour entropy (bits) of a uniform permutation of ``n`` samples, in the limit.

    Two neighbours of a uniform permutation differ by ``d != 0`` with
    probability ``(n - |d|) / (n (n - 1))``; the bins sum that in closed form.
    An observed order of ``m`` differences scores about ``(bins - 1) / (2 m
    ln 2)`` bits less (the plug-in bias: 0.001 bits for ``m = 2e5``).
    """
    if n < 2:
        return 0.0

    def below(x: int) -> int:  # sum of (n - |d|) for d in [-(n - 1), x]
        if x < -(n - 1):
            return 0
        if x < 0:
            return (n + x) * (n + x + 1) // 2
        x = min(x, n - 1)
        return n * (n - 1) // 2 + (x + 1) * n - x * (x + 1) // 2

    mass = []
    for b in range(ENTROPY_BINS):
        lo = -((-2 * n * b) // ENTROPY_BINS) - n  # first d of bin b
        hi = -((-2 * n * (b + 1)) // ENTROPY_BINS) - n - 1
        total = below(hi) - below(lo - 1)
        if lo <= 0 <= hi:
            total -= n  # d = 0 never happens in a permutation
        mass.append(total)
    return _entropy(np.asarray(mass, dtype=np.float64))


def exact_displacement(n: int) -> float:
    """Mean ``|sigma(i) - i|`` of a uniform permutation of ``n``: ``(n**2 - 1) / (3 n)``."""
    return (n * n - 1) / (3 * n) if n > 0 else 0.0


@functools.lru_cache(maxsize=64)
def _exact_source_entropy(sizes: tuple[int, ...], batch: int) -> float:
    total = sum(sizes)
    p = [s / total for s in sizes if s > 0]
    if len(p) <= 1 or batch < 1:
        return 0.0
    batch = min(batch, total)  # a batch holds at most every sample
    values, repeats = np.unique(np.round(np.asarray(p), 12), return_counts=True)
    pairs = zip(values.tolist(), repeats.tolist(), strict=True)
    return float(sum(r * _share_bits(v, batch) for v, r in pairs))


def exact_source_entropy(sizes: tuple[int, ...], batch: int) -> float:
    """Expected bits of a batch's members under an exact shuffle.

    A batch of ``batch`` samples drawn uniformly holds about ``Binomial(batch,
    p_m)`` samples of member ``m`` (``p_m``: its share of the samples); this is
    the expectation of the plug-in entropy ``-sum (c_m / batch) log2(c_m /
    batch)`` under those marginals.
    """
    return _exact_source_entropy(tuple(int(s) for s in sizes), int(batch))


@functools.lru_cache(maxsize=64)
def _exact_mixing_bits(sizes: tuple[int, ...], batch: int) -> float:
    """:func:`exact_mixing_bits` of strata of these sizes (equal ones computed once)."""
    values, repeats = np.unique(np.asarray(sizes, dtype=np.int64), return_counts=True)
    total = int(values @ repeats) if len(values) else 0
    if total <= 0 or batch < 1:
        return 0.0
    batch = min(batch, total)  # a batch holds at most every sample
    pairs = zip(values.tolist(), repeats.tolist(), strict=True)
    return float(sum(r * _share_bits(v / total, batch) for v, r in pairs))


@functools.lru_cache(maxsize=4096)
def _share_bits(p: float, batch: int) -> float:
    """``E[-(c / batch) log2(c / batch)]`` for ``c ~ Binomial(batch, p)``."""
    if p <= 0 or p >= 1 or batch < 1:
        return 0.0
    if batch * p * (1 - p) > LARGE_VARIANCE:  # the second-order expansion, exact to ~1e-15
        return -p * math.log2(p) - (1 - p) / (2 * batch * math.log(2))
    x, pmf = _binomial_pmf(p, batch)
    share = x / batch
    terms = np.zeros(len(x))
    np.multiply(-share, np.log2(share, where=x > 0, out=np.ones(len(x))), out=terms, where=x > 0)
    return float((pmf * terms).sum())


#: A binomial's variance above which its figures are taken from their expansion in
#: ``1 / batch`` (normal limit) instead of a sum over its pmf (2**24: 4,096 standard
#: deviations of 1 count; the next term is ~1e-15 of the figure).
LARGE_VARIANCE = 2**24


#: Standard deviations either side of a binomial's mean its pmf is summed over: the mass
#: beyond is below 1e-40 (a Chernoff bound), so sums cost ``O(sqrt(batch))`` terms, not
#: ``O(batch)``: a figure's cost does not grow with ``batch_size``.
PMF_SPREAD = 14


def _binomial_pmf(p: float, batch: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """``k`` and ``P(c = k)`` for ``c ~ Binomial(batch, p)`` (0 < p < 1), where it is not ~0.

    ``k`` runs over ``mean +- PMF_SPREAD`` standard deviations (and 32 more),
    clipped to ``[0, batch]``; each ``log P`` from ``lgamma`` at the first
    ``k`` and the ratios of neighbours after it (vectorised), normalised.
    """
    mean, spread = batch * p, math.sqrt(batch * p * (1 - p))
    lo = max(int(mean - PMF_SPREAD * spread) - 32, 0)
    hi = min(int(mean + PMF_SPREAD * spread) + 32, batch)
    x = np.arange(lo, hi + 1, dtype=np.int64)
    first = (
        math.lgamma(batch + 1) - math.lgamma(lo + 1) - math.lgamma(batch - lo + 1)
        + lo * math.log(p) + (batch - lo) * math.log1p(-p)
    )  # fmt: skip
    k = x[:-1].astype(np.float64)
    steps = np.log((batch - k) / (k + 1)) + (math.log(p) - math.log1p(-p))
    logs = np.concatenate([[0.0], np.cumsum(steps)])
    pmf = np.exp(first + logs)
    # the mass outside is below 1e-40: normalised, the rounding of lgamma's large
    # values (1e-7 of log P at batch 1e8) cancels
    return x, pmf / pmf.sum()


def expected_batch_bits(shares: npt.ArrayLike, batch: int) -> npt.NDArray[np.float64]:
    """Each stratum's term of a batch's expected bits: ``share`` the stratum's share.

    The sum over a window's strata is the expected plug-in entropy of a
    batch of ``batch`` samples drawn from it (binomial marginals, as
    :func:`exact_source_entropy`); equal shares (equal chunks) are computed
    once.
    """
    shares = np.asarray(shares, dtype=np.float64)
    values, where = np.unique(np.round(shares, 12), return_inverse=True)
    terms = np.asarray([_share_bits(float(v), int(batch)) for v in values.tolist()])
    return terms[where.ravel()] if len(shares) else np.zeros(0)


def exact_mixing_bits(strata: npt.ArrayLike, batch: int) -> float:
    """Expected bits of a batch's strata under an exact shuffle.

    ``strata``: the strata bounds ``[0, ..., n]`` (the epoch's stored chunks).
    A batch of ``batch`` samples drawn uniformly holds about ``Binomial(batch,
    p_s)`` samples of stratum ``s`` (``p_s``: its share of the samples); the
    expectation of the plug-in entropy under those marginals, as
    :func:`exact_source_entropy` (drawn without replacement, the counts vary
    a little less, so an exact shuffle scores a hair above: the figure is
    clipped at 1).  Strata of equal size are computed once, so many chunks
    cost what their distinct sizes cost.
    """
    sizes = np.diff(np.asarray(strata, dtype=np.int64))
    return _exact_mixing_bits(tuple(sizes.tolist()), int(batch))


@functools.lru_cache(maxsize=256)
def _binomial_abs_dev(p: float, batch: int) -> float:
    """``E|c / batch - p|`` for ``c ~ Binomial(batch, p)``."""
    if p <= 0 or p >= 1 or batch < 1:
        return 0.0
    if batch * p * (1 - p) > LARGE_VARIANCE:  # the normal limit, sqrt(2 var / pi) / batch
        return math.sqrt(2 * p * (1 - p) / (math.pi * batch))
    x, pmf = _binomial_pmf(p, batch)
    return float((pmf * np.abs(x / batch - p)).sum())


def exact_label_distance(shares: npt.ArrayLike, batch: int) -> float:
    """Expected total-variation distance of a uniformly drawn batch's labels from ``shares``.

    ``0.5 * sum_c E|c_c / batch - q_c|`` with binomial counts (an exact
    shuffle's batch; drawn without replacement it is a little closer).
    """
    q = np.asarray(shares, dtype=np.float64)
    return 0.5 * sum(_binomial_abs_dev(round(float(v), 12), int(batch)) for v in q.tolist())
