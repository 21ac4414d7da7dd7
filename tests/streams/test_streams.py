"""Batch streams through the public API, over every input kind.

Property tests draw shapes (empty axis 0, zero-width axes, 1-D to 3-D), chunk
grids, batch sizes, buffer sizes and seeds; inputs are numpy arrays, Zarr
arrays (formats 2 and 3), general dask arrays and dask arrays over Zarr.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
import subprocess
import sys
import threading
import time
import weakref
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from stores import CountingStore, LatencyStore, chunk_keys, open_wrapped
from strategies import (
    ArrayCase,
    array_cases,
    build_input,
    irregular_chunks,
    make_data,
    property_settings,
    regular_chunks,
    sample_ids,
    seeds,
    to_dask,
    to_zarr,
)

import daskzarr_batches as dzb

PROPERTY = property_settings(40)
BUFFERS = st.one_of(st.none(), st.integers(1, 45))
#: Small windows, so that an epoch spans many windows and batches straddle them.
WINDOW_BYTES = st.integers(1, 3000)
MEMORY_BUDGETS = st.one_of(st.just(2**30), st.integers(1, 5000))


def consume(stream: Any) -> list[Any]:
    with stream:
        return list(stream)


def concat(batches: list[np.ndarray], like: np.ndarray) -> np.ndarray:
    if not batches:
        return like[:0]
    return np.concatenate(batches)


def touched_chunks(chunk_rows: tuple[int, ...], used: int) -> int:
    """Axis-0 chunks holding at least one of samples ``[0, used)``."""
    starts = np.concatenate([[0], np.cumsum(chunk_rows)])
    return sum(1 for lo, hi in itertools.pairwise(starts) if hi > lo and lo < used)


def check_batch_sizes(batches: list[np.ndarray], n_used: int, batch_size: int) -> None:
    sizes = [len(b) for b in batches]
    assert sum(sizes) == n_used
    assert all(size == batch_size for size in sizes[:-1])
    assert not sizes or 0 < sizes[-1] <= batch_size


def check_owned(batches: list[Any], source: np.ndarray | None) -> None:
    arrays = [
        part for batch in batches for part in (batch if isinstance(batch, tuple) else (batch,))
    ]
    for a, b in itertools.combinations(arrays, 2):
        assert not np.shares_memory(a, b)
    for a in arrays:
        assert a.flags.writeable
        if source is not None:
            assert not np.shares_memory(a, source)


def ids_of(batch: np.ndarray, n: int) -> np.ndarray:
    return sample_ids(batch) if batch.size else np.full(len(batch), -1)


# --------------------------------------------------------------------------
# Sequential


@PROPERTY
@given(case=array_cases(), data=st.data(), drop=st.booleans(), prefetch=st.integers(0, 3))
def test_sequential_batches_concatenate_to_the_array(
    case: ArrayCase, data: st.DataObject, drop: bool, prefetch: int
) -> None:
    batch_size = data.draw(st.integers(1, case.n + 3), label="batch_size")
    window_bytes = data.draw(WINDOW_BYTES, label="window_bytes")
    stream = dzb.batch_stream(
        case.array,
        batch_size,
        drop_remainder=drop,
        prefetch=prefetch,
        window_bytes=window_bytes,
    )
    expected_len = dzb.count_batches(case.array, batch_size, drop_remainder=drop)
    assert len(stream) == expected_len
    batches = consume(stream)
    assert len(batches) == expected_len
    used = (case.n // batch_size) * batch_size if drop else case.n
    check_batch_sizes(batches, used, batch_size)
    np.testing.assert_array_equal(concat(batches, case.data), case.data[:used])
    assert all(b.dtype == case.data.dtype for b in batches)
    assert all(b.shape[1:] == case.data.shape[1:] for b in batches)
    check_owned(batches, case.data)
    stats = stream.stats
    assert stats.items_yielded == len(batches)
    assert stats.samples_yielded == used
    assert stats.bytes_yielded == sum(b.nbytes for b in batches)
    if case.chunks is not None:
        assert stats.chunks_read == touched_chunks(case.chunks[0], used)
    if not drop:
        assert stats.read_amplification <= 1.0
        assert stats.bytes_read == case.data.nbytes


# --------------------------------------------------------------------------
# Shuffled


@PROPERTY
@given(
    case=array_cases(),
    data=st.data(),
    buffer=BUFFERS,
    seed=seeds,
    drop=st.booleans(),
)
def test_shuffled_rows_are_a_permutation(
    case: ArrayCase, data: st.DataObject, buffer: int | None, seed: int, drop: bool
) -> None:
    batch_size = data.draw(st.integers(1, case.n + 3), label="batch_size")
    stream = dzb.shuffled_batch_stream(
        case.array,
        batch_size,
        seed=seed,
        shuffle_buffer_size=buffer,
        drop_remainder=drop,
        memory_budget=data.draw(MEMORY_BUDGETS, label="memory_budget"),
        prefetch=data.draw(st.integers(0, 3), label="prefetch"),
    )
    batches = consume(stream)
    assert (
        len(batches)
        == len(stream)
        == dzb.count_batches(case.array, batch_size, drop_remainder=drop)
    )
    used = (case.n // batch_size) * batch_size if drop else case.n
    check_batch_sizes(batches, used, batch_size)
    assert all(b.dtype == case.data.dtype for b in batches)
    check_owned(batches, case.data)
    rows = concat(batches, case.data)
    assert rows.shape == (used, *case.data.shape[1:])
    if rows.size:
        ids = sample_ids(rows)
        assert len(np.unique(ids)) == used
        if not drop:
            np.testing.assert_array_equal(np.sort(ids), np.arange(case.n))
        np.testing.assert_array_equal(rows, case.data[ids])
    if buffer is not None and not drop:
        if case.chunks is not None:
            assert stream.stats.chunks_read == touched_chunks(case.chunks[0], case.n)
        assert stream.stats.read_amplification <= 1.0


@property_settings(25)
@given(
    case=array_cases(min_rows=1, kinds=("zarr3", "zarrs", "dask", "numpy")),
    data=st.data(),
    buffer=BUFFERS,
    seed=seeds,
)
def test_same_seed_same_batches_across_prefetch(
    case: ArrayCase, data: st.DataObject, buffer: int | None, seed: int
) -> None:
    batch_size = data.draw(st.integers(1, case.n + 3), label="batch_size")
    budget = data.draw(MEMORY_BUDGETS, label="memory_budget")
    runs = [
        consume(
            dzb.shuffled_batch_stream(
                case.array,
                batch_size,
                seed=seed,
                shuffle_buffer_size=buffer,
                prefetch=prefetch,
                memory_budget=budget,
            )
        )
        for prefetch in range(4)
    ]
    for run in runs[1:]:
        assert len(run) == len(runs[0])
        for a, b in zip(run, runs[0], strict=True):
            np.testing.assert_array_equal(a, b)


def test_seed_none_draws_fresh_order_and_reports_its_seed() -> None:
    data = make_data((200, 2))
    first = dzb.shuffled_batch_stream(data, 200, seed=None)
    second = dzb.shuffled_batch_stream(data, 200, seed=None)
    a, b = consume(first)[0], consume(second)[0]
    assert not np.array_equal(a, b)
    assert first.seed is not None
    again = consume(dzb.shuffled_batch_stream(data, 200, seed=first.seed))[0]
    np.testing.assert_array_equal(again, a)


def test_seed_defaults_to_0_everywhere() -> None:
    """One default for ``seed`` on every public callable that takes one: 0 (a run repeats)."""
    import inspect

    takes = {}
    for name in dzb.__all__:
        value = getattr(dzb, name)
        if (callable(value) and not isinstance(value, type)) or name == "Loader":  # no Mixture
            parameters = inspect.signature(value).parameters
            if "seed" in parameters:
                takes[name] = parameters["seed"].default
    assert {"shuffled_batch_stream", "patch_stream", "plan_epoch", "Loader", "mix"} <= set(takes)
    assert set(takes.values()) == {0}, takes
    data = make_data((60, 2))
    default = consume(dzb.shuffled_batch_stream(data, 60))[0]
    np.testing.assert_array_equal(default, consume(dzb.shuffled_batch_stream(data, 60, seed=0))[0])
    assert dzb.shuffled_batch_stream(data, 60).seed == 0


def test_epochs_of_a_seed_differ_and_repeat() -> None:
    z = to_zarr(make_data((120, 3)), (10, 3))

    def run(epoch: int, buffer: int | None) -> np.ndarray:
        stream = dzb.shuffled_batch_stream(z, 7, seed=11, epoch=epoch, shuffle_buffer_size=buffer)
        return np.concatenate(consume(stream))

    for buffer in (None, 30):
        e0, e1 = run(0, buffer), run(1, buffer)
        assert not np.array_equal(e0, e1)
        np.testing.assert_array_equal(run(1, buffer), e1)


# --------------------------------------------------------------------------
# Paired


@st.composite
def paired_cases(draw: st.DrawFn) -> tuple[ArrayCase, ArrayCase]:
    features = draw(array_cases(min_width=1))
    label_shape = (features.n, *draw(st.lists(st.integers(1, 3), max_size=1)))
    label_data = np.arange(features.n * int(np.prod(label_shape[1:]))).reshape(label_shape)
    label_data = label_data.astype(draw(st.sampled_from(["int64", "float32", "uint16"])))
    labels = build_input(
        draw(st.sampled_from(["numpy", "zarr2", "zarr3", "dask", "dask_zarr"])),
        label_data,
        draw(regular_chunks(label_shape)),
        draw(irregular_chunks(label_shape)),
    )
    return features, labels


def check_pairs(
    pairs: list[tuple[np.ndarray, np.ndarray]], features: ArrayCase, labels: ArrayCase
) -> None:
    for f, y in pairs:
        assert isinstance(f, np.ndarray) and isinstance(y, np.ndarray)
        assert len(f) == len(y)
        assert f.dtype == features.data.dtype and y.dtype == labels.data.dtype
        if len(f):
            np.testing.assert_array_equal(sample_ids(f), sample_ids(y))
            np.testing.assert_array_equal(y, labels.data[sample_ids(f)])


@PROPERTY
@given(cases=paired_cases(), data=st.data(), buffer=BUFFERS, seed=seeds, drop=st.booleans())
def test_paired_rows_stay_aligned(
    cases: tuple[ArrayCase, ArrayCase],
    data: st.DataObject,
    buffer: int | None,
    seed: int,
    drop: bool,
) -> None:
    features, labels = cases
    batch_size = data.draw(st.integers(1, features.n + 3), label="batch_size")
    expected = dzb.count_batches(features.array, batch_size, drop_remainder=drop)
    sequential = dzb.paired_batch_stream(
        features.array,
        labels.array,
        batch_size,
        drop_remainder=drop,
        window_bytes=data.draw(WINDOW_BYTES, label="window_bytes"),
    )
    pairs = consume(sequential)
    assert len(pairs) == len(sequential) == expected
    check_pairs(pairs, features, labels)
    check_owned(pairs, None)
    used = (features.n // batch_size) * batch_size if drop else features.n
    np.testing.assert_array_equal(
        concat([f for f, _ in pairs], features.data), features.data[:used]
    )

    shuffled = dzb.paired_shuffled_batch_stream(
        features.array,
        labels.array,
        batch_size,
        seed=seed,
        shuffle_buffer_size=buffer,
        drop_remainder=drop,
        memory_budget=data.draw(MEMORY_BUDGETS, label="memory_budget"),
    )
    pairs = consume(shuffled)
    assert len(pairs) == len(shuffled) == expected
    check_pairs(pairs, features, labels)
    check_owned(pairs, features.data)
    ids = sample_ids(concat([f for f, _ in pairs], features.data))
    assert len(ids) == used and len(np.unique(ids)) == used


@pytest.mark.parametrize("buffer", [None, 1, 10, 25])
@pytest.mark.parametrize("kind", ["zarr", "dask"])
def test_paired_with_chunks_7_and_3(buffer: int | None, kind: str) -> None:
    n = 50
    x, y = make_data((n, 4), "float32"), make_data((n,), "int64")
    features: Any
    labels: Any
    if kind == "zarr":
        features, labels = to_zarr(x, (7, 4)), to_zarr(y, (3,), zarr_format=2)
    else:
        features, labels = to_dask(x, (7, 2)), to_dask(y, 3)
    stream = dzb.paired_shuffled_batch_stream(
        features, labels, 6, seed=5, shuffle_buffer_size=buffer
    )
    pairs = consume(stream)
    assert len(pairs) == 9
    ids = np.concatenate([sample_ids(f) for f, _ in pairs])
    np.testing.assert_array_equal(np.sort(ids), np.arange(n))
    for f, labels_batch in pairs:
        np.testing.assert_array_equal(labels_batch, sample_ids(f))
    if buffer is not None and buffer >= 21:  # blocks of lcm(7, 3) = 21 rows fit the buffer
        assert stream.stats.chunks_read == 8 + 17
        assert stream.stats.read_amplification <= 1.0


def test_same_seed_same_pairs_across_prefetch() -> None:
    x, y = to_zarr(make_data((61, 2)), (7, 2)), to_zarr(make_data((61,)), (3,))
    for buffer in (None, 12):
        runs = [
            consume(
                dzb.paired_shuffled_batch_stream(
                    x, y, 5, seed=3, shuffle_buffer_size=buffer, prefetch=prefetch
                )
            )
            for prefetch in range(4)
        ]
        for run in runs[1:]:
            for (f, y_batch), (f0, y0) in zip(run, runs[0], strict=True):
                np.testing.assert_array_equal(f, f0)
                np.testing.assert_array_equal(y_batch, y0)


# --------------------------------------------------------------------------
# Ownership


@pytest.mark.parametrize("kind", ["numpy", "zarr3", "dask", "dask_zarr"])
@pytest.mark.parametrize("batch_size", [1, 4, 5, 30])
@pytest.mark.parametrize("shuffle", ["none", "buffer", "exact"])
def test_mutating_a_batch_changes_nothing_else(kind: str, batch_size: int, shuffle: str) -> None:
    data = make_data((23, 3), "float64")
    original = data.copy()
    case = build_input(kind, data, (5, 2), ((5, 10, 8), (1, 2)))
    if shuffle == "none":
        stream = dzb.batch_stream(case.array, batch_size)
    else:
        buffer = 6 if shuffle == "buffer" else None
        stream = dzb.shuffled_batch_stream(
            case.array, batch_size, seed=1, shuffle_buffer_size=buffer
        )
    batches = consume(stream)
    copies = [b.copy() for b in batches]
    for batch in batches:
        batch[...] = -1
    np.testing.assert_array_equal(data, original)
    for batch, copy in zip(batches[1:], copies[1:], strict=True):
        batch[...] = copy  # restore; the first is still -1
    for batch, copy in zip(batches[1:], copies[1:], strict=True):
        np.testing.assert_array_equal(batch, copy)
    assert np.all(batches[0] == -1)
    # the source still reads the same
    again = np.concatenate(consume(dzb.batch_stream(case.array, 7)))
    np.testing.assert_array_equal(again, original)


# --------------------------------------------------------------------------
# Read once, measured at the store


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("batch_size", [1, 3, 7, 16, 100])
@pytest.mark.parametrize("mode", ["sequential", "buffered", "buffered-large", "paired"])
def test_every_stored_chunk_is_fetched_once_per_epoch(
    zarr_format: int, batch_size: int, mode: str
) -> None:
    data = make_data((53, 6), "float32") + 1  # no chunk equals the fill value
    memory = zarr.storage.MemoryStore()
    to_zarr(data, (5, 4), zarr_format=zarr_format, store=memory)
    keys = chunk_keys(memory)
    assert len(keys) == 11 * 2
    store = CountingStore(memory)
    array = open_wrapped(store)
    labels = to_zarr(make_data((53,)), (3,))

    def make(epoch: int) -> Any:
        if mode == "sequential":
            return dzb.batch_stream(array, batch_size, window_bytes=6 * 4 * 12)
        if mode == "paired":
            return dzb.paired_batch_stream(array, labels, batch_size, window_bytes=32 * 30)
        buffer = 8 if mode == "buffered" else 40
        return dzb.shuffled_batch_stream(
            array, batch_size, seed=2, epoch=epoch, shuffle_buffer_size=buffer
        )

    for epoch in range(2):
        store.counts.clear()
        stream = make(epoch)
        batches = consume(stream)
        assert dict(store.counts) == dict.fromkeys(keys, 1), f"epoch {epoch}"
        assert stream.stats.chunks_read == (11 + 18 if mode == "paired" else 11)
        assert stream.stats.read_amplification <= 1.0
        rows = np.concatenate([b[0] if isinstance(b, tuple) else b for b in batches])
        np.testing.assert_array_equal(np.sort(rows[:, 0]), data[:, 0])


def test_open_array_result_is_read_once_too() -> None:
    memory = zarr.storage.MemoryStore()
    to_zarr(make_data((40, 5), "int32") + 1, (6, 5), store=memory)
    store = CountingStore(memory)
    array = dzb.open_array(store)
    store.counts.clear()
    consume(dzb.batch_stream(array, 4))
    assert dict(store.counts) == dict.fromkeys(chunk_keys(memory), 1)


# --------------------------------------------------------------------------
# Lifecycle: close, context manager, break


def dzb_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dzb-")]


def wait_for_no_dzb_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t for t in dzb_threads() if t not in before]
        if not left:
            return []
        gc.collect()
        time.sleep(0.02)
    return left


def big_input() -> Any:
    return to_zarr(make_data((400, 4)), (10, 4))


def test_close_stops_the_stream_and_its_threads() -> None:
    before = set(dzb_threads())
    stream = dzb.batch_stream(big_input(), 3, window_bytes=200, prefetch=3)
    first = next(stream)
    assert first.shape == (3, 4)
    stream.close()
    with pytest.raises(StopIteration):
        next(stream)
    stream.close()  # idempotent
    assert wait_for_no_dzb_threads(before) == []


def test_context_manager_and_break_early() -> None:
    before = set(dzb_threads())
    array = big_input()
    with dzb.shuffled_batch_stream(array, 5, seed=0, shuffle_buffer_size=20, prefetch=2) as stream:
        for index, _ in enumerate(stream):
            if index == 2:
                break
    assert stream.stats.items_yielded == 3
    with pytest.raises(StopIteration):
        next(stream)
    assert wait_for_no_dzb_threads(before) == []


def test_break_without_close_is_released_on_garbage_collection() -> None:
    before = set(dzb_threads())
    for _ in dzb.batch_stream(big_input(), 3, window_bytes=200):
        break
    gc.collect()
    assert wait_for_no_dzb_threads(before) == []


@pytest.mark.parametrize("shuffle_buffer_size", [None, 20])
def test_a_stream_dropped_with_windows_left_is_finalised_by_reference_counting(
    shuffle_buffer_size: int | None,
) -> None:
    # Nothing holds the stream but the caller (its windows generator does not).
    gc.disable()
    try:
        if shuffle_buffer_size is None:
            stream = dzb.batch_stream(big_input(), 3, window_bytes=200)
        else:
            stream = dzb.shuffled_batch_stream(
                big_input(), 3, seed=0, shuffle_buffer_size=shuffle_buffer_size
            )
        next(stream)
        next(stream)
        runner = stream._runner._drivers  # type: ignore[union-attr]
        alive = weakref.ref(stream)
        del stream
        assert alive() is None
        assert runner._shutdown
    finally:
        gc.enable()


def test_error_in_consumer_closes_the_stream() -> None:
    before = set(dzb_threads())
    stream = dzb.batch_stream(big_input(), 3, window_bytes=200)
    with pytest.raises(RuntimeError, match="consumer"), stream:
        for _ in stream:
            raise RuntimeError("consumer failed")
    assert wait_for_no_dzb_threads(before) == []


def test_exhausted_stream_stays_exhausted() -> None:
    stream = dzb.batch_stream(make_data((10, 2)), 4)
    assert len(list(stream)) == 3
    assert list(stream) == []
    assert iter(stream) is stream


def test_empty_streams_yield_nothing() -> None:
    empty = make_data((0, 3))
    for stream in (
        dzb.batch_stream(empty, 4),
        dzb.shuffled_batch_stream(empty, 4, seed=1),
        dzb.shuffled_batch_stream(to_zarr(empty, (2, 3)), 4, shuffle_buffer_size=3),
        dzb.paired_batch_stream(empty, make_data((0,)), 4),
    ):
        assert len(stream) == 0
        assert consume(stream) == []
        assert stream.stats.read_amplification == 0.0


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_prefetch_bounds_the_windows_in_flight(prefetch: int) -> None:
    """One chunk a window: chunk reads at once never exceed prefetch + 1."""
    memory = zarr.storage.MemoryStore()
    data = make_data((40, 2), "float64") + 1
    to_zarr(data, (4, 2), store=memory)
    store = LatencyStore(memory, delay=0.03)
    array = open_wrapped(store)
    stream = dzb.batch_stream(array, 4, prefetch=prefetch, window_bytes=4 * 2 * 8)
    batches = []
    for batch in stream:
        time.sleep(0.01)
        batches.append(batch)
    np.testing.assert_array_equal(np.concatenate(batches), data)
    assert store.requests == 10
    assert store.peak <= prefetch + 1
    if prefetch >= 1:
        assert store.peak >= 2, "windows ahead of the consumer were not computed"


# --------------------------------------------------------------------------
# Fast start


@pytest.mark.parametrize(
    ("kind", "first_chunks"),
    [("sequential", 1), ("buffered", 10), ("paired", 1), ("exact", 3), ("chunks", 1)],
)
def test_first_batch_waits_for_one_chunk_and_is_timed(kind: str, first_chunks: int) -> None:
    # With prefetch 0 nothing is read ahead: the first batch costs the first
    # window's chunks only (sequential: the ramp's one unit; buffered: the whole
    # first buffer, read concurrently, so the first batch mixes all of it; exact:
    # the ramp's first piece, one batch of 3 samples, at most 3 chunks), and
    # stats time it.
    data = make_data((40, 2), "float64")
    x = to_zarr(data, (4, 2))
    big = 10 * 4 * 2 * 8  # windows of the whole array without the ramp
    stream: Any = {
        "sequential": lambda: dzb.batch_stream(x, 3, prefetch=0, window_bytes=big),
        "buffered": lambda: dzb.shuffled_batch_stream(
            x, 3, seed=1, shuffle_buffer_size=40, prefetch=0
        ),
        "paired": lambda: dzb.paired_batch_stream(x, x, 3, prefetch=0, window_bytes=2 * big),
        "exact": lambda: dzb.shuffled_batch_stream(x, 3, seed=1, prefetch=0),
        "chunks": lambda: dzb.chunk_stream(x, concurrency=1),
    }[kind]()
    assert stream.stats.time_to_first_batch is None
    next(stream)
    waited = stream.stats.time_to_first_batch
    assert waited is not None and waited > 0
    per_array = stream.stats.chunks_read // (2 if kind == "paired" else 1)
    if kind == "exact":  # the chunks of one batch's samples
        assert 1 <= per_array <= first_chunks
    else:
        assert per_array == first_chunks
    rest = list(stream)
    assert stream.stats.time_to_first_batch == waited  # set once
    assert len(rest) == len(stream) - 1
    assert "time_to_first_batch=" in repr(stream.stats)


# --------------------------------------------------------------------------
# Scheduler independence


def test_same_batches_on_the_threaded_scheduler_and_a_distributed_client() -> None:
    distributed = pytest.importorskip("distributed")
    features = to_zarr(make_data((50, 3), "float32"), (7, 3))
    labels = to_zarr(make_data((50,)), (3,), zarr_format=2)

    def runs() -> list[list[Any]]:
        return [
            consume(dzb.batch_stream(features, 6, window_bytes=100)),
            consume(dzb.shuffled_batch_stream(features, 6, seed=4, memory_budget=400)),
            consume(dzb.shuffled_batch_stream(features, 6, seed=4, shuffle_buffer_size=10)),
            consume(
                dzb.paired_shuffled_batch_stream(
                    features, labels, 6, seed=9, shuffle_buffer_size=21
                )
            ),
            consume(dzb.chunk_stream(features)),
        ]

    local = runs()
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_cluster = runs()
        explicit = consume(
            dzb.shuffled_batch_stream(features, 6, seed=4, shuffle_buffer_size=10, client=client)
        )
    for a_run, b_run in zip([*local, local[2]], [*on_cluster, explicit], strict=True):
        assert len(a_run) == len(b_run)
        for a, b in zip(a_run, b_run, strict=True):
            for x, y in zip(
                a if isinstance(a, tuple) else (a,),
                b if isinstance(b, tuple) else (b,),
                strict=True,
            ):
                np.testing.assert_array_equal(x, y)
    assert dzb.execute.runners.resolve_client(None) is None  # the closed client is not used later


SUBPROCESS_EPOCH = """
import hashlib, sys
import numpy as np, zarr
import daskzarr_batches as dzb
data = np.arange(61 * 3, dtype="float32").reshape(61, 3)
z = zarr.create_array(zarr.storage.MemoryStore(), shape=data.shape, chunks=(7, 3), dtype=data.dtype)
z[...] = data
digest = hashlib.sha256()
for buffer in (None, 10):
    for batch in dzb.shuffled_batch_stream(z, 5, seed=123, shuffle_buffer_size=buffer):
        digest.update(batch.tobytes())
print(digest.hexdigest())
"""


def test_same_seed_same_batches_across_processes() -> None:
    data = make_data((61, 3), "float32")
    z = to_zarr(data, (7, 3))
    digest = hashlib.sha256()
    for buffer in (None, 10):
        for batch in consume(dzb.shuffled_batch_stream(z, 5, seed=123, shuffle_buffer_size=buffer)):
            digest.update(batch.tobytes())
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": root}
        result = subprocess.run(
            [sys.executable, "-c", SUBPROCESS_EPOCH],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        assert result.stdout.strip() == digest.hexdigest()


@pytest.mark.parametrize("batch_size", [1, 4, 9, 50])
@pytest.mark.parametrize("buffer", ["sequential", 1, 7, 100])
def test_every_dask_block_is_computed_once_per_epoch(batch_size: int, buffer: Any) -> None:
    """A general dask array (chunked along both axes): each block task runs once."""
    data = make_data((31, 5), "float64")
    calls: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def record(block: np.ndarray, block_info: Any = None) -> np.ndarray:
        with lock:
            calls.append(tuple(block_info[0]["chunk-location"]))
        return block

    chunks = ((3, 7, 0, 10, 11), (2, 3))
    counted = da.map_blocks(record, to_dask(data, chunks), dtype=data.dtype)
    if buffer == "sequential":
        stream = dzb.batch_stream(counted, batch_size, window_bytes=5 * 8 * 8)
    else:
        stream = dzb.shuffled_batch_stream(counted, batch_size, seed=1, shuffle_buffer_size=buffer)
    rows = np.concatenate(consume(stream))
    np.testing.assert_array_equal(np.sort(sample_ids(rows)), np.arange(31))
    expected = [(i, j) for i in (0, 1, 3, 4) for j in (0, 1)]
    assert sorted(calls) == expected
    assert stream.stats.chunks_read == 4
    assert stream.stats.read_amplification <= 1.0
