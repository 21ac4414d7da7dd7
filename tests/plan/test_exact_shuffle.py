"""Exact shuffle under a memory budget: permutation, determinism, bounded windows.

The bounds are properties of the plan (pure, no data), so they hold by
construction; a few cases also read real Zarr data to tie the plan to the
batches and stats a stream produces.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import daskzarr_batches as dzb
from daskzarr_batches.plan.budget import (
    DECODE_COPIES,
    DECODE_SHARE,
    INDEX_BYTES_PER_SAMPLE,
    exact_budget,
)
from daskzarr_batches.plan.epoch import EpochPlan


@st.composite
def exact_setups(draw: st.DrawFn) -> tuple[da.Array, dict]:
    n = draw(st.integers(0, 600))
    chunk = draw(st.integers(1, 80))
    cols = draw(st.integers(1, 4))
    row_bytes = cols * 4
    prefetch = draw(st.integers(0, 3))
    # budgets from "one sample per window" up to "whole dataset in one window"
    budget = draw(st.integers((prefetch + 1) * row_bytes, (prefetch + 1) * row_bytes * (n + 2)))
    array = da.zeros((n, cols), dtype="f4", chunks=(chunk, cols))
    return array, {
        "batch_size": draw(st.integers(1, 70)),
        "seed": draw(st.integers(0, 2**32)),
        "epoch": draw(st.integers(0, 5)),
        "memory_budget": budget,
        "prefetch": prefetch,
        "drop_remainder": draw(st.booleans()),
    }


def order_of(array: object, **kwargs: object) -> np.ndarray:
    stream = dzb.shuffled_batch_stream(array, **kwargs)  # type: ignore[arg-type]
    stream.close()  # nothing is read: only the plan is used
    parts = [np.asarray(w.samples) for w in stream.plan.windows()]
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


@given(exact_setups())
@settings(max_examples=80, deadline=None)
def test_exact_epoch_is_a_permutation_within_budget(case: tuple[da.Array, dict]) -> None:
    array, setup = case
    n, row_bytes = array.shape[0], array.shape[1] * 4
    plan = dzb.plan_epoch(array, shuffle=True, **setup)
    order = order_of(array, **setup)
    used = n - n % setup["batch_size"] if setup["drop_remainder"] else n
    # every sample at most once, exactly once without drop_remainder
    assert len(order) == used == len(set(order.tolist()))
    assert set(order.tolist()) <= set(range(n))
    if not setup["drop_remainder"]:
        assert sorted(order.tolist()) == list(range(n))
    # the windows alive at once (prefetch + 1) hold no more than the budget
    assert (setup["prefetch"] + 1) * plan.peak_window_bytes <= setup["memory_budget"]
    for window in plan.windows:
        assert window.bytes_held == window.samples * row_bytes
        for chunks in window.chunks:
            assert len(chunks) == len(set(chunks))  # each chunk decoded once per window
    # the data is read about once per window: a window decodes each chunk at most once
    window_rows = exact_budget(setup["memory_budget"], row_bytes, setup["prefetch"]).window_rows
    # (the first window cut by the ramp into pieces of 1, 4, 16, ... batches)
    ramp = np.cumsum(epoch_plan(array, **setup)._exact_ramp())
    pieces = 1 + int((ramp[:-1] < used).sum())  # the pieces that start inside the epoch
    assert plan.n_windows == math.ceil(used / window_rows) + pieces - 1
    assert all(w.bytes_decoded <= plan.dataset_bytes for w in plan.windows)


def epoch_plan(array: object, **kwargs: object) -> EpochPlan:
    stream = dzb.shuffled_batch_stream(array, **kwargs)  # type: ignore[arg-type]
    stream.close()
    return stream.plan


@given(exact_setups())
@settings(max_examples=40, deadline=None)
def test_exact_order_is_deterministic_and_independent_of_budget(
    case: tuple[da.Array, dict],
) -> None:
    array, setup = case
    first = order_of(array, **setup)
    assert np.array_equal(first, order_of(array, **setup))
    # The permutation is global: window size (budget, prefetch) only splits it.
    other = dict(setup, memory_budget=setup["memory_budget"] * 3 + 7, prefetch=0)
    assert np.array_equal(first, order_of(array, **other))


def test_epochs_and_seeds_give_different_orders() -> None:
    array = da.zeros((1000, 2), dtype="f4", chunks=(100, 2))
    base = order_of(array, batch_size=10, seed=1, epoch=0)
    assert not np.array_equal(base, order_of(array, batch_size=10, seed=1, epoch=1))
    assert not np.array_equal(base, order_of(array, batch_size=10, seed=2, epoch=0))


def budget_for(rows: int, row_bytes: int) -> int:
    """A budget whose exact windows hold ``rows`` samples (and a few more)."""
    per_window = rows * (row_bytes + INDEX_BYTES_PER_SAMPLE)
    return per_window * DECODE_SHARE // (DECODE_SHARE - DECODE_COPIES) + DECODE_SHARE


def test_quarter_budget_reads_the_data_four_times() -> None:
    array = da.zeros((10_000, 8), dtype="f4", chunks=(500, 8))
    budget = budget_for(10_000 // 4, 8 * 4)  # a quarter of the samples, their indices, decoding
    plan = dzb.plan_epoch(array, 100, shuffle=True, seed=0, memory_budget=budget, prefetch=0)
    assert plan.n_windows == 4
    assert plan.read_amplification == pytest.approx(4.0)
    # prefetching windows shares the budget: smaller windows, more reads
    plan = dzb.plan_epoch(array, 100, shuffle=True, seed=0, memory_budget=budget, prefetch=1)
    assert plan.n_windows == 8
    assert plan.read_amplification == pytest.approx(8.0)


def test_exact_shuffle_spends_the_budget_on_one_window_by_default() -> None:
    array = da.zeros((10_000, 8), dtype="f4", chunks=(500, 8))
    budget = budget_for(10_000 // 4, 8 * 4)
    plan = dzb.plan_epoch(array, 100, shuffle=True, seed=0, memory_budget=budget)
    assert plan.read_amplification == pytest.approx(4.0)
    exact = dzb.shuffled_batch_stream(array, 100, seed=0, memory_budget=budget)
    buffered = dzb.shuffled_batch_stream(array, 100, seed=0, shuffle_buffer_size=1000)
    with exact, buffered:
        assert exact.summary().read_amplification == pytest.approx(4.0)
        assert buffered.spec.prefetch == 2  # the buffer prefetches; only exact does not


@pytest.mark.parametrize("prefetch", [0, 2])
def test_exact_stream_yields_the_planned_order_and_stats(prefetch: int) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3001, 3)).astype("f4")
    labels = np.arange(3001)
    x = zarr.create_array(store={}, shape=data.shape, chunks=(250, 3), dtype="f4")
    x[:] = data
    y = zarr.create_array(store={}, shape=labels.shape, chunks=(400,), dtype="i8")
    y[:] = labels
    budget = 3001 * 3 * 4 // 3
    stream = dzb.paired_shuffled_batch_stream(
        x, y, 64, seed=5, memory_budget=budget, prefetch=prefetch
    )
    summary = stream.summary()
    batches = list(stream)
    got_x = np.concatenate([b[0] for b in batches])
    got_y = np.concatenate([b[1] for b in batches])
    assert sorted(got_y.tolist()) == list(range(3001))
    assert np.array_equal(got_x, data[got_y])
    assert np.array_equal(got_y, order_of(x, batch_size=64, seed=5, memory_budget=budget))
    assert stream.stats.read_amplification == pytest.approx(summary.read_amplification)
    assert stream.stats.windows_read == summary.n_windows
    assert summary.read_amplification > 1.0
