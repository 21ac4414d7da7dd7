"""``stream.to_dask()``: a stream's epoch as lazy dask arrays, one block per window.

It equals iterating the stream in every mode (sequential, buffered, exact; paired,
patches, collections, mixtures), reads nothing before it is computed, each stored chunk
once per window, holds tasks in proportion to chunks (never samples), computes on a
cluster, and ``to_zarr`` of it writes the shuffled order.
"""

from __future__ import annotations

import collections
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from stores import CountingStore, NamedCountingStore, open_wrapped
from strategies import array_cases, batch_sizes, make_data, property_settings, seeds, to_zarr

import daskzarr_batches as dzb

MODES = ("none", "buffer", "exact")


def _stream(array: Any, mode: str, batch: int, seed: int, labels: Any = None, **kw: Any) -> Any:
    """A stream of ``array`` (paired with ``labels``) in ``mode``."""
    arrays = (array,) if labels is None else (array, labels)
    if mode == "none":
        make = dzb.batch_stream if labels is None else dzb.paired_batch_stream
        return make(*arrays, batch, **kw)
    make = dzb.shuffled_batch_stream if labels is None else dzb.paired_shuffled_batch_stream
    if mode == "buffer":
        n = getattr(arrays[0], "shape", (24,))[0]
        kw.setdefault("shuffle_buffer_size", max(1, n // 3))
    return make(*arrays, batch, seed=seed, **kw)


def _delivered(stream: Any) -> Any:
    """The stream's batches concatenated (a tuple for paired streams)."""
    batches = list(stream)
    if not batches:
        return None
    if isinstance(batches[0], tuple):
        return tuple(np.concatenate(parts) for parts in zip(*batches, strict=True))
    return np.concatenate(batches)


def _equal(epoch: Any, delivered: Any, shape: tuple[int, ...]) -> None:
    if delivered is None:
        assert epoch.shape == (0, *shape[1:])
        return
    np.testing.assert_array_equal(epoch, delivered)
    assert epoch.dtype == delivered.dtype


@property_settings(40)
@given(
    case=array_cases(kinds=("numpy", "zarr3", "dask", "zarr2", "zarrs")),
    mode=st.sampled_from(MODES),
    data=st.data(),
    seed=seeds,
    drop=st.booleans(),
)
def test_to_dask_equals_iterating(case: Any, mode: str, data: Any, seed: int, drop: bool) -> None:
    """The epoch array is the stream's batches concatenated, in every mode and layout."""
    batch = data.draw(batch_sizes(case.n))
    budget = data.draw(st.sampled_from([2**10, 2**13, 2**20]))  # exact windows: 1 or many
    kw: dict[str, Any] = {"drop_remainder": drop}
    if mode == "exact":
        kw["memory_budget"] = budget
    stream = _stream(case.array, mode, batch, seed, **kw)
    epoch = stream.to_dask()
    assert isinstance(epoch, da.Array)
    computed = epoch.compute()
    _equal(computed, _delivered(stream), case.data.shape)
    assert epoch.numblocks[1:] == (1,) * (case.data.ndim - 1)


@property_settings(15)
@given(
    n=st.integers(1, 60),
    chunk=st.integers(1, 13),
    label_chunk=st.integers(1, 13),
    mode=st.sampled_from(MODES),
    batch=st.integers(1, 17),
    seed=seeds,
)
def test_paired_to_dask_is_aligned(
    n: int, chunk: int, label_chunk: int, mode: str, batch: int, seed: int
) -> None:
    """Paired streams give a tuple of arrays, aligned, each equal to its side of the pairs."""
    x = to_zarr(make_data((n, 3)), (chunk, 3))
    y = to_zarr(np.arange(n, dtype=np.int64) * 3, (label_chunk,))
    stream = _stream(x, mode, batch, seed, labels=y)
    features, labels = stream.to_dask()
    got = dask.compute(features, labels)
    want = _delivered(stream)
    for part, expected in zip(got, want, strict=True):
        np.testing.assert_array_equal(part, expected)
    np.testing.assert_array_equal(got[0][:, 0], got[1])  # rows stay pairs


def test_collections_and_sources() -> None:
    """A collection (with return_sources) and a mixture, each as iterated."""
    members = [to_zarr(make_data((k, 2)) + 1000 * i, (5, 2)) for i, k in enumerate((17, 9, 23))]
    for mode in MODES:
        stream = _stream(dzb.concat(members), mode, 6, 3, return_sources=True)
        rows, sources = dask.compute(*stream.to_dask())
        want_rows, want_sources = _delivered(stream)
        np.testing.assert_array_equal(rows, want_rows)
        np.testing.assert_array_equal(sources, want_sources)
    mixture = dzb.mix(members, [2.0, 1.0, 1.0], seed=5)
    for mode in MODES:
        stream = _stream(mixture, mode, 7, 11)
        np.testing.assert_array_equal(stream.to_dask().compute(), _delivered(stream))


def test_patches() -> None:
    """A patch stream's layout: pairs of inputs and targets, and the origins."""
    field = to_zarr(make_data((4, 12, 10), "float32"), (2, 5, 4))
    for shuffle in (False, True):
        stream = dzb.patch_stream(
            field, {0: 1, 1: 4, 2: 4}, 5, shuffle=shuffle, seed=2, target_offset={0: 1},
            return_origins=True,
        )  # fmt: skip
        epoch = stream.to_dask()
        batches = list(stream)
        assert isinstance(epoch, tuple) and len(epoch) == len(batches[0])
        for part, parts in zip(dask.compute(*epoch), zip(*batches, strict=True), strict=True):
            np.testing.assert_array_equal(part, np.concatenate(parts))


def test_reads_nothing_before_compute_and_each_chunk_once_per_window() -> None:
    """Building the array reads no chunk; computing it reads what iterating reads."""
    data = make_data((400, 4))
    counts: collections.Counter[str] = collections.Counter()
    store = CountingStore(zarr.storage.MemoryStore(), counts)
    to_zarr(data, (40, 4), store=store)
    array = open_wrapped(store)
    for mode in MODES:
        kw = {} if mode == "none" else {"memory_budget": 40_000}
        stream = _stream(array, mode, 32, 1, **kw)
        counts.clear()
        epoch = stream.to_dask()
        _ = epoch[::7]  # slicing builds a graph, reads nothing
        assert sum(counts.values()) == 0
        epoch.compute()
        computed = dict(counts)
        counts.clear()
        list(stream)
        assert computed == dict(counts)  # the same chunks, as often as the stream
        windows = sum(1 for _ in stream.plan.windows())
        assert max(computed.values()) <= windows
        if mode != "exact":
            assert set(computed.values()) == {1}


def test_cache_is_honoured() -> None:
    """A stream's cache serves a second compute of its epoch array: no store read."""
    counts: collections.Counter[str] = collections.Counter()
    store = CountingStore(zarr.storage.MemoryStore(), counts)
    to_zarr(make_data((200, 3)), (20, 3), store=store)
    array = open_wrapped(store)
    stream = dzb.shuffled_batch_stream(
        array, 16, seed=2, shuffle_buffer_size=60, cache=dzb.ChunkCache("16MiB")
    )
    first = stream.to_dask().compute()
    assert set(counts.values()) == {1} and len(counts) == 10
    counts.clear()
    np.testing.assert_array_equal(stream.to_dask().compute(), first)
    assert not counts


def test_tasks_grow_with_chunks_not_samples() -> None:
    """Ten times the samples in the same chunk grid: the same number of tasks."""
    tasks = []
    for rows in (1_000, 10_000):
        array = to_zarr(make_data((rows, 2)), (rows // 10, 2))
        stream = dzb.shuffled_batch_stream(array, 64, seed=0, memory_budget=2**30)
        epoch = stream.to_dask()
        tasks.append(len(dict(epoch.__dask_graph__())))
        assert epoch.numblocks == (1, 1)  # one window holds the whole epoch
    assert tasks[0] == tasks[1] <= 4
    fancy = da.from_zarr(array)[np.random.default_rng(0).permutation(10_000)]
    assert len(dict(fancy.__dask_graph__())) > 10 * tasks[1]


def test_refuses_skip() -> None:
    array = to_zarr(make_data((10, 2)), (5, 2))
    with pytest.raises(dzb.ArgumentValueError, match="on_error"):
        dzb.batch_stream(array, 4, on_error="skip").to_dask()


def test_missing_chunk_warns_at_compute() -> None:
    store = zarr.storage.MemoryStore()
    array = to_zarr(make_data((20, 2)), (5, 2), store=store)
    zarr.core.sync.sync(store.delete("c/1/0"))
    epoch = dzb.batch_stream(array, 4, missing="warn").to_dask()  # building warns of nothing
    with pytest.warns(dzb.MissingChunksWarning, match="c/1/0"):
        got = epoch.compute(scheduler="sync")
    assert (got[5:10] == 0).all()
    quiet = dzb.batch_stream(array, 4).to_dask()  # missing="fill": the fill value, no warning
    np.testing.assert_array_equal(quiet.compute(scheduler="sync"), got)
    with pytest.raises(dzb.MissingChunkError):
        dzb.batch_stream(array, 4, missing="error").to_dask().compute(scheduler="sync")


def test_cluster_compute_and_to_zarr(client: Any, tmp_path: Any) -> None:
    """On a LocalCluster's workers, and written with to_zarr: the stream's shuffled order."""
    path = str(tmp_path / "x.zarr")
    to_zarr(make_data((300, 3)), (30, 3), store=zarr.storage.LocalStore(path))
    counting = NamedCountingStore(zarr.storage.LocalStore(path), "to-dask-cluster")
    array = zarr.open_array(counting, mode="r")
    stream = dzb.shuffled_batch_stream(array, 25, seed=4, memory_budget=8_000)
    epoch = stream.to_dask()
    assert epoch.numblocks[0] > 1
    on_cluster = client.compute(epoch).result()
    want = _delivered(stream)
    np.testing.assert_array_equal(on_cluster, want)
    out = str(tmp_path / "shuffled.zarr")
    epoch.to_zarr(out, compute=False).compute(scheduler=client)
    np.testing.assert_array_equal(zarr.open_array(out, mode="r")[:], want)
    # a collection's window joins its members' reads by placing their rows (any worker)
    pair = dzb.shuffled_batch_stream(dzb.concat([array, array]), 25, seed=1, shuffle_buffer_size=90)
    np.testing.assert_array_equal(client.compute(pair.to_dask()).result(), _delivered(pair))


def _leaves(value: Any) -> list[Any]:
    """The arrays of a ``to_dask()`` result or of its computed value (a tuple or dict, nested)."""
    if isinstance(value, da.Array | np.ndarray):
        return [value]
    parts = value.values() if isinstance(value, dict) else value
    return [leaf for part in parts for leaf in _leaves(part)]


def _declared_is_computed(epoch: Any) -> None:
    """Every block of every array computes to the shape and dtype the array declares."""
    for array in _leaves(epoch):
        assert array._meta.dtype == array.dtype and array._meta.ndim == array.ndim
        for index in np.ndindex(*array.numblocks):
            block = array.blocks[index].compute(scheduler="sync")
            want = tuple(sizes[i] for sizes, i in zip(array.chunks, index, strict=True))
            assert (block.shape, block.dtype) == (want, array.dtype), (array.name, index)


def _xarray_field() -> Any:
    xr = pytest.importorskip("xarray")
    data = make_data((6, 8, 3), "float32")
    coords = {"time": np.arange(6) * 10, "x": np.linspace(0, 1, 8), "band": ["r", "g", "b"]}
    return xr.DataArray(data, dims=("time", "x", "band"), coords=coords).chunk({"time": 2})


def _members() -> list[zarr.Array]:
    return [to_zarr(make_data((k, 2)) + 100 * i, (4, 2)) for i, k in enumerate((11, 6, 9))]


def _field() -> zarr.Array:
    return to_zarr(make_data((6, 10, 4), "float32"), (2, 5, 4))


def _x() -> zarr.Array:
    return to_zarr(make_data((30, 3)), (7, 3))


def _labels() -> zarr.Array:
    return to_zarr(np.arange(30, dtype=np.int64) % 3, (9,))


#: each kind's data, made when drawn: (array, labels or None, keywords) or a patch stream's
_BATCH_KINDS: dict[str, Any] = {
    "numpy": lambda: (make_data((30, 2, 2), "int16"), None, {}),
    "zarr3": lambda: (_x(), None, {}),
    "zarr2-big-endian": lambda: (
        to_zarr(make_data((30, 2), ">f4"), (8, 2), zarr_format=2),
        None,
        {},
    ),
    "dask": lambda: (
        da.from_array(make_data((30, 3), "float64"), chunks=((5, 10, 15), 3)),
        None,
        {},
    ),
    "empty": lambda: (to_zarr(make_data((0, 3)), (4, 3)), None, {}),
    "paired": lambda: (_x(), _labels(), {}),
    "paired-drop": lambda: (_x(), _labels(), {"drop_remainder": True}),
    "collection": lambda: (dzb.concat(_members()), None, {"return_sources": True}),
    "mixture": lambda: (dzb.mix(_members(), [2.0, 1.0, 1.0], seed=5), None, {}),
    "subset": lambda: (dzb.chunk_split(_x(), [0.5, 0.5], seed=1)[0], None, {}),
}
_PATCH_KINDS: dict[str, Any] = {
    "patches-whole-dim": lambda: (_field(), {0: 2, 1: 5}, {}),
    "patches-target": lambda: (_field(), {0: 1, 1: 5, 2: 4}, {"target_offset": {0: 1}}),
    "patches-dict": lambda: ({"a": _field(), "b": _field()}, {1: 5}, {}),
    "patches-xarray": lambda: (_xarray_field(), {"time": 2, "x": 4}, {}),
    "patches-xarray-last-axis": lambda: (_xarray_field(), {"time": 3, "band": 1}, {}),
    "patches-xarray-target": lambda: (_xarray_field(), {"time": 2}, {"target_offset": {"time": 1}}),
}


def _kind_stream(kind: str, mode: str, batch: int, seed: int) -> Any:
    if kind in _PATCH_KINDS:
        data, dims, kw = _PATCH_KINDS[kind]()
        shuffle = mode != "none"
        return dzb.patch_stream(data, dims, batch, shuffle=shuffle, seed=seed, return_origins=True,
                                **kw)  # fmt: skip
    array, labels, kw = _BATCH_KINDS[kind]()
    kw |= {"buffer": {"shuffle_buffer_size": 10}, "exact": {"memory_budget": 2**11}}.get(mode, {})
    return _stream(array, mode, batch, seed, labels=labels, **kw)


@property_settings(30)
@given(
    kind=st.sampled_from(sorted(_BATCH_KINDS) + sorted(_PATCH_KINDS)),
    mode=st.sampled_from(MODES),
    batch=st.integers(1, 9),
    seed=seeds,
)
def test_declared_chunks_and_dtype_are_what_blocks_compute(
    kind: str, mode: str, batch: int, seed: int
) -> None:
    """Each array's chunks, dtype and meta are its blocks' (a patch stream's origins with a dim
    taken whole have a column per axis; xarray coordinates at them), for every stream kind."""
    _declared_is_computed(_kind_stream(kind, mode, batch, seed).to_dask())


def test_patch_origins_have_a_column_per_axis_with_a_dim_taken_whole() -> None:
    """The origins of patches that take a dim whole: one column per axis, as the stream's,
    and an xarray's coordinates at them, a coordinate of any axis."""
    stream = dzb.patch_stream(_field(), {0: 2, 1: 5}, 4, return_origins=True)
    _, origins = stream.to_dask()
    assert origins.shape == (len(origins), 3)
    want = np.concatenate([batch[1] for batch in stream])
    np.testing.assert_array_equal(origins.compute(), want)
    stream = dzb.patch_stream(_xarray_field(), {"time": 3, "band": 1}, 4, return_origins=True)
    _, found = stream.to_dask()
    delivered = [batch[1] for batch in stream]
    for name in ("index", "time", "band"):
        np.testing.assert_array_equal(
            found[name].compute(), np.concatenate([batch[name] for batch in delivered])
        )


def _cached_kind(kind: str, paths: list[str], cache: Any) -> Any:
    """A stream of ``kind`` over the arrays at ``paths`` (counted), reading through ``cache``."""
    counts: collections.Counter[str] = collections.Counter()
    x, y = (open_wrapped(CountingStore(zarr.storage.LocalStore(p), counts)) for p in paths)
    kw = {"cache": cache}
    stream = {
        "batch": lambda: dzb.batch_stream(x, 7, **kw),
        "exact": lambda: dzb.shuffled_batch_stream(x, 7, seed=1, memory_budget=2**11, **kw),
        "paired": lambda: dzb.paired_shuffled_batch_stream(x, y, 7, seed=2, **kw),
        "collection": lambda: dzb.shuffled_batch_stream(dzb.concat([x, y]), 7, seed=3, **kw),
        "subset": lambda: dzb.batch_stream(dzb.chunk_split(x, [0.5, 0.5])[1], 7, **kw),
        "patches": lambda: dzb.patch_stream(x, {0: 4}, 3, shuffle=True, return_origins=True, **kw),
    }[kind]()
    return stream, counts


@pytest.mark.parametrize("kind", ["batch", "exact", "paired", "collection", "subset", "patches"])
def test_cached_epoch_array_is_fresh_after_a_rewrite_in_place(kind: str, tmp_path: Any) -> None:
    """A cache serves a second compute (no store read); after the arrays are written again in
    place (same metadata) the same dask array computes the new values, as a new stream reads."""
    paths = [str(tmp_path / name) for name in ("x.zarr", "y.zarr")]
    for path in paths:
        to_zarr(make_data((40, 3)), (10, 3), store=zarr.storage.LocalStore(path))
    cache = dzb.ChunkCache("16MiB")
    stream, counts = _cached_kind(kind, paths, cache)
    epoch = stream.to_dask()
    first = dask.compute(epoch)
    assert counts and set(counts.values()) <= {1, 2, 3, 4}
    counts.clear()
    assert_equal = np.testing.assert_equal
    assert_equal(dask.compute(epoch), first)
    assert not counts  # every chunk a hit
    for path in paths:  # rewritten in place: the same metadata, new values
        zarr.open_array(path, mode="r+")[:] = -make_data((40, 3)) - 1
    again = dask.compute(epoch)
    assert counts  # read again from the store
    fresh, _ = _cached_kind(kind, paths, None)
    assert_equal(again, dask.compute(fresh.to_dask()))
    assert not all(
        np.array_equal(a, b) for a, b in zip(_leaves(again), _leaves(first), strict=True)
    )
