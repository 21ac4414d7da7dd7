"""chunk_split: subsets of whole stored chunks, and every stream over them.

The split itself (disjoint, covering, chunk-aligned, sized by the fractions,
seeded, leakage-free with a gap) is checked on dask arrays of irregular
chunks, which cost nothing to split; the streams over subsets on every input
kind (a sharded Zarr array too): every usable row exactly once, equal to
numpy slicing, in every shuffle mode, with ranks and resume, and only the
subset's chunks read.
"""

from __future__ import annotations

import collections
import json
import math
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import event, given
from hypothesis import strategies as st
from stores import CountingStore, open_wrapped
from strategies import (
    array_cases,
    irregular_chunks,
    make_data,
    property_settings,
    sample_ids,
    seeds,
)

import daskzarr_batches as dzb
from daskzarr_batches.store.layout import block_key

fraction_lists = st.lists(st.floats(0.05, 1.0), min_size=1, max_size=4).map(
    lambda values: [v / max(1.0, sum(values)) for v in values]
)


def positions(ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    return np.concatenate([np.arange(a, b) for a, b in ranges] or [np.empty(0, np.int64)])


def extents(offsets: np.ndarray, chunks: tuple[int, ...]) -> set[int]:
    return {int(p) for c in chunks for p in range(offsets[c], offsets[c + 1])}


# --------------------------------------------------------------------------
# The split


@property_settings(60)
@given(
    sizes=st.integers(1, 60).flatmap(lambda n: irregular_chunks((n,))),
    fractions=fraction_lists,
    gap=st.integers(0, 3),
    seed=seeds,
    exact=st.booleans(),
)
def test_subsets_are_disjoint_aligned_sized_and_leakage_free(
    sizes: tuple[tuple[int, ...]], fractions: list[float], gap: int, seed: int, exact: bool
) -> None:
    if exact:  # fractions summing to 1: every chunk is used
        fractions = [f / sum(fractions) for f in fractions]
    n = sum(sizes[0])
    x = da.zeros((n, 2), chunks=(sizes[0], 2))
    nonempty = [i for i, size in enumerate(sizes[0]) if size]
    if len(nonempty) < len(fractions):
        with pytest.raises(dzb.ArgumentValueError, match="fewer than the"):
            dzb.chunk_split(x, fractions, seed=seed, gap=gap)
        return
    try:
        subsets = dzb.chunk_split(x, fractions, seed=seed, gap=gap)
    except dzb.ArgumentValueError as error:  # a gap wider than a subset's chunks
        assert f"gap={gap} leaves subset" in str(error) and gap > 0
        return
    offsets = np.concatenate([[0], np.cumsum(sizes[0])])
    longest = max(sizes[0])
    owner: dict[int, int] = {}
    for subset in subsets:
        assert subset.chunks == tuple(sorted(subset.chunks))
        assert all(sizes[0][c] > 0 for c in subset.chunks)  # chunk indices of the grid
        for c in subset.chunks:
            assert owner.setdefault(c, subset.index) == subset.index  # disjoint
        own = extents(offsets, subset.chunks)
        used = positions(subset.ranges)
        assert len(subset) == len(used) == len(set(used.tolist()))
        assert set(used.tolist()) <= own  # chunk-aligned: only its chunks
        assert all(a < b for a, b in subset.ranges)
        assert all(b < c for (_, b), (c, _) in zip(subset.ranges, subset.ranges[1:], strict=False))
        if all(f * n >= longest for f in fractions):  # else some got one chunk at least
            assert abs(len(own) - subset.fraction * n) < longest
        for p in used.tolist():  # no position within `gap` of a chunk it does not own
            near = range(max(0, p - gap), min(n, p + gap + 1))
            assert all(q in own for q in near)
        for p in own - set(used.tolist()):  # only the gap trims
            near = range(max(0, p - gap), min(n, p + gap + 1))
            assert any(q not in own for q in near)
    if exact and gap == 0:
        assert sorted(owner) == [i for i in range(len(sizes[0])) if sizes[0][i]]
        assert sorted(positions(tuple(r for s in subsets for r in s.ranges)).tolist()) == list(
            range(n)
        )
    again = dzb.chunk_split(x, fractions, seed=seed, gap=gap)
    assert [(s.chunks, s.ranges) for s in again] == [(s.chunks, s.ranges) for s in subsets]


def test_seeds_draw_different_splits_and_fractions_size_them() -> None:
    x = da.zeros((1000,), chunks=10)
    splits = {dzb.chunk_split(x, [0.5, 0.3], seed=seed)[0].chunks for seed in range(5)}
    assert len(splits) == 5
    train, valid = dzb.chunk_split(x, [0.5, 0.3], seed=0)
    assert (len(train), len(valid)) == (500, 300)  # the other 20 chunks unused
    assert not set(train.chunks) & set(valid.chunks)
    tiny = dzb.chunk_split(x, [0.98, 0.001, 0.001], seed=0)  # below one chunk: one each
    assert [len(s.chunks) for s in tiny] == [98, 1, 1]


def test_paired_units_are_the_shared_blocks_and_items_are_per_array() -> None:
    a = da.zeros((120, 2), chunks=(20, 2))
    b = da.zeros((120,), chunks=30)
    first, _ = dzb.chunk_split({"a": a, "b": b}, [0.5, 0.5], seed=4, gap=2)
    assert list(first) == list(first.keys()) == ["a", "b"]
    assert first.chunks in ((0,), (1,)) and len(first) == 58  # units of 60 rows
    sub_a, sub_b = first["a"], first["b"]
    assert sub_a.ranges == sub_b.ranges == first.ranges
    assert sub_a.chunks == tuple(range(3 * first.chunks[0], 3 * first.chunks[0] + 3))
    assert sub_b.chunks == tuple(range(2 * first.chunks[0], 2 * first.chunks[0] + 2))
    pair = dzb.chunk_split((a, b), [0.5, 0.5], seed=4)
    assert [s.ranges for s in pair[0]] == [pair[0].ranges] * 2
    assert "tuple of 2 arrays" in repr(pair[0]) and "fraction=0.5" in repr(pair[0])


def test_xarray_dims_by_name() -> None:
    xr = pytest.importorskip("xarray")
    data = make_data((30, 4, 6), "f4")
    field = xr.DataArray(da.from_array(data, chunks=(5, 4, 2)), dims=("time", "lat", "lon"))
    by_name = dzb.chunk_split(field, [0.5, 0.5], dim="lon", seed=1)
    by_axis = dzb.chunk_split(field, [0.5, 0.5], dim=2, seed=1)
    assert [s.ranges for s in by_name] == [s.ranges for s in by_axis]
    assert by_name[0].dim == "lon" and by_name[0].axis == 2 and by_name[0].data is field
    _, valid = dzb.chunk_split(field, [0.6, 0.4], dim="time", seed=2, gap=1)
    got = np.concatenate(list(dzb.batch_stream(valid, 4)))
    np.testing.assert_array_equal(got, data[positions(valid.ranges)])


def test_zarr_dimension_names_by_name(tmp_path: Any) -> None:
    """A Zarr array's own dim names (v3 dimension_names, v2 _ARRAY_DIMENSIONS) name ``dim``."""
    data = make_data((30, 4, 6), "f4")
    names = ("time", "lat", "lon")
    path = str(tmp_path / "v3.zarr")
    v3 = zarr.create_array(path, shape=data.shape, chunks=(5, 4, 2), dtype="f4",
                           dimension_names=names)  # fmt: skip
    v3[:] = data
    v2 = zarr.create_array({}, shape=data.shape, chunks=(5, 4, 2), dtype="f4", zarr_format=2,
                           attributes={"_ARRAY_DIMENSIONS": list(names)})  # fmt: skip
    v2[:] = data
    by_axis = [s.ranges for s in dzb.chunk_split(v3, [0.5, 0.5], dim=2, seed=1)]
    for array in (v3, v2, dzb.open_array(path), path):
        by_name = dzb.chunk_split(array, [0.5, 0.5], dim="lon", seed=1)
        assert [s.ranges for s in by_name] == by_axis and by_name[0].axis == 2
    _, valid = dzb.chunk_split(v3, [0.6, 0.4], dim="time", seed=2, gap=1)
    got = np.concatenate(list(dzb.batch_stream(valid, 4)))
    np.testing.assert_array_equal(got, data[positions(valid.ranges)])
    with pytest.raises(dzb.ArgumentValueError, match="dim='level' is not a dimension"):
        dzb.chunk_split(v3, [0.5, 0.5], dim="level")
    unnamed = zarr.create_array({}, shape=(4, 2), chunks=(2, 2), dtype="f4")
    with pytest.raises(dzb.ArgumentTypeError, match="dim='time' is a name"):
        dzb.chunk_split(unnamed, [0.5, 0.5], dim="time")


# --------------------------------------------------------------------------
# Streams over subsets


def sharded_case(data: np.ndarray) -> Any:
    array = zarr.create_array(
        zarr.storage.MemoryStore(), shape=data.shape, chunks=(3, *data.shape[1:]),
        shards=(6, *data.shape[1:]), dtype=data.dtype,
    )  # fmt: skip
    array[...] = data
    return array


@property_settings(40)
@given(
    case=array_cases(min_rows=4, min_width=1, max_dims=2),
    sharded=st.booleans(),
    fractions=fraction_lists,
    gap=st.integers(0, 2),
    mode=st.sampled_from(["none", "buffer", "exact"]),
    batch=st.integers(1, 9),
    seed=seeds,
)
def test_a_stream_over_a_subset_yields_its_usable_rows_once(
    case: Any, sharded: bool, fractions: list[float], gap: int, mode: str, batch: int, seed: int
) -> None:
    array = sharded_case(case.data) if sharded else case.array
    try:
        subsets = dzb.chunk_split(array, fractions, seed=seed, gap=gap)
    except dzb.ArgumentValueError:  # too few chunks for the subsets, or a gap too wide
        event("not split")
        return
    for subset in subsets:
        want = positions(subset.ranges)
        if mode == "none":
            stream = dzb.batch_stream(subset, batch)
        else:
            stream = dzb.shuffled_batch_stream(
                subset, batch, seed=seed, shuffle_buffer_size=5 if mode == "buffer" else None,
                memory_budget=max(1, case.data[:1].nbytes * 7),
            )  # fmt: skip
        with stream:
            batches = list(stream)
        assert len(batches) == len(stream) == dzb.count_batches(subset, batch)
        got = np.concatenate(batches) if batches else case.data[:0]
        ids = sample_ids(got)
        if mode == "none":
            np.testing.assert_array_equal(got, case.data[want])
        else:
            np.testing.assert_array_equal(np.sort(ids), want)
            np.testing.assert_array_equal(got, case.data[ids])


@property_settings(15)
@given(
    world=st.integers(1, 3),
    mode=st.sampled_from(["none", "buffer", "exact"]),
    batch=st.integers(1, 6),
    data_=st.data(),
)
def test_loader_over_a_subset_ranks_and_resume(
    world: int, mode: str, batch: int, data_: st.DataObject
) -> None:
    data = make_data((60, 2))
    x = zarr.create_array(zarr.storage.MemoryStore(), shape=(60, 2), chunks=(7, 2), dtype="i4")
    x[:] = data
    y = da.from_array(data, chunks=(14, 2))  # units: the 14-row blocks both share
    subset = dzb.chunk_split({"x": x, "y": y}, [0.6, 0.4], seed=3, gap=1)[1]
    kw: dict[str, Any] = {"shuffle": mode != "none", "seed": 5, "world_size": world}
    kw["shuffle_buffer_size"] = 10 if mode == "buffer" else None
    ranks = [list(dzb.Loader(subset, batch, rank=r, **kw)) for r in range(world)]
    assert len({len(rank) for rank in ranks}) == 1  # equal steps
    shares = [np.concatenate([sample_ids(b["x"]) for b in rank]) for rank in ranks]
    usable = positions(subset.ranges)
    assert all(len(share) == -(-len(usable) // world) for share in shares)
    np.testing.assert_array_equal(np.unique(np.concatenate(shares)), usable)  # covering
    assert len(np.unique(np.concatenate(shares))) >= sum(map(len, shares)) - world  # padding
    for rank in ranks:
        for b in rank:
            np.testing.assert_array_equal(b["y"], data[sample_ids(b["x"])])
    rank = data_.draw(st.integers(0, world - 1))
    k = data_.draw(st.integers(0, len(ranks[rank])))
    first = dzb.Loader(subset, batch, rank=rank, **kw)
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    again = dzb.Loader(subset, batch, rank=rank, **kw)
    again.load_state_dict(state)
    rest = list(again)
    assert [sample_ids(b["x"]).tolist() for b in head + rest] == [
        sample_ids(b["x"]).tolist() for b in ranks[rank]
    ]


@pytest.mark.parametrize("mode", ["none", "buffer", "exact"])
def test_only_the_subset_chunks_are_read(mode: str) -> None:
    data = make_data((200, 3), "f4")
    counts: collections.Counter[str] = collections.Counter()
    store = zarr.storage.MemoryStore()
    zarr.create_array(store, shape=data.shape, chunks=(10, 3), dtype="f4")[:] = data
    array = open_wrapped(CountingStore(store, counts))
    train, valid = dzb.chunk_split(array, [0.7, 0.3], seed=11, gap=2)
    for subset in (train, valid):
        counts.clear()
        kw: dict[str, Any] = {"shuffle": mode != "none"}
        if mode != "none":
            kw.update(seed=1, shuffle_buffer_size=30 if mode == "buffer" else None)
        plan = dzb.plan_epoch(subset, 16, **kw)
        if mode == "none":
            stream = dzb.batch_stream(subset, 16)
        else:
            stream = dzb.shuffled_batch_stream(
                subset, 16, **{k: kw[k] for k in kw if k != "shuffle"}
            )
        with stream:
            got = np.concatenate(list(stream))
        allowed = {key for c in subset.chunks for key in block_key(array, (c, 0))}
        assert set(counts) == allowed
        assert all(count == 1 for count in counts.values())  # each chunk once per epoch
        assert stream.stats.chunks_read == plan.chunks_read == len(subset.chunks)
        np.testing.assert_array_equal(np.sort(sample_ids(got)), positions(subset.ranges))
    counts.clear()
    first = dzb.chunk_split((array, data), [0.7, 0.3], seed=11, gap=2)[0]
    with dzb.paired_batch_stream(first[0], first[1], 16) as pairs:
        for x, y in pairs:
            np.testing.assert_array_equal(x, y)
    assert set(counts) == {key for c in first.chunks for key in block_key(array, (c, 0))}


@pytest.mark.parametrize("kind", ["zarr", "dask"])
def test_chunk_streams_and_map_reduce_over_a_split_along_any_axis(kind: str) -> None:
    data = make_data((12, 10), "f8")
    if kind == "zarr":
        array: Any = zarr.create_array(
            zarr.storage.MemoryStore(), shape=data.shape, chunks=(5, 2), dtype="f8"
        )
        array[:] = data
    else:
        array = da.from_array(data, chunks=(5, 2))
    for dim in (0, 1, -1):
        for subset in dzb.chunk_split(array, [0.5, 0.5], dim=dim, seed=2, gap=1):
            keep = positions(subset.ranges)
            want = np.take(data, keep, axis=subset.axis)
            blocks = list(dzb.chunk_stream(subset, with_index=True))
            total = sum(block.size for _, block in blocks)
            assert total == want.size
            assert math.isclose(dzb.reduce_chunks(np.sum, lambda a, b: a + b, subset), want.sum())
            if subset.axis == 0:
                np.testing.assert_allclose(dzb.feature_moments(subset).mean, want.mean(0))
            if dim == 1:
                with pytest.raises(dzb.ArgumentValueError, match="split along axis 1"):
                    dzb.batch_stream(subset, 2)


# --------------------------------------------------------------------------
# Bad inputs


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"fractions": [0.5, -0.1]}, dzb.ArgumentValueError, r"fractions\[1\] must be > 0"),
        ({"fractions": [0.7, 0.5]}, dzb.ArgumentValueError, "sum to at most 1"),
        ({"fractions": []}, dzb.ArgumentValueError, "fractions is empty"),
        ({"fractions": 0.5}, dzb.ArgumentTypeError, "fractions must be a sequence"),
        ({"fractions": [0.5, "a"]}, dzb.ArgumentTypeError, r"fractions\[1\] must be a number"),
        ({"fractions": [float("nan")]}, dzb.ArgumentValueError, "nan"),
        ({"dim": 2}, dzb.ArgumentValueError, "dim=2 is out of range"),
        ({"dim": "time"}, dzb.ArgumentTypeError, "dim='time' is a name"),
        ({"dim": 1.5}, dzb.ArgumentTypeError, "dim must be"),
        ({"seed": -1}, dzb.ArgumentValueError, "seed must be >= 0, got -1"),
        ({"seed": "x"}, dzb.ArgumentTypeError, "seed must be"),
        ({"gap": -2}, dzb.ArgumentValueError, "gap must be >= 0, got -2"),
        ({"gap": 20}, dzb.ArgumentValueError, "gap=20 leaves subset"),
        ({"fractions": [0.2] * 5}, dzb.ArgumentValueError, "4 chunks along dim=0"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict[str, Any], error: type, match: str) -> None:
    x = da.zeros((40, 3), chunks=(10, 3))
    arguments = {"fractions": [0.5, 0.5], **kwargs}
    with pytest.raises(error, match=match):
        dzb.chunk_split(x, arguments.pop("fractions"), **arguments)


def test_bad_data_and_mismatched_subsets() -> None:
    x, y = da.zeros((40, 3), chunks=10), da.zeros((30,), chunks=10)
    with pytest.raises(dzb.LengthMismatchError, match=r"data\[1\] has 30"):
        dzb.chunk_split((x, y), [0.5, 0.5])
    with pytest.raises(dzb.ArgumentTypeError, match=r"must be a zarr\.Array"):
        dzb.chunk_split([1, 2, 3], [0.5])
    with pytest.raises(dzb.ArrayNotFoundError):
        dzb.chunk_split("/nonexistent/x.zarr", [0.5])
    a, b = dzb.chunk_split(x, [0.5, 0.5], seed=1)
    with pytest.raises(dzb.ArgumentTypeError, match="already a chunk subset"):
        dzb.chunk_split(a, [0.5])
    with pytest.raises(dzb.ArgumentValueError, match="other positions"):
        dzb.paired_batch_stream(a, b, 4)
    with pytest.raises(dzb.ArgumentValueError, match="whole array"):
        dzb.paired_batch_stream(a, x, 4)
    d = dzb.chunk_split({"x": x, "z": x}, [0.5, 0.5])[0]
    with pytest.raises(dzb.ArgumentTypeError, match="dict of arrays"):
        dzb.batch_stream(d, 4)
    with pytest.raises(TypeError, match="one array"):
        a[0]


def test_a_subset_on_a_cluster(client: Any) -> None:
    data = make_data((90, 2))
    x = da.from_array(data, chunks=(10, 2))
    train, valid = dzb.chunk_split((data, x), [0.6, 0.4], seed=5, gap=1)  # numpy: scattered
    with dzb.batch_stream(valid, 8, client=client) as pairs:
        got = [(a, b) for a, b in pairs]
    np.testing.assert_array_equal(
        np.concatenate([a for a, _ in got]), data[positions(valid.ranges)]
    )
    np.testing.assert_array_equal(
        np.concatenate([b for _, b in got]), data[positions(valid.ranges)]
    )
    with dzb.chunk_stream(train[0], client=client) as blocks:
        assert sum(len(block) for block in blocks) == len(train)
