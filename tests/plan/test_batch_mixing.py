"""Batch mixing (issue 28): how a batch's samples spread over the epoch's stored chunks,
beside an exact shuffle's expectation, on plans and on what streams delivered."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings

import daskzarr_batches as dzb
from daskzarr_batches.plan.quality import QualityCounter, exact_mixing_bits

SETTINGS = property_settings(20)


def ids_array(n: int, chunk: int) -> zarr.Array:
    """Sample ``i`` holds ``i``: a batch's first column is its sample ids."""
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 2), chunks=(chunk, 2), dtype="i8")
    if n:
        x[:] = np.repeat(np.arange(n, dtype=np.int64)[:, None], 2, axis=1)
    return x


def entropy_bits(counts: np.ndarray) -> float:
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()) if len(p) else 0.0


def direct_mixing(ids: np.ndarray, bounds: np.ndarray, batch: int) -> float:
    """Mean bits of each batch's histogram over the strata, batch by batch."""
    return float(np.mean(direct_batches(ids, bounds, batch)[0]))


def direct_batches(
    ids: np.ndarray, bounds: np.ndarray, batch: int
) -> tuple[list[float], list[float]]:
    """Each batch's bits over the strata, and its score: bits over an exact shuffle's
    expectation for a batch of its own size (1 where that is 0)."""
    strata = np.searchsorted(bounds, ids, side="right") - 1
    bits, scores = [], []
    for lo in range(0, len(ids), batch):
        part = strata[lo : lo + batch]
        bits.append(entropy_bits(np.bincount(part, minlength=len(bounds) - 1)))
        exact = exact_mixing_bits(bounds, len(part))
        scores.append(bits[-1] / exact if exact else 1.0)
    return bits, scores


def direct_worst(scores: list[float]) -> float:
    """The least mean score of ``ceil(batches / 50)`` consecutive batches (the rest joining
    the last whole stretch), clipped at 1: an independent windowed minimum."""
    size = -(-len(scores) // 50)
    starts = list(range(0, len(scores), size))
    if len(starts) > 1 and len(scores) - starts[-1] < size:
        starts.pop()
    ends = [*starts[1:], len(scores)]
    return min(1.0, min(float(np.mean(scores[a:b])) for a, b in zip(starts, ends, strict=True)))


@SETTINGS
@given(
    n=st.integers(2, 600),
    chunk=st.integers(1, 97),
    batch=st.integers(1, 64),
    buffer=st.one_of(st.none(), st.just(0), st.integers(1, 300)),  # 0: sequential
    seed=st.integers(0, 2**16),
)
def test_delivered_mixing_equals_a_direct_computation(
    n: int, chunk: int, batch: int, buffer: int | None, seed: int
) -> None:
    x = ids_array(n, chunk)
    if buffer == 0:
        stream = dzb.batch_stream(x, batch)
    else:
        stream = dzb.shuffled_batch_stream(x, batch, seed=seed, shuffle_buffer_size=buffer)
    planned = stream.summary().quality
    ids = np.concatenate([b[:, 0] for b in stream])
    got = stream.stats.quality
    assert got is not None and planned is not None
    assert got.mixing is not None and got.mixing_bits is not None
    bounds = np.append(np.arange(0, n, chunk), n)
    assert got.mixing_bits == pytest.approx(direct_mixing(ids, bounds, batch), abs=1e-9)
    exact = exact_mixing_bits(bounds, batch)
    assert got.exact_mixing_bits == exact
    # each batch against an exact shuffle's batch of its own size (the short last one too)
    _, scores = direct_batches(ids, bounds, batch)
    assert got.mixing == pytest.approx(min(float(np.mean(scores)), 1.0), rel=1e-9)
    assert 0.0 <= got.mixing <= 1.0
    assert got.worst_mixing == pytest.approx(direct_worst(scores), rel=1e-9)
    assert planned.worst_mixing == pytest.approx(got.worst_mixing, rel=1e-9)
    assert planned.mixing == pytest.approx(got.mixing, rel=1e-9)  # the plan's is what it delivers


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=5),
    batch=st.integers(1, 16),
    cuts=st.lists(st.integers(0, 300), max_size=4),
)
def test_mixing_runs_count_as_their_ids(lengths: list[int], batch: int, cuts: list[int]) -> None:
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = int(bounds[-1])
    edges = sorted({0, n, *(c % (n + 1) for c in cuts)})
    runs = QualityCounter(n, batch_size=batch, strata=bounds)
    ids = QualityCounter(n, batch_size=batch, strata=bounds)
    for lo, hi in itertools.pairwise(edges):
        runs.add(range(lo, hi), range(lo, hi))
        ids.add(np.arange(lo, hi), np.arange(lo, hi))
    a, b = runs.quality(), ids.quality()
    assert a.mixing == pytest.approx(b.mixing) and a.mixing_bits == pytest.approx(b.mixing_bits)


def test_mixing_is_the_same_however_the_ids_are_cut() -> None:
    n = 10_000
    order = np.random.default_rng(0).permutation(n)
    bounds = np.append(np.arange(0, n, 128), n)
    whole = QualityCounter(n, batch_size=64, strata=bounds)
    whole.add(order, np.arange(n))
    cut = QualityCounter(n, batch_size=64, strata=bounds)
    for lo, hi in [(0, 1), (1, 100), (100, 5000), (5000, n)]:
        cut.add(order[lo:hi], np.arange(lo, hi))
    assert whole.quality().mixing == pytest.approx(cut.quality().mixing, rel=1e-12)


def test_exact_expectation_matches_draws() -> None:
    rng = np.random.default_rng(2)
    bounds, batch = np.asarray([0, 128, 256, 384, 512, 600]), 32
    strata = np.repeat(np.arange(5), np.diff(bounds))
    draws = [entropy_bits(np.bincount(rng.permutation(strata)[:batch])) for _ in range(3000)]
    assert exact_mixing_bits(bounds, batch) == pytest.approx(np.mean(draws), rel=0.01)
    assert exact_mixing_bits([0, 10], 4) == 0.0  # one stratum: nothing to mix


def test_sorted_digits_sized_case() -> None:
    # the case: 1,437 training rows in chunks of 128, batches of 32
    x = ids_array(1437, 128)
    figures = {}
    for name, kw in {
        "sequential": {"shuffle": False, "seed": None},
        "2 chunks": {"shuffle": True, "seed": 0, "shuffle_buffer_size": 256},
        "exact": {"shuffle": True, "seed": 0},
    }.items():
        plan = dzb.plan_epoch(x, 32, **kw)  # type: ignore[arg-type]
        assert plan.quality is not None and plan.quality.mixing is not None
        figures[name] = plan.quality.mixing
    assert figures["sequential"] < 0.1
    assert figures["2 chunks"] <= 0.5
    assert figures["exact"] >= 0.95
    assert "batch mixing" in str(dzb.plan_epoch(x, 32, shuffle=True, seed=0))


def test_mixing_of_collections_and_patches() -> None:
    data = dzb.concat([ids_array(300, 50), ids_array(500, 64)])
    stream = dzb.shuffled_batch_stream(data, 32, seed=1, shuffle_buffer_size=128)
    planned = stream.summary().quality
    for _ in stream:
        pass
    got = stream.stats.quality
    assert planned is not None and got is not None and got.mixing is not None
    assert got.mixing == pytest.approx(planned.mixing) and 0 < got.mixing < 0.8
    field = np.arange(64 * 8 * 8, dtype="f4").reshape(64, 8, 8)
    f = zarr.create_array(
        zarr.storage.MemoryStore(), shape=field.shape, chunks=(8, 8, 8), dtype="f4"
    )
    f[:] = field
    for shuffle in (False, True):
        stream = dzb.patch_stream(f, {0: 1}, 4, shuffle=shuffle, seed=0)
        planned = stream.summary().quality
        for _ in stream:
            pass
        got = stream.stats.quality
        assert planned is not None and got is not None and got.mixing is not None
        assert got.mixing == pytest.approx(planned.mixing)
        assert (got.mixing > 0.9) if shuffle else (got.mixing < 0.3)


# --------------------------------------------------------------------------
# label mixing at run time


def labelled(labels: np.ndarray, chunk: int) -> tuple[zarr.Array, zarr.Array]:
    n = len(labels)
    x = ids_array(n, chunk)
    y = zarr.create_array(
        zarr.storage.MemoryStore(), shape=(n,), chunks=(chunk,), dtype="i8", fill_value=-1
    )
    y[:] = labels
    return x, y


def direct_label_distance(batches: list[np.ndarray]) -> float:
    everything = np.concatenate(batches)
    classes = np.unique(everything)
    q = np.asarray([(everything == c).mean() for c in classes])
    tv = [0.5 * np.abs(np.asarray([(b == c).mean() for c in classes]) - q).sum() for b in batches]
    return float(np.mean(tv))


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 80), min_size=1, max_size=5),
    chunk=st.integers(4, 64),
    batch=st.integers(1, 40),
    buffer=st.one_of(st.none(), st.just(0), st.integers(1, 200)),
    seed=st.integers(0, 1000),
)
def test_label_mixing_equals_a_direct_computation(
    sizes: list[int], chunk: int, batch: int, buffer: int | None, seed: int
) -> None:
    from daskzarr_batches.plan.quality import exact_label_distance

    labels = np.repeat(np.arange(len(sizes)), sizes)
    x, y = labelled(labels, chunk)
    if buffer == 0:
        stream = dzb.paired_batch_stream(x, y, batch, label_mixing=True)
    else:
        stream = dzb.paired_shuffled_batch_stream(
            x, y, batch, seed=seed, shuffle_buffer_size=buffer, label_mixing=True
        )
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        batches = [b for _, b in stream]
    got = stream.stats.quality
    assert got is not None and got.label_distance is not None and got.label_mixing is not None
    distance = direct_label_distance(batches)
    assert got.label_distance == pytest.approx(distance, abs=1e-9)
    q = np.bincount(labels) / len(labels)
    lengths = [len(b) for b in batches]
    expected = float(np.mean([exact_label_distance(q, k) for k in lengths]))
    want = min(max((1 - distance) / (1 - expected), 0.0), 1.0) if expected < 1 else 1.0
    assert got.label_mixing == pytest.approx(want, abs=1e-9)
    assert 0.0 <= got.label_mixing <= 1.0


def test_label_mixing_warns_when_batches_hold_few_classes() -> None:
    labels = np.repeat(np.arange(10), 100)  # sorted by class
    x, y = labelled(labels, 100)
    stream = dzb.paired_batch_stream(x, y, 32, label_mixing=True)
    with pytest.warns(dzb.ShuffleQualityWarning, match="label mixing") as record:
        for _ in stream:
            pass
    assert record[0].filename == __file__  # the caller's loop
    quality = stream.stats.quality
    assert quality is not None and quality.label_mixing is not None
    assert quality.label_mixing < 0.3 and "label mixing" in str(quality)
    exact = dzb.paired_shuffled_batch_stream(x, y, 32, seed=0, label_mixing=True)
    for _ in exact:  # no warning: pytest turns one into an error
        pass
    quality = exact.stats.quality
    assert quality is not None and quality.label_mixing is not None
    assert quality.label_mixing > 0.95
    loader = dzb.Loader({"x": x, "y": y}, 32, shuffle=True, seed=0, labels="y")
    for _ in loader:
        pass
    assert loader.stats.quality is not None and loader.stats.quality.label_mixing is not None
    plain = dzb.paired_shuffled_batch_stream(x, y, 32, seed=0)
    plain.close()
    assert plain.summary().quality is not None and plain.summary().quality.label_mixing is None
    with pytest.raises(dzb.ArgumentValueError, match="names none"):
        dzb.Loader({"x": x, "y": y}, 32, labels="z")
    with pytest.raises(dzb.ArgumentValueError, match="discrete"):
        dzb.Loader({"x": x, "y": y}, 32, labels="x")


def test_sorted_digits_delivered_figures() -> None:
    # the done-when on the real data: scikit-learn's digits, training rows
    # sorted by label, chunks of 128, batch 32 (the training itself is the benchmark)
    datasets = pytest.importorskip("sklearn.datasets")
    selection = pytest.importorskip("sklearn.model_selection")
    x_all, y_all = datasets.load_digits(return_X_y=True)
    x_train, _, y_train, _ = selection.train_test_split(
        x_all.astype("f4"), y_all, test_size=0.2, random_state=0, stratify=y_all
    )
    order = np.argsort(y_train, kind="stable")
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(1437, 64), chunks=(128, 64),
                          dtype="f4")  # fmt: skip
    x[:] = x_train[order]
    _, y = labelled(y_train[order].astype("i8"), 128)
    figures = {}
    for name, buffer in (("2 chunks", 256), ("exact", None), ("auto", "auto")):
        stream = dzb.paired_shuffled_batch_stream(
            x, y, 32, seed=0, shuffle_buffer_size=buffer, label_mixing=True
        )
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            for _ in stream:
                pass
        quality = stream.stats.quality
        assert quality is not None and quality.mixing is not None
        figures[name] = (quality.mixing, quality.label_mixing, stream.spec.shuffle_buffer_size)
    assert figures["2 chunks"][0] <= 0.5 and figures["exact"][0] >= 0.95
    # windows are balanced (no short last window of 2 chunks that a mean of 0.85 hid):
    # 10 chunks make windows of 6 and 6, so "auto" takes 11, one window of the whole set
    assert figures["auto"][0] >= 0.85 and figures["auto"][2] == 11 * 128
    assert figures["2 chunks"][1] is not None and figures["2 chunks"][1] < 0.5
    with pytest.warns(dzb.ShuffleQualityWarning, match="write_shuffled"):
        small = dzb.shuffled_batch_stream(
            x, 32, seed=0, shuffle_buffer_size="auto", memory_budget=3 * 4 * 128 * 64 * 4
        )
    small.close()
    assert small.spec.shuffle_buffer_size == 4 * 128


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=300),
    batch=st.integers(1, 32),
    seed=st.integers(0, 2**16),
)
def test_mixing_of_many_or_unequal_strata_equals_a_direct_computation(
    sizes: list[int], batch: int, seed: int
) -> None:
    """Equal strata (a division), unequal ones (a binary search), few cells per entry (a
    dense count) and many (a sort): the same figures as counting batch by batch."""
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(bounds[-1])
    ids = np.random.default_rng(seed).permutation(n)
    counter = QualityCounter(n, batch_size=batch, strata=bounds)
    for lo in range(0, n, 97):
        counter.add(ids[lo : lo + 97], np.arange(lo, min(lo + 97, n)))
    got = counter.quality()
    assert got.mixing_bits == pytest.approx(direct_mixing(ids, bounds, batch), abs=1e-9)


def test_a_buffered_window_is_counted_without_a_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 36: ``np.unique``'s sort of every delivered id was most of a buffered epoch's
    counting (a fifth of its time); one array's windows now count with a division and a
    dense ``bincount``."""
    from daskzarr_batches.plan import mixing

    n, chunk = 65_536, 4_096
    counter = QualityCounter(n, batch_size=256, strata=np.append(np.arange(0, n, chunk), n))
    calls: list[int] = []
    unique = np.unique
    monkeypatch.setattr(mixing.np, "unique", lambda *a, **k: calls.append(1) or unique(*a, **k))
    monkeypatch.setattr(
        mixing.np, "searchsorted", lambda *a, **k: pytest.fail("a binary search per id")
    )
    counter.add(np.random.default_rng(0).permutation(n), np.arange(n))
    monkeypatch.undo()
    assert calls == []
    assert 0.9 < counter.quality().mixing <= 1.0
