"""``shuffle_buffer_size="auto"`` reaches its target or warns on every kind of source, and
plans cost the same whatever ``batch_size`` (issue 35)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.plan.quality import DEFAULT_SHUFFLE_QUALITY


def ids_array(n: int, chunk: int, start: int = 0) -> zarr.Array:
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 2), chunks=(chunk, 2), dtype="i8")
    x[:] = np.repeat(np.arange(start, start + n, dtype=np.int64)[:, None], 2, axis=1)
    return x


def direct_mixing(ids: np.ndarray, bounds: np.ndarray, batch: int) -> float:
    """Batch by batch: bits over the strata over an exact shuffle's expectation, by
    draws (the mean over 400 uniform batches of that size from the same ids)."""
    rng = np.random.default_rng(0)
    strata = np.searchsorted(bounds, ids, side="right") - 1

    def bits(part: np.ndarray) -> float:
        p = np.bincount(part)[np.bincount(part) > 0] / len(part)
        return float(-(p * np.log2(p)).sum())

    exact = {
        size: np.mean([bits(rng.choice(strata, size, replace=False)) for _ in range(400)])
        for size in {batch, len(ids) % batch or batch}
    }
    scores = [
        bits(strata[lo : lo + batch]) / exact[len(strata[lo : lo + batch])]
        for lo in range(0, len(ids), batch)
    ]
    return min(float(np.mean(scores)), 1.0)


A, B = ids_array(20_000, 500), ids_array(12_000, 500, 20_000)
SPLIT = dzb.chunk_split(ids_array(20_000, 500), [0.8, 0.2], seed=1)[0]
FIELD = zarr.create_array(zarr.storage.MemoryStore(), shape=(8000, 4, 2), chunks=(40, 4, 2),
                          dtype="f4")  # fmt: skip
FIELD[:] = np.broadcast_to(np.arange(8000, dtype="f4")[:, None, None], (8000, 4, 2))

# each kind: a stream of it with "auto", and the strata bounds of its ids (stored chunks)
KINDS: dict[str, tuple[Callable[..., Any], np.ndarray]] = {
    "array": (lambda **kw: dzb.shuffled_batch_stream(A, 64, **kw), np.arange(0, 20_001, 500)),
    "paired": (
        lambda **kw: dzb.paired_shuffled_batch_stream(A, ids_array(20_000, 400), 64, **kw),
        np.union1d(np.arange(0, 20_001, 500), np.arange(0, 20_001, 400)),
    ),
    "concat": (
        lambda **kw: dzb.shuffled_batch_stream(dzb.concat([A, B]), 64, **kw),
        np.arange(0, 32_001, 500),
    ),
    "mix": (
        lambda **kw: dzb.shuffled_batch_stream(dzb.mix([A, B], [0.5, 0.5]), 64, **kw),
        np.arange(0, 32_001, 500),
    ),
    "mix weighted": (
        lambda **kw: dzb.shuffled_batch_stream(dzb.mix([A, B], [0.7, 0.3]), 64, **kw),
        np.arange(0, 32_001, 500),
    ),
    "subset": (lambda **kw: dzb.shuffled_batch_stream(SPLIT, 64, **kw), None),
    "patches": (
        lambda **kw: dzb.patch_stream(FIELD, {0: 4}, 32, shuffle=True, **kw),
        None,
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("budget", [None, "small"])
def test_auto_reaches_its_target_or_warns_on_every_kind(kind: str, budget: str | None) -> None:
    # a mixture's "auto" took one chunk and said 1.0 while its batches mixed 0.2
    make, bounds = KINDS[kind]
    kw: dict[str, Any] = {"seed": 3, "shuffle_buffer_size": "auto"}
    if budget == "small":
        kw["memory_budget"] = 3 * 16 * 1_500  # three buffers of 1,500 samples of 16 bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if kind == "paired" and budget == "small":  # its units, blocks of 2,000, do not fit
            with pytest.raises(dzb.ArgumentValueError, match="no buffer within the memory"):
                make(**kw)
            return
        stream = make(**kw)
    stream.close()
    short = [w for w in caught if issubclass(w.category, dzb.ShuffleQualityWarning)]
    summary = stream.summary()
    assert summary.quality is not None and summary.quality.mixing is not None
    assert summary.buffer_figure is not None
    planned = summary.quality.mixing
    if bounds is not None:  # an independent count of the plan's own ids
        ids = np.concatenate([np.asarray(w.samples) for w in stream.plan.windows()])
        assert planned == pytest.approx(direct_mixing(ids, bounds, 64), abs=0.02)
    if short:
        assert len(short) == 1 and f"reaches {summary.buffer_figure:.3f}" in str(short[0].message)
        assert summary.buffer_figure < DEFAULT_SHUFFLE_QUALITY
        assert planned < DEFAULT_SHUFFLE_QUALITY + 0.02
    else:
        assert summary.buffer_figure >= DEFAULT_SHUFFLE_QUALITY
        assert planned >= DEFAULT_SHUFFLE_QUALITY - 0.02  # realised: the row shuffles' noise
    if budget == "small" and kind != "patches":  # 3 chunks of 500 reach no 0.85
        assert short


def test_a_loader_of_a_mixture_sizes_auto_by_its_mixing() -> None:
    loader = dzb.Loader(dzb.mix([A, B], [0.5, 0.5]), 64, shuffle=True, seed=2,
                        shuffle_buffer_size="auto")  # fmt: skip
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        stream = loader.stream()
        stream.close()
        quality = stream.summary().quality
        assert quality is not None and quality.mixing is not None
        assert quality.mixing >= DEFAULT_SHUFFLE_QUALITY - 0.02
        assert stream.spec.shuffle_buffer_size > 500
    with pytest.warns(dzb.ShuffleQualityWarning, match="reaches"):
        dzb.Loader(dzb.mix([A, B], [0.5, 0.5]), 64, shuffle=True, seed=2,
                   shuffle_buffer_size="auto", memory_budget=3 * 16 * 1_000)  # fmt: skip


# --------------------------------------------------------------------------
# batch_size does not cost


@pytest.mark.timeout(60)
def test_a_huge_batch_size_plans_at_once() -> None:
    # 10**7 took 9-12 s and 0.7 GB (a sum over batch_size + 1 binomial terms), 2**62 raised
    # numpy's "array is too big"; a plan's cost does not grow with batch_size
    x = ids_array(100, 10)
    for size in (10**7, 10**8, 2**40, 2**62, 2**63 - 1):
        start = time.perf_counter()
        batches = [len(b) for b in dzb.batch_stream(x, size)]
        shuffled = [len(b) for b in dzb.shuffled_batch_stream(x, size, shuffle_buffer_size="auto")]
        exact = dzb.plan_epoch(x, size, shuffle=True)
        buffered = dzb.plan_epoch(x, size, shuffle=True, shuffle_buffer_size=30)
        loader = [len(b) for b in dzb.Loader(x, size, shuffle=True)]
        assert time.perf_counter() - start < 5
        assert batches == shuffled == loader == [100]
        for plan in (exact, buffered):
            assert plan.n_batches == 1 and plan.quality is not None
            assert plan.quality.mixing == pytest.approx(1.0)
    # and on a long array: the figures' sums are O(sqrt(batch)), not O(batch)
    long = zarr.create_array(zarr.storage.MemoryStore(), shape=(2_000_000, 1),
                             chunks=(20_000, 1), dtype="u1")  # fmt: skip
    start = time.perf_counter()
    for size in (10**6, 10**9):
        plan = dzb.plan_epoch(long, size, shuffle=True, shuffle_buffer_size=200_000)
        assert plan.quality is not None and plan.quality.mixing is not None
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize("size", [2**63, 2**64, 10**30])
def test_a_batch_size_no_plan_can_represent_is_refused_naming_it(size: int) -> None:
    x = ids_array(100, 10)
    calls: list[Callable[[], object]] = [
        lambda: dzb.batch_stream(x, size),
        lambda: dzb.shuffled_batch_stream(x, size),
        lambda: dzb.plan_epoch(x, size, shuffle=True),
        lambda: dzb.count_batches(x, size),
        lambda: dzb.Loader(x, size),
    ]
    for call in calls:
        with pytest.raises(
            dzb.ArgumentValueError, match=rf"batch_size={size} cannot be represented"
        ):
            call()
