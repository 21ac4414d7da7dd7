"""Class-balanced and weighted sampling (issue 28): ``Loader(..., sampler=ClassSampler(...))``."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings

import daskzarr_batches as dzb
from daskzarr_batches.plan.epoch import EpochPlan

SETTINGS = property_settings(15)


def ids_array(n: int, chunk: int) -> zarr.Array:
    """Sample ``i`` holds ``i``: a batch's first column is its sample ids."""
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(n, 2), chunks=(chunk, 2), dtype="i8")
    x[:] = np.repeat(np.arange(n, dtype=np.int64)[:, None], 2, axis=1)
    return x


def sorted_labels(sizes: list[int]) -> np.ndarray:
    return np.repeat(np.arange(len(sizes)), sizes)


def epoch_ids(loader: dzb.Loader, epoch: int) -> np.ndarray:
    loader.set_epoch(epoch)
    return np.concatenate([b[:, 0] for b in loader])


@SETTINGS
@given(
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=5),
    replacement=st.booleans(),
    seed=st.integers(0, 2**16),
    batch=st.integers(1, 40),
)
def test_order_is_deterministic_per_seed_and_epoch(
    sizes: list[int], replacement: bool, seed: int, batch: int
) -> None:
    labels = sorted_labels(sizes)
    sampler = dzb.ClassSampler(labels, replacement=replacement)
    offsets = np.append(np.arange(0, len(labels), 16), len(labels))

    def order(epoch: int) -> np.ndarray:
        plan = EpochPlan(n_samples=sampler.draws, offsets=(offsets,), batch_size=batch,
                         drop_remainder=False, shuffle="exact", window_rows=50, seed=seed,
                         epoch=epoch, sampler=sampler)  # fmt: skip
        return np.concatenate([np.asarray(s) for s in plan.window_samples()])

    first = order(0)
    assert len(first) == sampler.draws
    assert np.array_equal(first, order(0))
    assert ((first >= 0) & (first < len(labels))).all()
    if not replacement:
        assert len(np.unique(first)) == len(first)  # distinct samples
        counts = np.bincount(labels[first], minlength=len(sizes))
        assert np.array_equal(counts, sampler.class_counts())
        assert counts.max() - counts.min() <= 1  # balanced
    if len(np.unique(first)) > 5:  # another epoch, another order
        assert not np.array_equal(first, order(1))


@SETTINGS
@given(
    weights=st.lists(st.floats(0.0, 5.0), min_size=3, max_size=3).filter(lambda w: sum(w) > 0.3),
    seed=st.integers(0, 1000),
)
def test_frequencies_follow_the_weights(weights: list[float], seed: int) -> None:
    labels = sorted_labels([50, 300, 650])
    sampler = dzb.ClassSampler(labels, weights, num_samples=20_000)
    ids = sampler.order(np.random.default_rng(seed))
    share = np.bincount(labels[ids], minlength=3) / len(ids)
    want = np.asarray(weights) / sum(weights)
    assert np.abs(share - want).max() < 0.02  # binomial sd <= 0.0036: 5 sd
    exact = dzb.ClassSampler(labels, dict(enumerate(weights)), replacement=False, num_samples=40)
    counts = np.bincount(labels[exact.order(np.random.default_rng(seed))], minlength=3)
    assert counts.sum() == 40 and (counts <= [50, 300, 650]).all()
    assert np.abs(counts - want * 40).max() < 1 + 1e-9 or (counts == [50, 300, 650]).any()


def test_loader_resumes_exactly_mid_epoch_and_ranks_share_the_draws() -> None:
    labels = sorted_labels([600, 250, 100, 50])
    x = ids_array(len(labels), 64)
    for replacement in (True, False):
        sampler = dzb.ClassSampler(labels, replacement=replacement)
        whole = epoch_ids(dzb.Loader(x, 16, shuffle=True, seed=3, sampler=sampler), 1)
        assert len(whole) == sampler.draws
        share = np.bincount(labels[whole], minlength=4) / len(whole)
        assert np.abs(share - 0.25).max() < (0.06 if replacement else 0.01)
        loader = dzb.Loader(x, 16, shuffle=True, seed=3, sampler=sampler)
        loader.set_epoch(1)
        batches = iter(loader)
        head = [next(batches)[:, 0] for _ in range(5)]
        state = loader.state_dict()
        batches.close()
        again = dzb.Loader(x, 16, shuffle=True, seed=3, sampler=sampler)
        again.load_state_dict(state)
        rest = np.concatenate([b[:, 0] for b in again])
        assert np.array_equal(np.concatenate([*head, rest]), whole)
        other = dzb.Loader(
            x, 16, shuffle=True, seed=3, sampler=dzb.ClassSampler(labels, [1, 1, 1, 2])
        )
        with pytest.raises(dzb.ArgumentValueError, match="another order"):
            other.load_state_dict(state)
        ranks = [
            epoch_ids(
                dzb.Loader(x, 16, shuffle=True, seed=3, sampler=sampler, rank=r, world_size=2), 1
            )
            for r in range(2)
        ]
        assert np.array_equal(np.sort(np.concatenate(ranks)), np.sort(whole))


def test_sampler_errors() -> None:
    labels = sorted_labels([10, 20])
    x = ids_array(30, 8)
    with pytest.raises(dzb.ArgumentValueError, match="shuffle=True"):
        dzb.Loader(x, 4, sampler=dzb.ClassSampler(labels))
    with pytest.raises(dzb.ArgumentValueError, match="shuffle=True"):
        dzb.Loader(x, 4, shuffle=True, shuffle_buffer_size=8, sampler=dzb.ClassSampler(labels))
    with pytest.raises(dzb.LengthMismatchError, match="labels"):
        dzb.Loader(ids_array(31, 8), 4, shuffle=True, sampler=dzb.ClassSampler(labels))
    with pytest.raises(dzb.ArgumentValueError, match="not in the labels"):
        dzb.ClassSampler(labels, {5: 1.0})
    with pytest.raises(dzb.ArgumentValueError, match="not all 0"):
        dzb.ClassSampler(labels, [0, 0])
    with pytest.raises(dzb.ArgumentValueError, match="exceeds"):
        dzb.ClassSampler(labels, replacement=False, num_samples=31)
    with pytest.raises(dzb.ArgumentTypeError, match="discrete"):
        dzb.ClassSampler(np.zeros(4))
    sampler = dzb.ClassSampler(labels, replacement=False)
    assert sampler.draws == 20 and list(sampler.class_counts()) == [10, 10]
    assert "2 classes" in repr(sampler)
