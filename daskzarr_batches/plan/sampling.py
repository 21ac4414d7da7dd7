"""Class-balanced and weighted sampling: an epoch order of sample ids drawn by class.

Pure numpy.  A :class:`ClassSampler` holds a label per sample and a weight
per class; each epoch it draws ``num_samples`` sample ids from the epoch's
generator (the plan's ``rng()``, seeded by ``(seed, epoch)``), so the order
is deterministic per ``(seed, epoch)`` like every other order, and the plan
reads its windows as it reads the exact shuffle's (a window's ids gathered
from the chunks that hold them; an id drawn twice is read once and copied).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ArgumentTypeError, ArgumentValueError
from .windows import IndexArray

__all__ = ["ClassSampler"]


@dataclass(frozen=True, eq=False)
class ClassSampler:
    """Draw each epoch's samples by class: class-balanced or weighted, with or without replacement.

    Give it to [`Loader`][daskzarr_batches.Loader] (``sampler=``) with ``shuffle=True``: each
    epoch is then ``num_samples`` sample ids drawn from the epoch's seeded
    generator, read like the exact shuffle's windows, with ranks, workers and
    ``state_dict`` / ``load_state_dict`` resume as for any other order.

    Parameters
    ----------
    labels : array_like of int or str
        One discrete label per sample (axis 0 of the loader's arrays), read
        once (a Zarr array is read whole: ``labels[:]``).
    weights : "balanced", mapping or sequence, default "balanced"
        Each class's share of the draws: ``"balanced"`` (every class alike),
        a mapping ``{label: weight}`` (classes not named get 0), or one weight
        per class in the order of ``classes`` (the sorted distinct labels).
        Weights are normalised; at least one must be positive.
    replacement : bool, default True
        With replacement, each draw picks a class by its weight and a sample
        of it uniformly (``numpy.random.Generator.choice``), so a rare class
        repeats.  Without, each class gives its share of ``num_samples``
        (largest remainders, each class at most its size) as distinct
        samples drawn uniformly within it, then the draws are shuffled.
    num_samples : int, optional
        Draws per epoch.  Default: the number of samples with replacement;
        without, the most draws whose shares every class can give (e.g. the
        smallest class times the number of classes when balanced).

    Attributes
    ----------
    classes : numpy.ndarray
        The distinct labels, sorted.
    shares : numpy.ndarray
        Each class's normalised weight, in the order of ``classes``.
    counts : numpy.ndarray
        Samples of each class.

    Notes
    -----
    The sampler holds per-sample state: 16 bytes per labelled sample for as
    long as it lives (each sample's class code and the ids grouped by class,
    int64), the labels themselves while they are read, and each epoch's draws
    whole, 8 bytes a draw (about 24 while drawn).  For 10**8 samples that is
    1.6 GB kept; the exact shuffle without a sampler holds nothing per sample.
    """

    labels: Any
    weights: Any = "balanced"
    replacement: bool = True
    num_samples: int | None = None
    classes: npt.NDArray[Any] = field(init=False, repr=False)
    shares: npt.NDArray[np.float64] = field(init=False, repr=False)
    counts: npt.NDArray[np.int64] = field(init=False, repr=False)
    _codes: IndexArray = field(init=False, repr=False)
    _members: IndexArray = field(init=False, repr=False)  # ids grouped by class
    _starts: IndexArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        labels = self.labels[:] if hasattr(self.labels, "chunks") else self.labels
        labels = np.asarray(labels)
        if labels.ndim != 1 or len(labels) == 0:
            raise ArgumentValueError(
                f"labels must be one non-empty 1-D array of discrete labels, got shape "
                f"{labels.shape}"
            )
        if labels.dtype.kind == "f":
            raise ArgumentTypeError(
                f"labels must be discrete (integers, strings), got dtype {labels.dtype}"
            )
        classes, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
        shares = _shares(self.weights, classes)
        if not isinstance(self.replacement, bool | np.bool_):
            raise ArgumentTypeError(f"replacement must be a bool, got {self.replacement!r}")
        put("replacement", bool(self.replacement))
        put("classes", classes)
        put("shares", shares)
        put("counts", counts.astype(np.int64))
        put("_codes", codes.ravel().astype(np.int64))
        put("_members", np.argsort(codes.ravel(), kind="stable").astype(np.int64))
        put("_starts", np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        if self.num_samples is None:
            if self.replacement:
                put("num_samples", len(labels))
            else:
                live = shares > 0
                put("num_samples", int(np.floor(np.min(counts[live] / shares[live]) + 1e-9)))
        else:
            if isinstance(self.num_samples, bool) or not isinstance(
                self.num_samples, int | np.integer
            ):
                raise ArgumentTypeError(f"num_samples must be an int, got {self.num_samples!r}")
            if self.num_samples < 1:
                raise ArgumentValueError(f"num_samples must be positive, got {self.num_samples}")
            put("num_samples", int(self.num_samples))
            if not self.replacement and self.num_samples > int(counts[shares > 0].sum()):
                raise ArgumentValueError(
                    f"num_samples={self.num_samples} without replacement exceeds the "
                    f"{int(counts[shares > 0].sum())} samples of the weighted classes"
                )

    @property
    def n_ids(self) -> int:
        """Samples the ids are drawn from (the length of the labels)."""
        return len(self._codes)

    @property
    def draws(self) -> int:
        """Draws per epoch (``num_samples``, resolved)."""
        assert self.num_samples is not None
        return int(self.num_samples)

    def class_counts(self) -> npt.NDArray[np.int64]:
        """Draws of each class per epoch without replacement (in the order of ``classes``)."""
        return _apportion(self.draws, self.shares, self.counts)

    def order(self, rng: np.random.Generator) -> IndexArray:
        """One epoch's sample ids (``num_samples`` of them), drawn from ``rng``."""
        m = self.draws
        if self.replacement:
            classes = rng.choice(len(self.classes), size=m, p=self.shares)
            within = np.floor(rng.random(m) * self.counts[classes]).astype(np.int64)
            within = np.minimum(within, self.counts[classes] - 1)
            return self._members[self._starts[classes] + within]
        taken = []
        for k, count in enumerate(self.class_counts().tolist()):
            if count:
                lo, hi = int(self._starts[k]), int(self._starts[k + 1])
                taken.append(self._members[lo:hi][rng.permutation(hi - lo)[:count]])
        ids = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
        return ids[rng.permutation(len(ids))]

    @property
    def identity(self) -> str:
        """What fixes the sampler's draws, in a few characters (a ``Loader`` state's check).

        The kind, replacement, draws, and a digest of the labels' classes per
        sample and the shares.
        """
        kind = "with" if self.replacement else "without"
        digest = _digest(self._codes) ^ _digest(np.ascontiguousarray(self.shares).view(np.uint64))
        return f"ClassSampler({kind} replacement, {self.draws} draws, {digest:016x})"

    def label_codes(self, ids: npt.ArrayLike) -> IndexArray:
        """The class index (into ``classes``) of each sample id."""
        return self._codes[np.asarray(ids, dtype=np.int64)]

    def __repr__(self) -> str:
        weights = self.weights if isinstance(self.weights, str) else "custom"
        return (
            f"ClassSampler({len(self.classes)} classes, weights={weights!r}, "
            f"replacement={self.replacement}, num_samples={self.num_samples})"
        )


def _shares(weights: object, classes: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    if isinstance(weights, str):
        if weights != "balanced":
            raise ArgumentValueError(
                f"weights must be 'balanced', a mapping or a sequence, got {weights!r}"
            )
        return np.full(len(classes), 1.0 / len(classes))
    if isinstance(weights, Mapping):
        known = set(classes.tolist())
        unknown = [k for k in weights if k not in known]
        if unknown:
            raise ArgumentValueError(f"weights name classes not in the labels: {unknown!r}")
        raw = np.asarray([float(weights.get(c, 0.0)) for c in classes.tolist()])
    elif isinstance(weights, Sequence | np.ndarray):
        raw = np.asarray(weights, dtype=np.float64)
        if raw.shape != (len(classes),):
            raise ArgumentValueError(
                f"weights has {raw.size} values for {len(classes)} classes {classes.tolist()!r}"
            )
    else:
        raise ArgumentTypeError(
            f"weights must be 'balanced', a mapping or a sequence, got {weights!r}"
        )
    if not np.all(np.isfinite(raw)) or (raw < 0).any() or raw.sum() <= 0:
        raise ArgumentValueError(
            f"weights must be finite, non-negative and not all 0, got {raw.tolist()!r}"
        )
    return raw / raw.sum()


def _digest(values: npt.NDArray[Any]) -> int:
    """A stable 64-bit digest of integer ``values`` (the same in every process)."""
    words = np.asarray(values).astype(np.uint64)
    step = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        weights = (np.arange(1, len(words) + 1, dtype=np.uint64) * step) | np.uint64(1)
        mixed = (words + np.uint64(0x632BE59BD9B4E019)) * weights
        folded = mixed ^ (mixed >> np.uint64(29))
    fold: Any = np.bitwise_xor.reduce  # typed differently by numpy releases
    return int(fold(folded, initial=np.uint64(len(words))))


def _apportion(total: int, shares: npt.NDArray[np.float64], caps: IndexArray) -> IndexArray:
    """``total`` split by ``shares`` (largest remainders), each at most its cap."""
    ideal = shares * total
    counts = np.minimum(np.floor(ideal).astype(np.int64), caps)
    left = total - int(counts.sum())
    order = np.argsort(-(ideal - np.floor(ideal)), kind="stable")
    while left > 0:
        room = order[(counts[order] < caps[order]) & (shares[order] > 0)]
        if len(room) == 0:
            break
        step = room[:left]
        counts[step] += 1
        left -= len(step)
    return counts
