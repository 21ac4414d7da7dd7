"""Collections (``concat``, ``open_collection``): many arrays as one dataset along axis 0.

Every mode delivers exactly ``np.concatenate`` of the members, pairs stay aligned,
provenance names the member and position, ranks and resume are exact, a chunk split
holds whole member chunks, a cluster gives what local threads give, and opening many
stores overlaps their metadata reads.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from strategies import property_settings, seeds, to_zarr

import daskzarr_batches as dzb
from daskzarr_batches.store.sources import as_source

WIDTH = 3


def _member(data: np.ndarray, kind: str, chunk: int) -> Any:
    if kind == "numpy":
        return data
    if kind == "dask":
        return da.from_array(data, chunks=(chunk, 2))
    if kind == "sharded":
        array = zarr.create_array(
            zarr.storage.MemoryStore(), shape=data.shape, dtype=data.dtype,
            chunks=(chunk, WIDTH), shards=(2 * chunk, WIDTH),
        )  # fmt: skip
        if data.size:
            array[...] = data
        return array
    return to_zarr(data, (chunk, WIDTH))


@st.composite
def collections(draw: st.DrawFn) -> tuple[list[Any], np.ndarray, list[int]]:
    """Members (random kinds, lengths incl. 0, chunkings) and the data they join to."""
    count = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(0, 30), min_size=count, max_size=count))
    if sum(lengths) == 0:
        lengths[0] = 1
    kinds = st.sampled_from(["numpy", "zarr", "sharded", "dask"])
    members, parts, at = [], [], 0
    for length in lengths:
        data = (np.arange(at, at + length, dtype=np.int64)[:, None] * WIDTH) + np.arange(WIDTH)
        members.append(_member(data.astype(np.int32), draw(kinds), draw(st.integers(1, 8))))
        parts.append(data.astype(np.int32))
        at += length
    return members, np.concatenate(parts), lengths


def _ids(batch: np.ndarray) -> np.ndarray:
    return batch[:, 0].astype(np.int64) // WIDTH


def _check_sources(sources: np.ndarray, ids: np.ndarray, lengths: list[int]) -> None:
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    assert sources.dtype == np.int64 and sources.shape == (len(ids), 2)
    assert np.array_equal(offsets[sources[:, 0]] + sources[:, 1], ids)
    assert (sources[:, 1] < np.asarray(lengths)[sources[:, 0]]).all()


@property_settings(30)
@given(collections(), st.sampled_from(["none", "buffer", "exact"]), st.integers(1, 9), seeds)
def test_every_sample_once_and_provenance(case: Any, mode: str, batch: int, seed: int) -> None:
    members, full, lengths = case
    labels = dzb.concat([m[:, 0].astype(np.int64) if isinstance(m, np.ndarray) else
                         np.asarray(m[:, 0]).astype(np.int64) for m in members])  # fmt: skip
    features = dzb.concat(members)
    assert features.shape == full.shape and features.lengths == tuple(lengths)
    if mode == "none":
        stream = dzb.paired_batch_stream(features, labels, batch, return_sources=True)
    else:
        stream = dzb.paired_shuffled_batch_stream(
            features, labels, batch, seed=seed, return_sources=True,
            shuffle_buffer_size=7 if mode == "buffer" else None,
            memory_budget=30 * (WIDTH * 4 + 8 + 16 + 32),  # a few windows
        )  # fmt: skip
    items = list(stream)
    x = np.concatenate([f for f, _, _ in items])
    y = np.concatenate([label for _, label, _ in items])
    sources = np.concatenate([s for _, _, s in items])
    ids = _ids(x)
    assert np.array_equal(y, x[:, 0])  # pairs aligned across members
    assert np.array_equal(x, full[ids])
    if mode == "none":
        assert np.array_equal(x, full)
    else:
        assert np.array_equal(np.sort(ids), np.arange(len(full)))
    _check_sources(sources, ids, lengths)
    assert stream.stats.read_amplification is None or stream.stats.read_amplification >= 1.0


@property_settings(15)
@given(collections(), st.integers(1, 3), st.integers(1, 6), seeds, st.integers(0, 8))
def test_ranks_and_resume(case: Any, world: int, batch: int, seed: int, stop: int) -> None:
    members, full, lengths = case
    data = dzb.concat(members)

    def loader(rank: int = 0, size: int = world) -> dzb.Loader:
        return dzb.Loader(
            data, batch, shuffle=True, shuffle_buffer_size=5, seed=seed, rank=rank,
            world_size=size, even_batches=False, return_sources=True,
        )  # fmt: skip

    seen = []
    for rank in range(world):
        for x, sources in loader(rank):
            _check_sources(sources, _ids(x), lengths)
            seen.append(_ids(x))
    ids = np.concatenate(seen) if seen else np.empty(0, np.int64)
    assert len(np.unique(ids)) == len(ids) == len(full) // world * world
    # resume in a new loader after `stop` batches gives the rest of the epoch exactly
    whole = [x for x, _ in loader(0, 1)]
    first = loader(0, 1)
    it = iter(first)
    for _ in range(min(stop, len(whole))):
        next(it)
    state = first.state_dict()
    again = loader(0, 1)
    again.load_state_dict(state)
    rest = [x for x, _ in again]
    assert len(rest) == len(whole) - min(stop, len(whole))
    for a, b in zip(rest, whole[len(whole) - len(rest) :], strict=True):
        assert np.array_equal(a, b)


def test_dict_members_give_dict_batches() -> None:
    x = [np.arange(n * 2).reshape(n, 2) + 100 * i for i, n in enumerate([5, 0, 9])]
    y = [part[:, 0] * 10 for part in x]
    data = dzb.concat([{"x": a, "y": b} for a, b in zip(x, y, strict=True)])
    assert set(data) == {"x", "y"} and isinstance(data["x"], dzb.Collection)
    batches = list(dzb.Loader(data, 4, shuffle=True, seed=3, return_sources=True))
    assert list(batches[0]) == ["x", "y", "sources"]
    xs = np.concatenate([b["x"] for b in batches])
    assert np.array_equal(np.concatenate([b["y"] for b in batches]), xs[:, 0] * 10)
    sources = np.concatenate([b["sources"] for b in batches])
    member = np.concatenate(x)[np.array([0, 5, 5])[sources[:, 0]] + sources[:, 1]]
    assert np.array_equal(member, xs)
    pairs = dzb.concat([(a, b) for a, b in zip(x, y, strict=True)])
    assert isinstance(pairs, tuple) and len(pairs) == 2
    f, labels = next(iter(dzb.paired_batch_stream(*pairs, 20)))
    assert np.array_equal(labels, f[:, 0] * 10)


def test_mismatches_name_the_member_and_value() -> None:
    a = np.zeros((4, 3), "f4")
    with pytest.raises(dzb.ArgumentValueError, match=r"member 2 has trailing shape \(4,\)"):
        dzb.concat([a, a, np.zeros((2, 4), "f4")])
    with pytest.raises(dzb.ArgumentValueError, match="member 1 has dtype float64"):
        dzb.concat([a, np.zeros((2, 3))])
    with pytest.raises(dzb.ArgumentValueError, match="member 0's arrays differ in length"):
        dzb.concat([{"x": a, "y": np.zeros(3)}])
    with pytest.raises(dzb.ArgumentTypeError, match="member 1 is"):
        dzb.concat([{"x": a}, {"z": a}])
    with pytest.raises(dzb.ArgumentValueError, match="at least one"):
        dzb.concat([])
    with pytest.raises(dzb.ArgumentValueError, match="return_sources=True needs a collection"):
        dzb.batch_stream(a, 2, return_sources=True)
    with pytest.raises(dzb.ArgumentTypeError, match="a patch would span two members"):
        dzb.patch_stream(dzb.concat([a, a]), {1: 2}, 2)


def test_chunk_split_holds_whole_member_chunks() -> None:
    parts = [np.arange(n * WIDTH).reshape(n, WIDTH) + 1000 * i for i, n in enumerate([12, 7, 20])]
    members = [to_zarr(p.astype("i4"), (c, WIDTH)) for p, c in zip(parts, [4, 3, 5], strict=True)]
    data = dzb.concat(members)
    full = np.concatenate(parts).astype("i4")
    train, valid = dzb.chunk_split(data, [0.6, 0.4], seed=2)
    starts = {int(s) for s in np.cumsum([0, 4, 4, 4, 3, 3, 1, 5, 5, 5, 5])}
    for subset in (train, valid):
        for lo, hi in subset.ranges:
            assert lo in starts and hi in starts  # whole member chunks
        got = np.concatenate(list(dzb.batch_stream(subset, 5)))
        assert np.array_equal(got, np.concatenate([full[a:b] for a, b in subset.ranges]))
        shuffled = list(dzb.shuffled_batch_stream(subset, 5, seed=1, return_sources=True))
        rows = np.concatenate([x for x, _ in shuffled])
        sources = np.concatenate([s for _, s in shuffled])
        offsets = np.array(data.offsets)
        assert np.array_equal(full[offsets[sources[:, 0]] + sources[:, 1]], rows)
        blocks = np.concatenate(list(dzb.chunk_stream(subset)))
        assert np.array_equal(blocks, got)
    assert len(train) + len(valid) == len(full)


def test_chunk_streams_and_moments_over_members_tiled_differently() -> None:
    parts = [np.random.default_rng(i).normal(size=(n, 4)) for i, n in enumerate([9, 0, 13])]
    members = [to_zarr(parts[0], (4, 4)), parts[1], da.from_array(parts[2], chunks=(5, 3))]
    data = dzb.concat(members)
    blocks = list(dzb.chunk_stream(data, with_index=True))
    assert [index for index, _ in blocks][:3] == [(0, 0), (1, 0), (2, 0)]
    assert sum(block.size for _, block in blocks) == sum(p.size for p in parts)
    moments = dzb.feature_moments(data)
    full = np.concatenate(parts)
    assert moments.count == len(full)
    np.testing.assert_allclose(moments.mean, full.mean(axis=0))
    np.testing.assert_allclose(moments.variance(), full.var(axis=0))
    plan = dzb.plan_epoch(data, 4, shuffle=True, seed=0, shuffle_buffer_size=8)
    assert plan.n_windows > 1 and plan.read_amplification == 1.0


def test_cluster_gives_what_local_threads_give(client: Any) -> None:
    parts = [np.arange(n * WIDTH).reshape(n, WIDTH) + 10_000 * i for i, n in enumerate([30, 0, 41])]
    members = [parts[0], parts[1], to_zarr(parts[2], (8, WIDTH))]
    data = dzb.concat(members)
    for buffer in (None, 16):
        kwargs = {"seed": 4, "shuffle_buffer_size": buffer, "return_sources": True}
        local = list(dzb.shuffled_batch_stream(data, 6, client=None, **kwargs))
        remote = list(dzb.shuffled_batch_stream(data, 6, client=client, **kwargs))
        assert len(local) == len(remote)
        for (a, s), (b, t) in zip(local, remote, strict=True):
            assert np.array_equal(a, b) and np.array_equal(s, t)


def test_a_cluster_counts_the_join_in_the_budget(client: Any) -> None:
    # on a cluster the join holds a collection's window twice: its exact windows are
    # sized for that, the order unchanged, and a Loader's state resumes across the two
    parts = [np.arange(n * WIDTH).reshape(n, WIDTH) + 10_000 * i for i, n in enumerate([300, 500])]
    data = dzb.concat([parts[0], to_zarr(parts[1], (64, WIDTH))])
    one = to_zarr(np.concatenate(parts), (64, WIDTH))
    kwargs = {"seed": 2, "memory_budget": 40_000}

    def plan(array: Any, where: Any) -> Any:
        with dzb.shuffled_batch_stream(array, 16, client=where, **kwargs) as stream:
            return stream.summary()

    here, there, alone = plan(data, None), plan(data, client), plan(one, client)
    assert alone.windows[0].samples == here.windows[0].samples  # one array: no join
    assert there.windows[0].samples < here.windows[0].samples
    remote = np.concatenate(list(dzb.shuffled_batch_stream(data, 16, client=client, **kwargs)))
    local = np.concatenate(list(dzb.shuffled_batch_stream(data, 16, client=None, **kwargs)))
    assert np.array_equal(remote, local)
    loader = dzb.Loader(data, 16, shuffle=True, client=None, **kwargs)
    batches = iter(loader)
    next(batches)
    state = loader.state_dict()
    batches.close()
    other = dzb.Loader(data, 16, shuffle=True, client=client, **kwargs)
    other.load_state_dict(state)
    rest = np.concatenate(list(other))
    assert np.array_equal(rest, local[16:])


def test_open_collection_reads_metadata_concurrently(tmp_path: Any) -> None:
    from benchmarks.latency_store import LatencyStore

    state = {"requests": 0, "now": 0, "peak": 0}  # shared: requests in flight over all stores
    stores = []
    for i in range(200):
        store = zarr.storage.MemoryStore()
        to_zarr(np.full((3, WIDTH), i, dtype="i2"), (2, WIDTH), store=store)
        stores.append(LatencyStore(store, 0.02, state, metadata=True))
    data = dzb.open_collection(stores)
    assert data.lengths == (3,) * 200
    assert state["peak"] >= 4  # opening one store after another keeps one read in flight
    rows = np.concatenate(list(dzb.batch_stream(data, 50)))
    assert np.array_equal(rows[::3, 0], np.arange(200))
    # a glob of local paths, sorted
    for i in range(3):
        to_zarr(np.full((2, WIDTH), i, "i2"), (2, WIDTH), store=str(tmp_path / f"s{i}.zarr"))
    opened = dzb.open_collection(str(tmp_path / "s*.zarr"))
    assert opened.lengths == (2, 2, 2)
    assert np.array_equal(
        np.concatenate(list(dzb.batch_stream(opened, 4)))[:, 0], [0, 0, 1, 1, 2, 2]
    )
    with pytest.raises(dzb.ArgumentValueError, match="matches no path"):
        dzb.open_collection(str(tmp_path / "none*.zarr"))


def test_info_and_bench_take_several_stores(tmp_path: Any, capsys: Any) -> None:
    from daskzarr_batches.tools.cli import main

    paths = []
    for i, rows in enumerate([40, 25]):
        path = str(tmp_path / f"m{i}.zarr")
        to_zarr(np.ones((rows, WIDTH), "f4"), (10, WIDTH), store=path)
        paths.append(path)
    assert main(["info", *paths]) == 0
    assert "2 stores as a collection along axis 0" in capsys.readouterr().out
    assert main(["info", *paths, "--json"]) == 0
    import json

    assert [r["store"] for r in json.loads(capsys.readouterr().out)] == paths
    assert main(["bench", *paths, "--batch-size", "8", "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["data"]["features"]["shape"] == [65, WIDTH]
    assert summary["total"]["samples"] == 65


@pytest.mark.parametrize("plan_order", [False, True])
def test_a_collection_window_is_read_into_one_output(plan_order: bool) -> None:
    # read here, each member's read fills its part of the window's output (no join
    # copy: the members' rows are views of it); on a cluster (plan order) the join
    # places them in an output of its own
    import dask

    from daskzarr_batches.read.context import ReadContext
    from daskzarr_batches.read.graphs import window_graph
    from daskzarr_batches.streams.spec import StreamSpec

    data = np.arange(300 * WIDTH, dtype="f4").reshape(300, WIDTH)
    members = [
        _member(data[:120], "zarr", 25),
        _member(data[120:130], "numpy", 4),
        _member(data[130:], "sharded", 16),
        _member(data[:0], "zarr", 8),
    ]
    spec = StreamSpec(
        (dzb.concat(members),), 16, shuffle="exact", seed=3, memory_budget=2**20, ramp=False
    )
    window = next(iter(spec.plan().windows()))  # the whole data (no ramp): every member
    ctx = ReadContext(plan_order=plan_order, decode_bytes=spec.decode_bytes)
    dsk, key = window_graph(spec.sources, window, "t", ctx)
    parts = [k for k in dsk if isinstance(k, tuple) and k[0].startswith("dzb-member-")]
    (out, _), *reads = dask.get(dsk, [(key[0].replace("window", "array"), 0, 0), *parts])
    order = np.sort(window.samples)
    expected = data[window.samples] if plan_order else data[order]
    np.testing.assert_array_equal(out, expected)
    assert len(reads) == 3  # the empty member is not read
    assert all(np.shares_memory(rows, out) for rows, _ in reads) is not plan_order


def _plain_members(tmp_path: Any) -> tuple[list[zarr.Array], np.ndarray]:
    """Three local stores of the plain zstd layout, lengths 23, 17, 30 in chunks of 8."""
    data = (np.arange(70 * WIDTH, dtype="f4").reshape(70, WIDTH)) + 1
    members, at = [], 0
    for i, length in enumerate((23, 17, 30)):
        x = zarr.create_array(tmp_path / f"m{i}.zarr", shape=(length, WIDTH), chunks=(8, WIDTH),
                              dtype="f4")  # fmt: skip
        x[:] = data[at : at + length]
        members.append(x)
        at += length
    return members, data


KINDS = {
    "sequential": lambda d: dzb.batch_stream(d, 6, on_error="skip", missing="fill"),
    "buffered": lambda d: dzb.shuffled_batch_stream(
        d, 6, seed=1, shuffle_buffer_size=24, on_error="skip", missing="fill"
    ),
    "exact": lambda d: dzb.shuffled_batch_stream(d, 6, seed=1, on_error="skip", missing="fill"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_plain_members_read_together_skip_and_fill_as_alone(tmp_path: Any, kind: str) -> None:
    # a window's plain zstd members are one read (read.window.read_members); a chunk
    # that does not decode is still skipped and named, an absent one filled, as when
    # each member is read on its own
    from daskzarr_batches.read.graphs import window_graph
    from daskzarr_batches.read.window import read_member_window
    from daskzarr_batches.streams.spec import StreamSpec

    members, data = _plain_members(tmp_path)
    (tmp_path / "m1.zarr" / "c" / "1" / "0").write_bytes(b"not zstd at all")  # rows 31:39
    (tmp_path / "m2.zarr" / "c" / "2" / "0").unlink()  # rows 56:64: the fill value, 0
    joined = dzb.concat(members)
    spec = StreamSpec((joined,), 6)
    dsk, _ = window_graph(spec.sources, next(iter(spec.plan().windows())), "t")
    tasks = [task[0] for task in dsk.values()]
    assert tasks.count(read_member_window) == 1 and len(tasks) == 2  # and the window's tuple
    stream = KINDS[kind](joined)
    with pytest.warns(dzb.SkippedChunksWarning):
        got = np.concatenate(list(stream))
    expected = data.copy()
    expected[56:64] = 0
    expected = np.delete(expected, np.s_[31:39], axis=0)
    got = got[np.lexsort(got.T[::-1])]
    expected = expected[np.lexsort(expected.T[::-1])]
    np.testing.assert_array_equal(got, expected)
    assert [(s.chunk, s.samples) for s in stream.stats.skipped] == [(4, range(31, 39))]
    assert stream.stats.chunks_missing == 1


def test_a_member_fetch_that_fails_for_good_is_named_and_not_read_again(tmp_path: Any) -> None:
    from stores import FaultStore

    members, _ = _plain_members(tmp_path)
    faulty = FaultStore(members[1].store, {"c/1/0": [PermissionError("denied")]})
    members[1] = zarr.open_array(store=faulty, mode="r")
    with pytest.raises(dzb.ChunkReadError, match="PermissionError") as raised:
        list(dzb.batch_stream(dzb.concat(members), 6, retries=5))
    assert "axis-0 chunk 1" in str(raised.value)
    assert faulty.attempts["c/1/0"] == 1


@property_settings(40)
@given(
    lengths=st.lists(st.integers(0, 300_000), min_size=1, max_size=8).filter(lambda v: sum(v) > 0),
    draws=st.integers(0, 2000),
    seed=seeds,
)
def test_run_index_finds_each_ids_member_as_searchsorted(
    lengths: list[int], draws: int, seed: int
) -> None:
    from daskzarr_batches.plan.windows import RunIndex

    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.random.default_rng(seed).integers(0, offsets[-1], draws)
    ids = np.concatenate([ids, offsets[:-1][np.diff(offsets) > 0], [offsets[-1] - 1]])
    expected = np.searchsorted(offsets, ids, side="right") - 1
    np.testing.assert_array_equal(RunIndex(offsets)(ids), expected)


def test_each_source_kind_answers_what_the_streams_ask() -> None:
    """The streams ask a source, not its kind: each kind overrides the answers it differs in."""
    a, b = np.arange(40.0).reshape(20, 2), np.arange(24.0).reshape(12, 2)
    plain = as_source(a)
    assert plain.member_sources == (plain,) and plain.member_index() is None
    assert plain.member_block((1, 0)) == (0, (1, 0))
    assert plain.split_axis is None and plain.subset_ranges is None and plain.mix_rule is None
    assert plain.patch_grid is None and plain.patch_cut is None and plain.patched is None
    assert plain.part_chunk(0) is None and not plain.computed
    assert plain.block_sizes((0, 0)) == (plain.chunks[0][0], 2)
    joined = as_source(dzb.concat([zarr.array(a, chunks=(8, 2)), zarr.array(b, chunks=(5, 1))]))
    assert joined.member_sources == joined.parts() and joined.member_index() is not None
    assert joined.part_chunk(3) == (1, 0) and joined.member_block((3, 1)) == (1, (0, 1))
    assert joined.block_sizes((3, 1)) == (5, 1)  # the member's own grid, not the first's
    subset = as_source(dzb.chunk_split(zarr.array(a, chunks=(8, 2)), [0.5, 0.5], seed=0)[1])
    assert subset.split_axis == 0 and subset.subset_ranges is not None
    assert subset.part_chunk(0) == (0, subset.block_index((0, 0))[0])
    mixture = as_source(dzb.mix([a, b], [0.5, 0.5], seed=3))
    assert mixture.mix_rule is not None and mixture.mix_rule.lengths == (20, 12)
    stream = dzb.patch_stream(zarr.array(a, chunks=(8, 2)), {0: 4}, 2, return_origins=True)
    patches, origins = stream.spec.sources
    assert patches.patch_grid is not None and patches.patch_cut is not None
    assert origins.patch_grid is not None and origins.patch_cut is None  # the origins
    assert patches.patch_boxes(np.arange(2), [2]) is not None
    assert origins.patch_boxes(np.arange(2), [2]) is None
    provenance = dzb.batch_stream(dzb.concat([a, b]), 4, return_sources=True).spec.sources[-1]
    assert provenance.computed
