"""Shuffle quality (issue 18): the figures of plans and of what streams delivered,
``shuffle_buffer_size="auto"``, and its errors."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings

import daskzarr_batches as dzb
from daskzarr_batches.plan.quality import (
    DEFAULT_SHUFFLE_QUALITY,
    ENTROPY_BINS,
    QualityCounter,
    buffer_entropy,
    exact_entropy,
    exact_source_entropy,
)
from daskzarr_batches.plan.windows import sample_units

SETTINGS = property_settings(25)


def ids_array(n: int, chunk: int) -> zarr.Array:
    """Sample ``i`` holds ``i``: a batch's first column is its sample ids."""
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 2), chunks=(chunk, 2), dtype="i8")
    if n:
        x[:] = np.repeat(np.arange(n, dtype=np.int64)[:, None], 2, axis=1)
    return x


def same(a: object, b: object) -> bool:
    """Two ShuffleQuality equal up to the order of float sums."""
    import dataclasses

    x, y = dataclasses.asdict(a), dataclasses.asdict(b)  # type: ignore[call-overload]
    return x.keys() == y.keys() and all(
        x[k] == y[k] or (x[k] is not None and y[k] is not None and math.isclose(x[k], y[k]))
        for k in x
    )


def entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()) if len(p) else 0.0


def direct(ids: np.ndarray, n: int) -> tuple[float, float]:
    """Neighbour entropy and displacement fractions, straight from the delivered ids."""
    diffs = np.diff(ids.astype(np.int64))
    counts = np.zeros(ENTROPY_BINS, dtype=np.int64)
    for d in diffs.tolist():  # one by one: an independent binning of (-n, n)
        counts[math.floor((d + n) * ENTROPY_BINS / (2 * n))] += 1
    exact = exact_entropy(n)
    entropy = entropy_bits(counts) / exact if exact else 1.0
    far = (n * n - 1) / (3 * n)
    displacement = float(np.abs(ids - np.arange(len(ids))).mean()) / far if far else 1.0
    return entropy, displacement


@SETTINGS
@given(
    n=st.integers(2, 600),
    chunk=st.integers(1, 97),
    batch=st.integers(1, 64),
    buffer=st.one_of(st.none(), st.integers(1, 300)),
    seed=st.integers(0, 2**16),
    drop=st.booleans(),
)
def test_delivered_figures_equal_a_direct_computation(
    n: int, chunk: int, batch: int, buffer: int | None, seed: int, drop: bool
) -> None:
    x = ids_array(n, chunk)
    stream = dzb.shuffled_batch_stream(
        x, batch, seed=seed, shuffle_buffer_size=buffer, drop_remainder=drop
    )
    planned = stream.summary().quality
    delivered = []
    for k, b in enumerate(stream):
        delivered.append(b[:, 0])
        if k == 1:  # part-way: the figures of what was handed out so far
            got = stream.stats.quality
            assert got is not None
            ids = np.concatenate(delivered)
            assert got.samples == len(ids)
            assert (got.entropy, got.displacement) == pytest.approx(direct(ids, n), rel=1e-9)
    ids = np.concatenate(delivered) if delivered else np.empty(0, np.int64)
    got = stream.stats.quality
    assert got is not None and got.samples == len(ids)
    if len(ids):
        assert (got.entropy, got.displacement) == pytest.approx(direct(ids, n), rel=1e-9)
    assert same(planned, got)  # the plan's figures are those of what it delivers


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 150), min_size=2, max_size=4),
    chunks=st.lists(st.integers(1, 40), min_size=4, max_size=4),
    batch=st.integers(1, 40),
    buffer=st.one_of(st.none(), st.integers(1, 200)),  # None: sequential (ids as runs)
    seed=st.integers(0, 1000),
)
def test_source_entropy_equals_a_direct_computation(
    lengths: list[int], chunks: list[int], batch: int, buffer: int | None, seed: int
) -> None:
    members = [
        ids_array(length, chunk) for length, chunk in zip(lengths, chunks, strict=False)
    ]  # each member's rows hold their own positions: use return_sources
    data = dzb.concat(members)
    n = sum(lengths)
    if n < 2:
        return
    stream = (
        dzb.batch_stream(data, batch, return_sources=True)
        if buffer is None
        else dzb.shuffled_batch_stream(
            data, batch, seed=seed, shuffle_buffer_size=buffer, return_sources=True
        )
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    per_batch = []
    scores = []  # each batch against an exact shuffle's batch of its own size
    ids = []
    for _, sources in stream:
        ids.append(offsets[sources[:, 0]] + sources[:, 1])
        counts = np.bincount(sources[:, 0], minlength=len(lengths))
        per_batch.append(entropy_bits(counts))
        reference = exact_source_entropy(tuple(lengths), len(sources))
        scores.append(per_batch[-1] / reference if reference else 1.0)
    got = stream.stats.quality
    assert got is not None and got.source_entropy_bits is not None
    assert got.source_entropy_bits == pytest.approx(float(np.mean(per_batch)), abs=1e-12)
    assert got.source_entropy == pytest.approx(float(np.mean(scores)), rel=1e-9)
    entropy, displacement = direct(np.concatenate(ids), n)
    assert (got.entropy, got.displacement) == pytest.approx((entropy, displacement), rel=1e-9)


def test_counter_is_the_same_however_the_ids_are_cut() -> None:
    n = 10_000
    order = np.random.default_rng(0).permutation(n)
    whole = QualityCounter(n, members=[0, 3000, n], batch_size=64)
    whole.add(order, np.arange(n))
    cut = QualityCounter(n, members=[0, 3000, n], batch_size=64)
    for lo, hi in [(0, 1), (1, 100), (100, 5000), (5000, n)]:
        cut.add(order[lo:hi], np.arange(lo, hi))
    assert same(whole.quality(), cut.quality())


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    batch=st.integers(1, 16),
    cuts=st.lists(st.integers(0, 300), max_size=4),
    shift=st.integers(-5, 5),
)
def test_runs_count_as_their_ids(
    lengths: list[int], batch: int, cuts: list[int], shift: int
) -> None:
    # a sequential window's ids reach the counter as ranges, counted without an array
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = int(bounds[-1])
    edges = sorted({0, n, *(c % (n + 1) for c in cuts)})
    runs = QualityCounter(n, members=bounds, batch_size=batch)
    ids = QualityCounter(n, members=bounds, batch_size=batch)
    for lo, hi in itertools.pairwise(edges):
        runs.add(range(lo, hi), range(lo + shift, hi + shift))
        ids.add(np.arange(lo, hi), np.arange(lo + shift, hi + shift))
    assert same(runs.quality(), ids.quality())


def test_exact_shuffle_scores_one_and_sequential_zero() -> None:
    n = 200_000
    order = np.random.default_rng(1).permutation(n)
    counter = QualityCounter(n)
    counter.add(order, np.arange(n))
    exact = counter.quality()
    assert exact.entropy == pytest.approx(1.0, abs=0.002)
    assert exact.displacement == pytest.approx(1.0, abs=0.01)
    counter = QualityCounter(n)
    counter.add(np.arange(n), np.arange(n))
    assert counter.quality().entropy == 0.0 and counter.quality().displacement == 0.0
    # a collection's exact reference is the expected plug-in entropy of a batch
    rng = np.random.default_rng(2)
    sizes, batch = (300, 700, 1000), 32
    members = np.repeat(np.arange(3), sizes)
    draws = [entropy_bits(np.bincount(rng.permutation(members)[:batch])) for _ in range(4000)]
    assert exact_source_entropy(sizes, batch) == pytest.approx(np.mean(draws), rel=0.01)


def test_summary_shows_the_quality() -> None:
    x = ids_array(5000, 100)
    text = str(dzb.plan_epoch(x, 50, shuffle=True, seed=0, shuffle_buffer_size=400))
    assert "shuffle quality: neighbour entropy" in text
    assert "'auto'" not in text


# --------------------------------------------------------------------------
# shuffle_buffer_size="auto"


def planned_entropy(x: zarr.Array, rows: int, seed: int, epoch: int = 0, **kw: object) -> float:
    """``plan_epoch(...).quality.entropy`` of a buffer of ``rows``: what a user is shown."""
    plan = dzb.plan_epoch(
        x, 64, shuffle=True, seed=seed, epoch=epoch, shuffle_buffer_size=rows, **kw
    )  # type: ignore[arg-type]
    assert plan.quality is not None
    return plan.quality.entropy


def expected_mixing(x: zarr.Array, rows: int, seed: int, epoch: int = 0, **kw: object) -> float:
    """The figure "auto" holds a buffer of ``rows`` to: the epoch's expected mixing."""
    stream = dzb.shuffled_batch_stream(
        x, 64, seed=seed, epoch=epoch, shuffle_buffer_size=rows, **kw
    )  # type: ignore[arg-type]
    stream.close()
    figure = stream.plan.expected_mixing()
    assert figure is not None
    return figure


@pytest.mark.parametrize(("chunk", "target"), [(100, 0.9), (100, 0.8), (250, 0.7)])
def test_auto_buffer_meets_its_target_and_is_the_smallest(chunk: int, target: float) -> None:
    x = ids_array(20_000, chunk)
    stream = dzb.shuffled_batch_stream(
        x, 64, seed=5, shuffle_buffer_size="auto", shuffle_quality=target
    )
    stream.close()
    size = stream.spec.shuffle_buffer_size
    assert isinstance(size, int) and size % chunk == 0
    # held to this epoch's own figure given its windows; the realised one is close
    summary = stream.summary()
    assert summary.quality is not None and summary.buffer_figure is not None
    assert summary.buffer_figure >= target
    assert summary.buffer_figure == expected_mixing(x, size, seed=5)
    assert summary.quality.mixing == pytest.approx(summary.buffer_figure, abs=0.02)
    assert size == chunk or expected_mixing(x, size - chunk, seed=5) < target
    assert "sized by shuffle_buffer_size='auto'" in str(summary)
    # the same size from every entry point given the same (seed, epoch)
    other = dzb.plan_epoch(x, 64, shuffle=True, seed=5, shuffle_buffer_size="auto",
                           shuffle_quality=target)  # fmt: skip
    # the first window is the first buffer (balanced: within a chunk of the mean window)
    assert other.windows[0].samples == summary.windows[0].samples
    assert abs(other.windows[0].samples - 20_000 / other.n_windows) <= chunk
    assert other.windows[0].samples <= size
    loader = dzb.Loader(
        x, 64, shuffle=True, seed=5, shuffle_buffer_size="auto", shuffle_quality=target
    )
    assert loader.spec.shuffle_buffer_size == size


def test_auto_buffer_is_sized_per_epoch_in_a_loader() -> None:
    # each epoch of a Loader sizes its own buffer, as a stream of that epoch would
    x = ids_array(20_000, 100)
    loader = dzb.Loader(x, 64, shuffle=True, seed=1, shuffle_buffer_size="auto")
    sizes = []
    for epoch in range(4):
        loader.set_epoch(epoch)
        stream = loader.stream()
        stream.close()
        alone = dzb.shuffled_batch_stream(x, 64, seed=1, epoch=epoch, shuffle_buffer_size="auto")
        alone.close()
        assert stream.spec.shuffle_buffer_size == alone.spec.shuffle_buffer_size
        summary = stream.summary()
        assert summary.buffer_figure is not None
        assert summary.buffer_figure >= DEFAULT_SHUFFLE_QUALITY
        sizes.append(stream.spec.shuffle_buffer_size)
    # a state names the request, not one epoch's size, and resumes in a new loader
    loader.set_epoch(2)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    batches.close()
    assert state["shuffle_buffer_size"] == f"auto (shuffle_quality={DEFAULT_SHUFFLE_QUALITY})"
    again = dzb.Loader(x, 64, shuffle=True, seed=1, shuffle_buffer_size="auto")
    again.load_state_dict(state)
    assert again.stream().spec.shuffle_buffer_size == sizes[2]
    fixed = dzb.Loader(x, 64, shuffle=True, seed=1, shuffle_buffer_size=sizes[0])
    with pytest.raises(dzb.ArgumentValueError, match="shuffle_buffer_size"):
        fixed.load_state_dict(state)


@SETTINGS
@given(
    n=st.integers(1, 30_000),
    chunk=st.integers(1, 4_000),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
    target=st.floats(0.3, 1.0),
    budget_rows=st.one_of(st.none(), st.integers(1, 40_000)),
    drop_remainder=st.booleans(),
)
def test_auto_buffer_meets_the_target_in_every_epoch(
    n: int,
    chunk: int,
    seed: int,
    epoch: int,
    target: float,
    budget_rows: int | None,
    drop_remainder: bool,
) -> None:
    # the figure of the stream's own (seed, epoch) reaches the target and one chunk
    # less would not; a budget that holds no such buffer gives the largest that fits
    # and a ShuffleQualityWarning; one that holds no chunk is an error
    x = ids_array(n, min(chunk, n))
    chunk = min(chunk, n)
    kw = {"drop_remainder": drop_remainder}
    if budget_rows is not None:  # 16 bytes a sample, prefetch 2: three buffers
        kw["memory_budget"] = 3 * 16 * budget_rows
    auto = {"shuffle_buffer_size": "auto", "shuffle_quality": target, **kw}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            stream = dzb.shuffled_batch_stream(x, 64, seed=seed, epoch=epoch, **auto)
        except dzb.ArgumentValueError as error:
            assert "no buffer within the memory budget" in str(error)
            assert budget_rows is not None and budget_rows < chunk
            return
    stream.close()
    rows = stream.spec.shuffle_buffer_size
    assert isinstance(rows, int) and rows % chunk == 0
    figure = stream.summary().buffer_figure
    assert figure is not None and 0.0 <= figure <= 1.0
    assert figure == expected_mixing(x, rows, seed, epoch, **kw)
    short = [w for w in caught if issubclass(w.category, dzb.ShuffleQualityWarning)]
    if figure < target:  # only when the budget holds no buffer that reaches it
        assert budget_rows is not None and rows == (budget_rows // chunk) * chunk
        assert len(short) == 1 and f"reaches {figure:.3f}" in str(short[0].message)
        assert short[0].filename == __file__  # attributed to the caller's line
    else:
        assert not short
        if rows > chunk:
            assert expected_mixing(x, rows - chunk, seed, epoch, **kw) < target


def test_auto_buffer_warns_when_the_budget_cannot_reach_the_target() -> None:
    x = ids_array(20_000, 100)
    # 3 buffers of 16 bytes a sample in 48,000 bytes: at most 10 chunks of 200
    with pytest.warns(dzb.ShuffleQualityWarning) as record:
        stream = dzb.shuffled_batch_stream(
            x, 64, seed=0, shuffle_buffer_size="auto", memory_budget=48_000
        )
    stream.close()
    assert stream.spec.shuffle_buffer_size == 1000
    text = str(record[0].message)
    for way_out in ("exact shuffle", "cache", "write_shuffled", "smaller chunks"):
        assert way_out in text
    assert record[0].filename == __file__
    summary = stream.summary()
    assert summary.buffer_figure is not None and summary.buffer_figure < DEFAULT_SHUFFLE_QUALITY
    assert f"reaches {summary.buffer_figure:.3f}" in text


def test_auto_buffer_estimate_tracks_the_epochs() -> None:
    # the estimate is of an epoch's own figure: the mean over seeds is close to it
    x = ids_array(40_000, 500)
    for chunks in (2, 8):
        figures = [
            dzb.plan_epoch(x, 64, shuffle=True, seed=s, shuffle_buffer_size=chunks * 500).quality
            for s in range(5)
        ]
        units = sample_units((np.arange(0, 40_001, 500),), 40_000)
        mean = float(np.mean([q.entropy for q in figures if q is not None]))
        assert buffer_entropy(units, chunks * 500) == pytest.approx(mean, abs=0.03)


def test_auto_buffer_errors() -> None:
    x = ids_array(20_000, 100)
    with pytest.raises(dzb.ArgumentValueError, match="no buffer within the memory budget"):
        # 3 buffers of 2 x 8 bytes a sample in 3,000 bytes: not one unit of 100
        dzb.shuffled_batch_stream(x, 64, shuffle_buffer_size="auto", memory_budget=3_000)
    with pytest.raises(dzb.ArgumentValueError, match="shuffle_quality"):
        dzb.shuffled_batch_stream(x, 64, shuffle_buffer_size=400, shuffle_quality=0.9)
    with pytest.raises(dzb.ArgumentValueError, match=r"in \(0, 1\]"):
        dzb.shuffled_batch_stream(x, 64, shuffle_buffer_size="auto", shuffle_quality=1.5)
    with pytest.raises(dzb.ArgumentTypeError, match="shuffle_quality"):
        dzb.shuffled_batch_stream(x, 64, shuffle_buffer_size="auto", shuffle_quality="high")
    with pytest.raises(dzb.ArgumentValueError, match="needs shuffle=True"):
        dzb.plan_epoch(x, 64, shuffle_buffer_size="auto")


def test_auto_buffer_for_patches_and_bench_arguments() -> None:
    field = np.zeros((64, 8, 8), dtype="f4")
    stream = dzb.patch_stream(
        field, {0: 1}, 4, shuffle=True, shuffle_buffer_size="auto", shuffle_quality=0.5
    )
    assert isinstance(stream.spec.shuffle_buffer_size, int)
    assert sum(len(b) for b in stream) == 64


@SETTINGS
@given(
    n=st.integers(2, 5_000),
    pairs=st.lists(
        st.tuples(st.floats(0, 1), st.integers(1, 80), st.floats(0, 1), st.integers(1, 80)),
        min_size=1,
        max_size=6,
    ),
)
def test_pair_bins_counts_every_difference(
    n: int, pairs: list[tuple[float, int, float, int]]
) -> None:
    # the closed form equals a histogram of every x - y of the ranges, weighted
    from daskzarr_batches.plan.quality import _bins, pair_bins

    a = np.asarray([int(x * (n - 1)) for x, _, _, _ in pairs])
    p = np.minimum([size for _, size, _, _ in pairs], n - a)
    b = np.asarray([int(y * (n - 1)) for _, _, y, _ in pairs])
    q = np.minimum([size for _, _, _, size in pairs], n - b)
    weight = np.linspace(0.5, 2.0, len(pairs))
    want = np.zeros(ENTROPY_BINS)
    for i in range(len(pairs)):
        d = (np.arange(a[i], a[i] + p[i])[:, None] - np.arange(b[i], b[i] + q[i])[None, :]).ravel()
        want += np.bincount(_bins(d, n), minlength=ENTROPY_BINS) * weight[i]
    np.testing.assert_allclose(pair_bins(a, p, b, q, weight, n), want)


def test_a_long_epoch_is_sized_by_its_expected_figure() -> None:
    # the expected neighbour entropy tracks the planned one closely; "auto" holds a long
    # epoch to its expected mixing, computed per chunk, not per row
    import time

    from daskzarr_batches.plan.epoch import EpochPlan
    from daskzarr_batches.plan.quality import AUTO_EXACT_SAMPLES

    n, chunk = AUTO_EXACT_SAMPLES + 600_000, 4096
    offsets = np.append(np.arange(0, n, chunk), n)

    def plan(rows: int, batch: int = 256, drop: bool = False) -> EpochPlan:
        return EpochPlan(n_samples=n, offsets=(offsets,), batch_size=batch, shuffle="buffer",
                         drop_remainder=drop, window_rows=rows, seed=4, epoch=1)  # fmt: skip

    for chunks, drop in ((3, False), (8, True)):
        long = plan(chunks * chunk, 1000, drop)
        expected = long.expected_entropy()
        assert expected is not None and expected == pytest.approx(long.entropy(), abs=2e-4)
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 1), chunks=(chunk, 1), dtype="u1")
    start = time.perf_counter()
    stream = dzb.shuffled_batch_stream(x, 256, seed=4, epoch=1, shuffle_buffer_size="auto")
    stream.close()
    assert time.perf_counter() - start < 20
    size = stream.spec.shuffle_buffer_size
    assert isinstance(size, int)
    figure = stream.summary().buffer_figure
    assert figure is not None and figure >= DEFAULT_SHUFFLE_QUALITY
    below = plan(size - chunk).expected_mixing()
    assert below is not None and below < DEFAULT_SHUFFLE_QUALITY
