"""Batch arithmetic and the batcher, tested directly (``_batching``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings

from daskzarr_batches.plan.batching import (
    Batcher,
    batches_completed,
    batches_touching,
    count_batches,
    join_rows,
    samples_used,
)

#: Byte order and structured padding that np.concatenate would drop.
ODD_DTYPES = [
    np.dtype(">i4"),
    np.dtype("<f8").newbyteorder(">"),
    np.dtype({"names": ["a", "b"], "formats": ["i1", ">f8"], "offsets": [0, 8], "itemsize": 24}),
]


@pytest.mark.parametrize(
    ("n", "size", "drop", "batches", "used"),
    [(0, 3, False, 0, 0), (10, 3, False, 4, 10), (10, 3, True, 3, 9), (9, 3, True, 3, 9),
     (2, 5, True, 0, 0), (2, 5, False, 1, 2), (1, 1, False, 1, 1)],
)  # fmt: skip
def test_counts(n: int, size: int, drop: bool, batches: int, used: int) -> None:
    assert count_batches(n, size, drop) == batches
    assert samples_used(n, size, drop) == used


@given(n=st.integers(0, 300), size=st.integers(1, 40), drop=st.booleans(), data=st.data())
@property_settings(100)
def test_batches_touching_and_completed_cover_the_epoch(
    n: int, size: int, drop: bool, data: st.DataObject
) -> None:
    used = samples_used(n, size, drop)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(used - 1, 1)), max_size=8)))
    bounds = [0, *[c for c in cuts if c < used], used] if used else [0]
    completed = 0
    for lo, hi in itertools.pairwise(bounds):
        touching = batches_touching(lo, hi - lo, size)
        assert touching == range(lo // size, (hi - 1) // size + 1)
        completed += batches_completed(lo, hi - lo, size, used)
    assert completed == count_batches(n, size, drop)


@pytest.mark.parametrize("dtype", ODD_DTYPES, ids=str)
def test_join_rows_keeps_the_exact_dtype(dtype: np.dtype) -> None:
    parts = [np.zeros(3, dtype=dtype), np.ones(2, dtype=dtype)]
    joined = join_rows(parts)
    assert joined.dtype == dtype and len(joined) == 5
    assert joined.dtype.itemsize == dtype.itemsize  # padding kept
    assert joined.tolist() == [*parts[0].tolist(), *parts[1].tolist()]


def _cut(windows: list[tuple[np.ndarray, ...]], size: int, orders: list[np.ndarray | None]) -> list:
    batcher = Batcher(size)
    batches = [b for w, o in zip(windows, orders, strict=True) for b in batcher.feed(w, o)]
    rest = batcher.finish()
    return batches + ([rest] if rest is not None else [])


@given(
    sizes=st.lists(st.integers(1, 30), max_size=6),
    batch_size=st.integers(1, 12),
    shuffled=st.booleans(),
    seed=st.integers(0, 2**16),
)
@property_settings(100)
def test_batcher_cuts_the_concatenated_order_into_batches(
    sizes: list[int], batch_size: int, shuffled: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    total = sum(sizes)
    features = np.arange(total * 2, dtype=">i4").reshape(total, 2)
    labels = np.arange(total, dtype=">f8")
    bounds = np.cumsum([0, *sizes])
    windows, orders, expected_rows = [], [], []
    for lo, hi in itertools.pairwise(bounds):
        order = rng.permutation(hi - lo) if shuffled else None
        windows.append((features[lo:hi], labels[lo:hi]))
        orders.append(order)
        expected_rows.append(np.arange(lo, hi) if order is None else lo + order)
    batches = _cut(windows, batch_size, orders)
    expected = np.concatenate(expected_rows) if expected_rows else np.empty(0, int)
    assert [len(b[0]) for b in batches] == [
        min(batch_size, total - k) for k in range(0, total, batch_size)
    ]
    got = np.concatenate([b[1] for b in batches]) if batches else np.empty(0)
    np.testing.assert_array_equal(got, labels[expected])
    for x, y in batches:
        assert x.dtype == features.dtype and y.dtype == labels.dtype  # byte order kept
        np.testing.assert_array_equal(x[:, 0], 2 * y.astype(int))  # pairs stay aligned
        assert x.flags.owndata and y.flags.owndata and x.flags.writeable


def test_batcher_copies_so_mutating_a_batch_leaves_the_window() -> None:
    window = (np.arange(10),)
    (first, *_) = _cut([window], 4, [None])
    first[0][:] = -1
    assert window[0][:4].tolist() == [0, 1, 2, 3]


def test_batcher_with_nothing_fed_has_no_last_batch() -> None:
    assert Batcher(3).finish() is None


def test_batcher_with_views_hands_out_a_batch_inside_a_window_uncopied() -> None:
    """``views=True``: a batch wholly in one window is a view of it (the window is the
    caller's), a batch across two windows a join, and shared or shuffled outputs copied."""
    x, y = np.arange(10), np.arange(10, 20)
    batcher = Batcher(4, views=True)
    first, second = batcher.feed((x, y))
    assert all(np.shares_memory(a, w) for a, w in zip(first, (x, y), strict=True))
    assert not np.shares_memory(first[0], second[0])
    (joined,) = batcher.feed((np.arange(20, 23), np.arange(30, 33)))  # 8, 9 + 20, 21
    assert joined[0].tolist() == [8, 9, 20, 21] and joined[0].flags.owndata
    one = np.arange(8)  # one buffer as both outputs: views would tie x to y
    (a, b), _ = Batcher(4, views=True).feed((one, one[:])), None
    assert not np.shares_memory(a, b) and not np.shares_memory(a, one)
    (c,) = next(Batcher(4, views=True).feed((np.arange(4),), np.array([3, 2, 1, 0])))
    assert c.tolist() == [3, 2, 1, 0] and c.flags.owndata  # a gather: a copy
