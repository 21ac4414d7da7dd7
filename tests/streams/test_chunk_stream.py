"""``chunk_stream``: one array per stored chunk over the whole chunk grid."""

from __future__ import annotations

import itertools
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from stores import LatencyStore, open_wrapped
from strategies import ArrayCase, array_cases, build_input, make_data, property_settings, to_zarr

import daskzarr_batches as dzb

PROPERTY = property_settings(40)


def consume(stream: Any) -> list[Any]:
    with stream:
        return list(stream)


def grid_offsets(chunks: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
    return [np.concatenate([[0], np.cumsum(sizes)]) for sizes in chunks]


def nonempty_blocks(chunks: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
    return list(itertools.product(*([i for i, s in enumerate(sizes) if s > 0] for sizes in chunks)))


def reassemble(items: list[tuple[tuple[int, ...], np.ndarray]], like: np.ndarray) -> np.ndarray:
    """Place each chunk by its block index, using sizes seen along each axis."""
    sizes: list[dict[int, int]] = [{} for _ in range(like.ndim)]
    for index, chunk in items:
        for axis, (i, size) in enumerate(zip(index, chunk.shape, strict=True)):
            assert sizes[axis].setdefault(i, size) == size, "inconsistent chunk sizes"
    # empty chunks are never yielded: their size along the axis is 0
    offsets = [
        np.concatenate([[0], np.cumsum([s.get(i, 0) for i in range(max(s, default=-1) + 1)])])
        for s in sizes
    ]
    out = np.full(like.shape, 0, dtype=like.dtype)
    seen = np.zeros(like.shape, dtype=np.int64)
    for index, chunk in items:
        where = tuple(
            slice(int(off[i]), int(off[i]) + n)
            for off, i, n in zip(offsets, index, chunk.shape, strict=True)
        )
        out[where] = chunk
        seen[where] += 1
    assert np.all(seen == 1), "chunks overlap or leave gaps"
    return out


@PROPERTY
@given(case=array_cases(), concurrency=st.integers(1, 4))
def test_chunks_reassemble_the_array(case: ArrayCase, concurrency: int) -> None:
    stream = dzb.chunk_stream(case.array, with_index=True, concurrency=concurrency)
    items = consume(stream)
    assert len(items) == len(stream) == stream.stats.items_yielded
    for index, chunk in items:
        assert isinstance(index, tuple) and all(isinstance(i, int) for i in index)
        assert len(index) == case.data.ndim
        assert isinstance(chunk, np.ndarray) and chunk.dtype == case.data.dtype
    indices = [index for index, _ in items]
    assert indices == sorted(indices), "ordered=True must give C order of block index"
    if case.data.size == 0:
        assert items == []
        return
    np.testing.assert_array_equal(reassemble(items, case.data), case.data)
    if case.chunks is not None:  # the stored grid, edge chunks cropped
        assert indices == nonempty_blocks(case.chunks)
        offsets = grid_offsets(case.chunks)
        for index, chunk in items:
            expected = tuple(case.chunks[axis][i] for axis, i in enumerate(index))
            assert chunk.shape == expected
            where = tuple(
                slice(int(offsets[a][i]), int(offsets[a][i + 1])) for a, i in enumerate(index)
            )
            np.testing.assert_array_equal(chunk, case.data[where])
    assert stream.stats.chunks_read == len(items)
    assert stream.stats.bytes_yielded == case.data.nbytes


@PROPERTY
@given(case=array_cases(min_rows=1), concurrency=st.integers(1, 4))
def test_unordered_yields_the_same_chunks(case: ArrayCase, concurrency: int) -> None:
    ordered = consume(dzb.chunk_stream(case.array, with_index=True))
    unordered = consume(
        dzb.chunk_stream(case.array, with_index=True, ordered=False, concurrency=concurrency)
    )
    assert sorted(i for i, _ in unordered) == [i for i, _ in ordered]
    by_index = dict(ordered)
    for index, chunk in unordered:
        np.testing.assert_array_equal(chunk, by_index[index])


def test_bare_arrays_without_index() -> None:
    data = make_data((10, 4))
    chunks = consume(dzb.chunk_stream(to_zarr(data, (4, 4))))
    assert [c.shape for c in chunks] == [(4, 4), (4, 4), (2, 4)]
    np.testing.assert_array_equal(np.concatenate(chunks), data)


@pytest.mark.parametrize("kind", ["numpy", "zarr3", "dask", "dask_zarr"])
def test_chunks_are_owned(kind: str) -> None:
    data = make_data((12, 5), "float32")
    original = data.copy()
    case = build_input(kind, data, (4, 2), ((4, 8), (2, 3)))
    chunks = consume(dzb.chunk_stream(case.array))
    for a, b in itertools.combinations(chunks, 2):
        assert not np.shares_memory(a, b)
    for chunk in chunks:
        assert not np.shares_memory(chunk, data)
        chunk[...] = -1
    np.testing.assert_array_equal(data, original)
    again = consume(dzb.chunk_stream(case.array))
    assert all(np.all(c != -1) for c in again)


@pytest.mark.parametrize("kind", ["numpy", "zarr2", "zarr3", "dask"])
@pytest.mark.parametrize("shape", [(0,), (0, 3), (5, 0), (0, 0, 2)])
def test_empty_array_yields_nothing(kind: str, shape: tuple[int, ...]) -> None:
    data = make_data(shape)
    case = build_input(kind, data, tuple(2 for _ in shape), tuple((s,) for s in shape))
    stream = dzb.chunk_stream(case.array)
    assert len(stream) == 0
    assert consume(stream) == []


# --------------------------------------------------------------------------
# Concurrency, measured at a slow store


def slow_array(delay: float) -> tuple[zarr.Array, LatencyStore]:
    memory = zarr.storage.MemoryStore()
    to_zarr(make_data((24, 2)) + 1, (2, 2), store=memory)
    store = LatencyStore(memory, delay=delay)
    return open_wrapped(store), store


@pytest.mark.parametrize("ordered", [True, False])
def test_concurrency_one_reads_one_chunk_at_a_time(ordered: bool) -> None:
    array, store = slow_array(0.02)
    chunks = consume(dzb.chunk_stream(array, concurrency=1, ordered=ordered))
    assert len(chunks) == 12
    assert store.requests == 12
    assert store.peak == 1


@pytest.mark.parametrize("ordered", [True, False])
def test_concurrency_three_reads_up_to_three_at_once(ordered: bool) -> None:
    array, store = slow_array(0.1)
    chunks = consume(dzb.chunk_stream(array, concurrency=3, ordered=ordered))
    assert len(chunks) == 12
    assert store.requests == 12
    assert 2 <= store.peak <= 3


def test_break_early_stops_reading() -> None:
    array, store = slow_array(0.02)
    with dzb.chunk_stream(array, concurrency=2) as stream:
        first = next(stream)
    assert first.shape == (2, 2)
    with pytest.raises(StopIteration):
        next(stream)
    assert store.requests <= 4


def test_chunks_of_a_dask_graph_holding_a_literal_array_are_owned() -> None:
    """A block may be an object inside the graph (or the same for two blocks)."""
    values = np.arange(6.0)
    block = da.from_delayed(dask.delayed(values), shape=(6,), dtype=values.dtype)
    twice = da.concatenate([block, block])
    chunks = consume(dzb.chunk_stream(twice))
    assert len(chunks) == 2
    assert not np.shares_memory(chunks[0], chunks[1])
    for chunk in chunks:
        assert not np.shares_memory(chunk, values)
    chunks[0][...] = -1
    np.testing.assert_array_equal(values, np.arange(6.0))
    np.testing.assert_array_equal(chunks[1], np.arange(6.0))
    batches = consume(dzb.batch_stream(twice, 12))
    assert not np.shares_memory(batches[0], values)


def test_unordered_yields_as_reads_complete() -> None:
    memory = zarr.storage.MemoryStore()
    to_zarr(make_data((8, 2)) + 1, (2, 2), store=memory)
    slow_first = {"c/0/0": 0.5}
    store = LatencyStore(memory, delay=0.01, delays=slow_first)
    array = open_wrapped(store)
    unordered = consume(dzb.chunk_stream(array, concurrency=4, ordered=False, with_index=True))
    assert [index for index, _ in unordered][-1] == (0, 0)
    ordered = consume(dzb.chunk_stream(array, concurrency=4, with_index=True))
    assert [index for index, _ in ordered] == [(0, 0), (1, 0), (2, 0), (3, 0)]


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("transform", [None, np.sum])
def test_a_chunk_stream_dropped_mid_way_is_finalised_by_reference_counting(
    ordered: bool, transform: Any
) -> None:
    import gc
    import weakref

    data = np.arange(2000.0).reshape(1000, 2)
    array = zarr.create_array({}, shape=data.shape, chunks=(100, 2), dtype=data.dtype)
    array[:] = data
    gc.disable()  # no cycle may hold the stream: reference counting alone must free it
    try:
        if transform is None:
            stream = dzb.chunk_stream(array, io_concurrency=3, ordered=ordered)
        else:
            stream = dzb.map_chunks(transform, array, io_concurrency=3, ordered=ordered)
        next(stream)
        alive = weakref.ref(stream)
        del stream
        assert alive() is None
    finally:
        gc.enable()
