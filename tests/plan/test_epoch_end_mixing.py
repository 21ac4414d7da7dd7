"""The end of an epoch mixed as its middle (issue 35): balanced buffered windows, the
worst stretch of batches in the mixing figure, short batches scored by their own size."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings, seeds

import daskzarr_batches as dzb
from daskzarr_batches.plan.epoch import EpochPlan
from daskzarr_batches.plan.quality import WORST_STRETCHES, QualityCounter, exact_mixing_bits
from daskzarr_batches.plan.windows import chunk_offsets

SETTINGS = property_settings(20)


def labels_sorted(n: int, classes: int, chunk: int) -> zarr.Array:
    """Labels stored sorted: class ``c`` fills the ``c``-th ``n / classes`` rows."""
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n,), chunks=(chunk,), dtype="i1")
    x[:] = np.repeat(np.arange(classes, dtype=np.int8), n // classes)
    return x


def label_entropy(labels: np.ndarray, batch: int, classes: int) -> np.ndarray:
    """Each batch's label entropy, as a fraction of ``log2(classes)``."""
    out = []
    for lo in range(0, len(labels), batch):
        p = np.bincount(labels[lo : lo + batch], minlength=classes) / len(labels[lo : lo + batch])
        p = p[p > 0]
        out.append(float(-(p * np.log2(p)).sum()) / np.log2(classes))
    return np.asarray(out)


def epoch_ids(plan: EpochPlan) -> np.ndarray:
    return np.concatenate([np.asarray(w.samples, dtype=np.int64) for w in plan.windows()])


@pytest.mark.parametrize("buffer", ["auto", 14_000, 30_000])
def test_the_end_of_an_epoch_is_mixed_as_its_middle(buffer: int | str) -> None:
    # the case: 200,000 labels stored sorted, 10 classes, chunks of 2,000 rows,
    # batch 256 ("auto" took 49 chunks: windows of 49, 49 and a last one of 2, whose
    # batches held one or two classes: entropy 0.30 over the last 2% of batches)
    n, classes, chunk, batch = 200_000, 10, 2_000, 256
    y = labels_sorted(n, classes, chunk)
    labels = y[:]
    middle, tail10, tail2 = [], [], []
    for seed in range(12):
        stream = dzb.shuffled_batch_stream(y, batch, seed=seed, shuffle_buffer_size=buffer)
        stream.close()
        plan = stream.plan
        entropy = label_entropy(labels[epoch_ids(plan)], batch, classes)
        k = len(entropy)
        middle.append(entropy[k // 4 : 3 * k // 4].mean())
        tail10.append(entropy[-k // 10 :].mean())
        tail2.append(entropy[-k // 50 :].mean())
        quality = stream.summary().quality
        assert quality is not None and quality.worst_mixing is not None
        if buffer == "auto":  # the worst stretch meets the target, not only the mean
            assert quality.worst_mixing >= 0.8
    # before: "auto" 0.97 / 0.83 / 0.27 (middle / last 10% / last 2%), 7 chunks 0.70 / 0.60 /
    # 0.27, 15 chunks 0.86 / 0.77 / 0.76 (20 seeds); now each within noise of the middle
    margin = 0.02 if buffer == "auto" else 0.045
    assert np.mean(tail10) == pytest.approx(np.mean(middle), abs=margin)
    assert np.mean(tail2) == pytest.approx(np.mean(middle), abs=margin + 0.02)


@SETTINGS
@given(
    n=st.integers(1, 3000),
    chunk=st.integers(1, 400),
    buffer=st.integers(1, 2000),
    batch=st.integers(1, 300),
    seed=seeds,
    epoch=st.integers(0, 3),
)
def test_balanced_windows_keep_every_sample_once_and_repeat(
    n: int, chunk: int, buffer: int, batch: int, seed: int, epoch: int
) -> None:
    offsets = (chunk_offsets([chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])),)

    def plan() -> EpochPlan:
        return EpochPlan(n, offsets, batch, False, "buffer", buffer, seed=seed, epoch=epoch)

    ids = epoch_ids(plan())
    assert np.array_equal(np.sort(ids), np.arange(n))  # every sample exactly once
    assert np.array_equal(ids, epoch_ids(plan()))  # the same order for a seed
    windows = [w.size for w in plan().windows()]
    units = len(offsets[0]) - 1
    if n % chunk == 0:  # equal chunks: floor or ceil of chunks / windows each
        per = {w // chunk for w in windows}
        assert per <= {units // len(windows), -(-units // len(windows))}
    for window in plan().windows():  # each chunk read once per epoch
        assert len({p.chunk for p in window.pieces[0]}) == len(window.pieces[0])
    reads = [p.chunk for w in plan().windows() for p in w.pieces[0]]
    assert sorted(reads) == list(range(units))


def test_ranks_of_a_balanced_order_share_it() -> None:
    # rank shares and a resume cut the same balanced order: together, every sample once
    x = np.arange(10_000, dtype="i8")
    kw = {"shuffle": True, "seed": 4, "shuffle_buffer_size": 1_400}
    seen = []
    for rank in range(3):
        loader = dzb.Loader(x, 64, rank=rank, world_size=3, drop_remainder=True, **kw)
        seen.append(np.concatenate(list(loader)))
    together = np.concatenate(seen)
    assert len(np.unique(together)) == len(together)
    whole = np.concatenate(list(dzb.Loader(x, 64, **kw)))
    loader = dzb.Loader(x, 64, **kw)
    it = iter(loader)
    first = [next(it) for _ in range(40)]
    state = loader.state_dict()
    it.close()
    again = dzb.Loader(x, 64, **kw)
    again.load_state_dict(state)
    assert np.array_equal(np.concatenate([*first, *again]), whole)


@pytest.mark.parametrize("n", [65, 129, 193, 1_000, 64 * 7 + 3])
def test_an_exact_shuffle_mixes_as_one_with_a_short_last_batch(n: int) -> None:
    # its short last batch is scored against a short batch's expectation, not a full one's
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 1), chunks=(16, 1), dtype="u1")
    for seed in range(3):
        quality = dzb.plan_epoch(x, 64, shuffle=True, seed=seed).quality
        assert quality is not None and quality.mixing is not None
        assert quality.mixing >= 0.95


@SETTINGS
@given(n=st.integers(2, 3000), batch=st.integers(1, 300), chunk=st.integers(1, 300), seed=seeds)
def test_an_exact_shuffle_mixes_as_one_at_any_length(
    n: int, batch: int, chunk: int, seed: int
) -> None:
    # 300 random cases scored 0.970 at least; before, n = 65 with batch 64 scored 0.52
    x = zarr.create_array(
        zarr.storage.MemoryStore(), shape=(n, 1), chunks=(min(chunk, n), 1), dtype="u1"
    )
    quality = dzb.plan_epoch(x, batch, shuffle=True, seed=seed).quality
    assert quality is not None and quality.mixing is not None
    assert quality.mixing >= 0.95


def test_a_short_batch_scores_against_its_own_size() -> None:
    bounds = np.arange(0, 101, 10)
    counter = QualityCounter(100, batch_size=64, strata=bounds)
    order = np.random.default_rng(0).permutation(100)
    counter.add(order, np.arange(100))
    quality = counter.quality()
    short = np.bincount(np.searchsorted(bounds, order[64:], side="right") - 1)
    full = np.bincount(np.searchsorted(bounds, order[:64], side="right") - 1)

    def bits(c: np.ndarray) -> float:
        p = c[c > 0] / c.sum()
        return float(-(p * np.log2(p)).sum())

    want = (
        bits(full) / exact_mixing_bits(bounds, 64) + bits(short) / exact_mixing_bits(bounds, 36)
    ) / 2
    assert quality.mixing == pytest.approx(min(want, 1.0), rel=1e-12)
    # a batch of one sample has nothing to mix: as mixed as an exact shuffle's
    one = QualityCounter(65, batch_size=64, strata=np.arange(0, 66, 5))
    one.add(np.random.default_rng(1).permutation(65), np.arange(65))
    assert one.quality().mixing == pytest.approx(1.0, abs=0.05)


def test_the_worst_stretch_finds_a_poorly_mixed_end() -> None:
    # a mean of 0.9 can hide 10% of batches from one chunk: the worst stretch does not
    n, chunk, batch = 64_000, 640, 64
    bounds = np.arange(0, n + 1, chunk)
    rng = np.random.default_rng(3)
    mixed = rng.permutation(n - 6_400)
    tail = np.arange(n - 6_400, n)  # the last 100 batches, in stored order
    counter = QualityCounter(n, batch_size=batch, strata=bounds, batches=n // batch)
    counter.add(np.concatenate([mixed, tail]), np.arange(n))
    quality = counter.quality()
    assert quality.mixing is not None and quality.worst_mixing is not None
    assert quality.mixing > 0.85
    assert quality.worst_mixing < 0.05  # a stretch of 20 batches of one chunk each
    assert "worst stretch" in str(quality)
    exact = QualityCounter(n, batch_size=batch, strata=bounds, batches=n // batch)
    exact.add(rng.permutation(n), np.arange(n))
    assert exact.quality().worst_mixing == pytest.approx(1.0, abs=0.03)
    assert WORST_STRETCHES == 50
