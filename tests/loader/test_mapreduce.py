"""map_chunks / reduce_chunks / Moments: correctness against numpy, locally and
on an in-process ``distributed`` cluster (started and stopped by a fixture)."""

from __future__ import annotations

import functools
import operator
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_state import our_tasks

import daskzarr_batches as dzb
from daskzarr_batches.mapreduce import _PairwiseFold

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(120)


def zarr_array(data: np.ndarray, chunks: tuple[int, ...]) -> zarr.Array:
    array = zarr.create_array(store={}, shape=data.shape, chunks=chunks, dtype=data.dtype)
    array[...] = data
    return array


DATA = np.random.default_rng(3).standard_normal((103, 10)).astype("float32")


def shape_and_sum(chunk: np.ndarray) -> tuple[tuple[int, ...], float]:
    return chunk.shape, float(chunk.sum(dtype=np.float64))


def first_value(chunk: np.ndarray) -> list[float]:
    return [float(chunk.flat[0])]


def where_am_i(chunk: np.ndarray) -> str:
    return str(distributed.get_worker().address)


def fails_on_second_row_block(chunk: np.ndarray) -> int:
    if chunk.flat[0] >= 20:
        raise ZeroDivisionError("boom")
    return 0


# --------------------------------------------------------------------------
# map_chunks


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("on_cluster", [False, True])
def test_map_chunks_one_result_per_cropped_chunk(
    request: pytest.FixtureRequest, ordered: bool, on_cluster: bool
) -> None:
    client = request.getfixturevalue("client") if on_cluster else None
    array = zarr_array(DATA, (20, 4))
    with dzb.map_chunks(
        shape_and_sum, array, ordered=ordered, with_index=True, client=client, io_concurrency=3
    ) as stream:
        assert len(stream) == 6 * 3
        items = list(stream)
    blocks = [block for block, _ in items]
    expected = [(i, j) for i in range(6) for j in range(3)]
    assert (blocks == expected) if ordered else (sorted(blocks) == expected)
    for (i, j), (shape, total) in items:
        piece = DATA[i * 20 : (i + 1) * 20, j * 4 : (j + 1) * 4]
        assert shape == piece.shape  # edge chunks cropped: (3, 4), (20, 2), (3, 2)
        assert total == pytest.approx(float(piece.sum(dtype=np.float64)))
    assert stream.stats.bytes_read == DATA.nbytes
    assert stream.stats.samples_yielded == 3 * len(DATA)


def test_map_chunks_runs_on_the_workers(client: Any) -> None:
    places = set(dzb.map_chunks(where_am_i, zarr_array(DATA, (10, 10)), client=client))
    assert places <= set(client.nthreads())
    assert places  # computed on workers, not on the client


def test_map_chunks_over_numpy_and_dask_arrays(client: Any) -> None:
    for array in (DATA, da.from_array(DATA, chunks=(30, 5)) * 2):
        local = list(dzb.map_chunks(shape_and_sum, array, client=None))
        with dask.config.set(scheduler="threads"):
            assert list(dzb.map_chunks(shape_and_sum, array)) == local
        assert list(dzb.map_chunks(shape_and_sum, array, client=client)) == local


@pytest.mark.parametrize("on_cluster", [False, True])
def test_map_chunks_failure_names_the_chunk(
    request: pytest.FixtureRequest, on_cluster: bool
) -> None:
    client = request.getfixturevalue("client") if on_cluster else None
    data = np.arange(100.0).reshape(50, 2)
    stream = dzb.map_chunks(fails_on_second_row_block, data[20:], client=client)
    with pytest.raises(dzb.WindowError, match=r"fails_on_second_row_block\(\) on chunk \(0, 0\)"):
        list(stream)
    array = zarr_array(data, (10, 2))
    with pytest.raises(dzb.WindowError, match=r"on chunk \(1, 0\) of array") as info:
        list(dzb.map_chunks(fails_on_second_row_block, array, client=client))
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_map_chunks_break_releases_everything(client: Any) -> None:
    for _ in dzb.map_chunks(np.sum, DATA[:, :2].copy(), client=client, io_concurrency=4):
        break
    assert our_tasks(client) == []


def test_map_chunks_rejects_non_callables() -> None:
    with pytest.raises(dzb.ArgumentTypeError, match="func must be callable, got 3"):
        dzb.map_chunks(3, DATA)  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentTypeError, match="combine must be callable"):
        dzb.reduce_chunks(np.sum, "add", DATA)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# reduce_chunks


def test_reduce_chunks_follows_chunk_order_without_commutativity() -> None:
    data = np.arange(60.0).reshape(30, 2)
    array = zarr_array(data, (4, 1))
    got = dzb.reduce_chunks(first_value, operator.add, array, io_concurrency=5)
    assert got == [float(data[i, j]) for i in range(0, 30, 4) for j in range(2)]
    assert dzb.reduce_chunks(first_value, operator.add, array, initial=[-1.0])[0] == -1.0


def test_reduce_chunks_of_an_empty_array() -> None:
    empty = np.zeros((0, 3))
    assert dzb.reduce_chunks(np.sum, operator.add, empty, initial=0.0) == 0.0
    with pytest.raises(dzb.ArgumentValueError, match="no chunks to reduce; pass initial="):
        dzb.reduce_chunks(np.sum, operator.add, empty)


def test_histogram_matches_numpy_and_is_identical_on_a_cluster(client: Any) -> None:
    array = zarr_array(DATA, (16, 5))
    edges = np.linspace(-4, 4, 33)
    counts = functools.partial(np.histogram, bins=edges)

    def hist(chunk: np.ndarray) -> np.ndarray:
        return counts(chunk)[0]

    local = dzb.reduce_chunks(hist, operator.add, array)
    np.testing.assert_array_equal(local, np.histogram(DATA, bins=edges)[0])
    remote = dzb.reduce_chunks(hist, operator.add, array, client=client, io_concurrency=2)
    np.testing.assert_array_equal(remote, local)


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_float_reduction_is_bit_identical_everywhere(client: Any, concurrency: int) -> None:
    array = zarr_array(DATA, (7, 3))
    reference = dzb.feature_moments(array, io_concurrency=1)
    for on in (None, client):
        got = dzb.feature_moments(array, client=on, io_concurrency=concurrency)
        assert got.count == reference.count
        np.testing.assert_array_equal(got.mean, reference.mean, strict=True)
        np.testing.assert_array_equal(got.m2, reference.m2, strict=True)
    total = dzb.reduce_chunks(
        np.sum, operator.add, array, client=client, io_concurrency=concurrency
    )
    assert total == dzb.reduce_chunks(np.sum, operator.add, array)


def leaf_of(chunk: np.ndarray) -> Any:
    return int(chunk.flat[0])


def pair_where(left: Any, right: Any) -> Any:
    """A combine recording the tree's shape and where each combine ran."""
    try:
        where = "worker" if distributed.get_worker() else "?"
    except ValueError:
        where = "caller"
    return ((left, right), where)


def shape_of(tree: Any) -> Any:
    return tree[0] if isinstance(tree, tuple) and len(tree) == 2 and tree[1] in (
        "worker", "caller") else tree  # fmt: skip


def strip(tree: Any) -> Any:
    if isinstance(tree, tuple) and len(tree) == 2 and tree[1] in ("worker", "caller"):
        left, right = tree[0]
        return (strip(left), strip(right))
    return tree


def places(tree: Any) -> set[str]:
    if isinstance(tree, tuple) and len(tree) == 2 and tree[1] in ("worker", "caller"):
        left, right = tree[0]
        return {tree[1]} | places(left) | places(right)
    return set()


@pytest.mark.parametrize("batch", [3, 128])
def test_reduce_on_a_cluster_combines_on_the_workers_in_the_callers_tree(
    client: Any, batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the result travels: every combine runs on a worker, in the tree the caller's
    fold makes (leaves sent ``batch`` per graph, partials carried between graphs)."""
    from daskzarr_batches.streams import chunk_jobs

    monkeypatch.setattr(chunk_jobs, "TREE_BATCH", batch)
    data = np.arange(130.0 * 2).reshape(130, 2)
    array = zarr_array(data, (10, 2))
    local = dzb.reduce_chunks(leaf_of, pair_where, array)
    remote = dzb.reduce_chunks(leaf_of, pair_where, array, client=client)
    assert strip(remote) == strip(local)  # the same tree, whatever the batches
    assert places(local) == {"caller"} and places(remote) == {"worker"}
    started = dzb.reduce_chunks(leaf_of, pair_where, array, client=client, initial=-1)
    assert strip(started) == strip(pair_where(-1, local))


def test_reduce_on_a_cluster_names_a_failing_chunk_and_leaves_nothing(client: Any) -> None:
    array = zarr_array(np.arange(100.0).reshape(50, 2), (10, 2))
    # chunks 1..4 all fail: the first to finish is named
    with pytest.raises(dzb.WindowError, match=r"\(\) on chunk \([1-4], 0\) of array") as info:
        dzb.reduce_chunks(fails_on_second_row_block, operator.add, array, client=client)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert our_tasks(client) == []


def refuses(left: Any, right: Any) -> Any:
    raise ValueError("no combining")


def test_reduce_on_a_cluster_raises_combines_error_as_the_caller_would(client: Any) -> None:
    """A combine raising in a leaf task of several chunks is not taken for a chunk's read."""
    array = zarr_array(np.arange(100.0).reshape(50, 2), (5, 2))  # 10 chunks: 2 subtrees
    for on in (None, client):
        with pytest.raises(ValueError, match="no combining"):
            dzb.reduce_chunks(np.sum, refuses, array, client=on)
    assert our_tasks(client) == []


def test_reduce_on_a_cluster_warns_of_missing_chunks(client: Any) -> None:
    store: dict[str, Any] = {}
    array = zarr.create_array(store=store, shape=(40, 2), chunks=(10, 2), dtype="f8")
    array[:] = 1.0
    del store["c/1/0"]
    with pytest.warns(dzb.MissingChunksWarning):
        total = dzb.reduce_chunks(np.sum, operator.add, array, client=client, missing="warn")
    assert total == 60.0


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 70))
def test_pairwise_fold_equals_a_left_fold_for_associative_combine(n: int) -> None:
    fold: _PairwiseFold[tuple[int, ...]] = _PairwiseFold(operator.add)
    for i in range(n):
        fold.push((i,))
    assert fold.empty == (n == 0)
    if n:
        assert fold.result() == tuple(range(n))


# --------------------------------------------------------------------------
# Moments


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 60),
    features=st.integers(1, 6),
    row_chunk=st.integers(1, 25),
    feature_chunk=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_feature_moments_match_numpy(
    rows: int, features: int, row_chunk: int, feature_chunk: int, seed: int
) -> None:
    data = np.random.default_rng(seed).normal(3.0, 2.0, (rows, features))
    moments = dzb.feature_moments(zarr_array(data, (row_chunk, feature_chunk)), io_concurrency=2)
    assert moments.count == rows
    np.testing.assert_allclose(moments.mean, data.mean(axis=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(moments.variance(), data.var(axis=0), rtol=1e-10, atol=1e-12)
    if rows > 1:
        np.testing.assert_allclose(moments.std(ddof=1), data.std(axis=0, ddof=1), rtol=1e-10)
    else:
        assert np.isnan(moments.variance(ddof=1)).all()


def test_feature_moments_of_3d_samples_chunked_on_every_axis(client: Any) -> None:
    data = np.random.default_rng(0).random((41, 4, 6)).astype("float32")
    moments = dzb.feature_moments(zarr_array(data, (10, 3, 4)), client=client)
    np.testing.assert_allclose(moments.mean, data.mean(axis=0, dtype=np.float64), rtol=1e-6)
    np.testing.assert_allclose(moments.variance(), data.var(axis=0, dtype=np.float64), rtol=1e-5)


def test_moments_merge_is_chan_and_checks_shapes() -> None:
    data = np.random.default_rng(1).normal(1e6, 1.0, (1000, 2))  # large offset: no cancellation
    left, right = dzb.Moments.from_chunk(data[:300]), dzb.Moments.from_chunk(data[300:])
    merged = left.merge(right)
    np.testing.assert_allclose(merged.variance(), data.var(axis=0), rtol=1e-9)
    empty = dzb.Moments.from_chunk(data[:0])
    assert empty.merge(left) is left and left.merge(empty) is left
    with pytest.raises(dzb.ArgumentValueError, match=r"\(2,\)-shaped samples with .* \(3,\)"):
        left.merge(dzb.Moments.from_chunk(np.ones((4, 3))))
    with pytest.raises(dzb.ArgumentValueError, match="0-d"):
        dzb.Moments.from_chunk(np.float64(1.0))  # type: ignore[arg-type]


def test_reduce_chunks_with_moments_on_a_cluster(client: Any) -> None:
    array = zarr_array(DATA, (13, 10))
    moments = dzb.reduce_chunks(dzb.Moments.from_chunk, dzb.Moments.merge, array, client=client)
    np.testing.assert_allclose(moments.mean, DATA.mean(axis=0, dtype=np.float64), rtol=1e-6)
    np.testing.assert_allclose(moments.variance(), DATA.var(axis=0, dtype=np.float64), rtol=1e-5)
