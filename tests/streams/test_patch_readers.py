"""Patch streams read through the reader hook: a counting reader sees every decode.

Each stored chunk a patch stream decodes is one request to the array's reader
(``read/patch_boxes.py``): a wrapper passed as ``reader=`` that counts and
delegates sees each chunk once where the read amplification is 1 (inputs and
their forecast targets sharing a chunk: once; the chunk a sequential window
hands the next one: once), and nothing on an epoch served from a
``ChunkCache``.  A reader that reads the requests itself gives the same
batches.
"""

from __future__ import annotations

import collections
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb

#: what every Counting reader of this module saw (module level: a cluster's
#: in-process workers unpickle their own reader, the test reads this list)
SEEN: list[tuple[int, ...]] = []
MADE: list[str] = []


class Counting:
    """Counts the chunks asked of it and lets the library's reader read them."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def read(self, requests: Any) -> None:
        SEEN.extend(r.chunk for r in requests)
        self.inner.read(requests)


class OwnRead:
    """Reads every request itself, through Zarr (the library's planned read never runs)."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def read(self, requests: Any) -> None:
        for r in requests:
            SEEN.append(r.chunk)
            r.out[r.where] = self.array[r.wanted()]


def counting(array: Any, default: Any) -> Counting:
    MADE.append(str(array.store_path))
    return Counting(default)


def own_read(array: Any, default: Any) -> OwnRead:
    return OwnRead(array)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    SEEN.clear()
    MADE.clear()
    # this module's chunks are tiny: patches a chunk or larger still decoded in place
    monkeypatch.setattr("daskzarr_batches.read.patches.DIRECT_CHUNK_BYTES", 0)


def field(path: Path, shape: Any, chunks: Any, shards: Any = None) -> zarr.Array:
    data = np.arange(int(np.prod(shape)), dtype="f4").reshape(shape)
    array = zarr.create_array(
        str(path), shape=shape, chunks=chunks, shards=shards, dtype="f4", zarr_format=3
    )
    array[...] = data
    return zarr.open_array(str(path), mode="r")


def every_chunk(array: zarr.Array) -> list[tuple[int, ...]]:
    """Every stored chunk of ``array`` (a sharded array's inner chunks)."""
    grid = [range(-(-n // c)) for n, c in zip(array.shape, array.chunks, strict=True)]
    return sorted(itertools.product(*grid))


def batches(stream: Any) -> list[Any]:
    with stream:
        return list(stream)


def assert_same(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        parts = a if isinstance(a, tuple) else (a,)
        for x, y in zip(parts, b if isinstance(b, tuple) else (b,), strict=True):
            np.testing.assert_array_equal(x, y)


def once_each(array: zarr.Array) -> None:
    """The counting reader saw every stored chunk of ``array`` once."""
    counts = collections.Counter(SEEN)
    assert sorted(counts) == every_chunk(array)
    assert set(counts.values()) == {1}, counts


#: a sequential window of about three time steps (so that windows hand chunks on)
SMALL = 3 * 8 * 6 * 4

KINDS = {
    # patches tiling the chunks, sequential and shuffled through a buffer
    "sequential": lambda a, **kw: dzb.patch_stream(a, {0: 1, 1: 4}, 8, window_bytes=SMALL, **kw),
    "shuffled": lambda a, **kw: dzb.patch_stream(
        a, {0: 1, 1: 4}, 8, shuffle=True, seed=3, shuffle_buffer_size=16, **kw
    ),
    # patches smaller than a chunk, overlapping: cut from boxes of whole chunks
    "small": lambda a, **kw: dzb.patch_stream(
        a, {0: 1, 1: 2, 2: 3}, 8, input_overlap={1: 1}, window_bytes=SMALL, **kw
    ),
    # forecast pairs x = t, y = t + 1: the chunk of t + 1 is the next window's input
    "pairs": lambda a, **kw: dzb.patch_stream(
        a, {0: 1}, 3, target_offset={0: 1}, window_bytes=SMALL, **kw
    ),
    "pairs-shuffled": lambda a, **kw: dzb.patch_stream(
        a, {0: 1}, 3, target_offset={0: 1}, shuffle=True, seed=1, shuffle_buffer_size=6, **kw
    ),
    # an input of two steps and its one-step target inside the same chunk pair
    "targets": lambda a, **kw: dzb.patch_stream(
        a, {0: 2, 1: 8}, 2, target_offset={0: 1}, target_dims={0: 1}, window_bytes=SMALL, **kw
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_counting_reader_sees_each_chunk_once(tmp_path: Path, kind: str) -> None:
    """Every chunk of the epoch is asked of the reader once, and the batches are the same."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    expected = batches(KINDS[kind](array))
    stream = KINDS[kind](array, reader=counting)
    got = batches(stream)
    assert_same(got, expected)
    # the epoch decodes only the chunks its patches reach, each once, in several windows
    plan = stream.summary()
    assert plan.read_amplification == pytest.approx(1.0) and len(plan.windows) > 1
    once_each(array)
    assert [str(array.store_path)] == MADE  # the factory: once per array per stream


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_reader_that_reads_the_requests_itself_gives_the_same_batches(
    tmp_path: Path, kind: str
) -> None:
    """The planned read never runs: the boxes, halos and chunks handed on come from ``out``."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    expected = batches(KINDS[kind](array))
    assert_same(batches(KINDS[kind](array, reader=own_read)), expected)
    once_each(array)


def test_overlapping_patches_read_each_chunk_once_per_window(tmp_path: Path) -> None:
    """A halo chunk shared by two boxes of a window is one request (then copied)."""
    array = field(tmp_path / "f.zarr", (4, 12, 6), (2, 4, 6))
    make = lambda **kw: dzb.patch_stream(array, {0: 2, 1: 6}, 64, input_overlap={1: 2}, **kw)  # noqa: E731
    expected = batches(make())
    assert_same(batches(make(reader=counting)), expected)
    once_each(array)
    SEEN.clear()
    assert_same(batches(make(reader=own_read)), expected)
    once_each(array)


def test_a_sharded_array_asks_for_its_inner_chunks(tmp_path: Path) -> None:
    array = field(tmp_path / "s.zarr", (12, 8, 6), (1, 4, 6), shards=(4, 8, 6))
    for kind in ("sequential", "pairs", "targets"):
        SEEN.clear()
        expected = batches(KINDS[kind](array))
        assert_same(batches(KINDS[kind](array, reader=counting)), expected)
        once_each(array)


def test_an_epoch_from_the_cache_asks_the_reader_nothing(tmp_path: Path) -> None:
    """Epoch one: each chunk once, kept; epoch two, from the cache: no request at all."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    for kind in ("sequential", "pairs", "pairs-shuffled"):
        SEEN.clear()
        cache = dzb.ChunkCache("16MiB")
        expected = batches(KINDS[kind](array))
        assert_same(batches(KINDS[kind](array, reader=counting, cache=cache)), expected)
        once_each(array)
        SEEN.clear()
        second = KINDS[kind](array, reader=counting, cache=cache)
        assert_same(batches(second), expected)
        assert SEEN == []
        assert second.stats.cache_misses == 0 and second.stats.cache_hits > 0


#: windows of several batches (the default window_bytes; a buffer of two batches)
WHOLE = {
    "pairs": lambda a, **kw: dzb.patch_stream(a, {0: 1}, 4, target_offset={0: 1}, **kw),
    "pairs-shuffled": KINDS["pairs-shuffled"],
    "shuffled": KINDS["shuffled"],
    "targets": lambda a, **kw: dzb.patch_stream(
        a, {0: 2, 1: 8}, 2, target_offset={0: 1}, target_dims={0: 1}, **kw
    ),
}


@pytest.mark.parametrize("kind", list(WHOLE))
def test_a_batch_inside_a_window_is_its_rows_uncopied_and_independent(
    tmp_path: Path, kind: str
) -> None:
    """Read locally, a patch window's outputs are fresh (no pool) and in plan order, so a
    batch lying in one window is a view of its rows, not copied again; no two batches (nor
    the inputs and targets of one, nor an epoch from the cache) share memory."""
    array = field(tmp_path / "f.zarr", (14, 8, 6), (1, 4, 6))  # windows 1, 1, 2, 4, 5
    expected = batches(WHOLE[kind](array))
    cache = dzb.ChunkCache("16MiB")
    for epoch in range(2):  # epoch two from the cache
        got = batches(WHOLE[kind](array, cache=cache))
        assert_same(got, expected)
        parts = [p for b in got for p in (b if isinstance(b, tuple) else (b,))]
        assert any(not p.flags.owndata for p in parts), epoch  # a window's rows, uncopied
        for a, b in itertools.combinations(parts, 2):
            assert not np.shares_memory(a, b)


def test_chunks_handed_on_from_the_cache_are_not_copied_and_batches_leave_it_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A buffered window hands a chunk the cache served on as the cache's own (no copy);
    batches written to afterwards change neither the cache nor the next epoch."""
    from daskzarr_batches.read.chunk_share import ChunkShare

    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    published: list[np.ndarray] = []
    publish = ChunkShare.publish

    def recording(self: Any, key: Any, future: Any, data: np.ndarray, last: bool) -> None:
        published.append(data)
        publish(self, key, future, data, last)

    monkeypatch.setattr(ChunkShare, "publish", recording)
    cache = dzb.ChunkCache("16MiB")
    expected = batches(KINDS["pairs-shuffled"](array, cache=cache))
    published.clear()
    second = batches(KINDS["pairs-shuffled"](array, cache=cache))
    assert_same(second, expected)
    assert published and not any(data.flags.owndata for data in published)
    for x, y in second:
        x[...], y[...] = -1, -2
    assert_same(batches(KINDS["pairs-shuffled"](array, cache=cache)), expected)


@pytest.mark.cluster
def test_a_counting_reader_on_a_cluster_sees_each_chunk_once(client: Any, tmp_path: Path) -> None:
    """On a cluster each window's task asks its worker's reader (in-process workers here)."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    expected = batches(KINDS["sequential"](array))
    stream = KINDS["sequential"](array, reader=counting, client=client)
    assert_same(batches(stream), expected)
    once_each(array)


def test_forecast_pairs_are_decoded_straight_into_their_patches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Patches a chunk or larger: each chunk decoded into a patch of the window's output (then
    copied into the target that shares it), not into a box the patches are cut from."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    places: list[tuple[int, ...]] = []

    class Places(Counting):
        def read(self, requests: Any) -> None:
            places.extend(r.out.shape for r in requests)
            super().read(requests)

    expected = batches(KINDS["pairs"](array))
    got = batches(KINDS["pairs"](array, reader=lambda a, default: Places(default)))
    assert_same(got, expected)
    once_each(array)
    assert set(places) == {(1, 8, 6)}  # a patch (x or y), never a box of two steps
    monkeypatch.setattr("daskzarr_batches.read.patches.DIRECT_CHUNK_BYTES", 1 << 16)
    places.clear()
    assert_same(batches(KINDS["pairs"](array, reader=lambda a, default: Places(default))), expected)
    assert set(places) == {(2, 8, 6)}  # chunks this small: boxes, the patches cut from them


@pytest.mark.parametrize("kind", ["small", "pairs", "targets"])
def test_a_dask_arrays_blocks_are_requests_too(tmp_path: Path, kind: str) -> None:
    """A dask array's blocks are asked of its reader (computed together by the library's)."""
    import dask.array as da

    data = np.arange(12 * 8 * 6, dtype="f4").reshape(12, 8, 6)
    array = da.from_array(data, chunks=(1, 4, 6)) + 1
    seen: list[tuple[int, ...]] = []

    class Blocks:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def read(self, requests: Any) -> None:
            seen.extend(r.chunk for r in requests)
            self.inner.read(requests)

    expected = batches(KINDS[kind](array))
    assert_same(batches(KINDS[kind](array, reader=lambda a, d: Blocks(d))), expected)
    # each block once per window that needs it (no window hands a block on)
    assert set(seen) == set(itertools.product(range(12), range(2), range(1)))


@pytest.mark.parametrize("kind", ["small", "pairs", "targets"])
def test_a_numpy_arrays_chunks_are_requests_its_boxes_views(kind: str) -> None:
    """An array in memory: its declared chunks asked of its reader (the library's gives the
    boxes as views of it); a reader that fills the requests itself gives the same batches."""
    data = np.arange(12 * 8 * 6, dtype="f4").reshape(12, 8, 6)
    seen: list[tuple[int, ...]] = []

    class Fills:
        def read(self, requests: Any) -> None:
            for r in requests:
                seen.append(r.chunk)
                r.out[r.where] = data[r.wanted()]

    expected = batches(KINDS[kind](data))
    assert_same(batches(KINDS[kind](data, reader=lambda a, d: Counting(d))), expected)
    assert set(SEEN) == {(0, 0, 0)}  # declared as one chunk: its part in each window
    assert_same(batches(KINDS[kind](data, reader=lambda a, d: Fills())), expected)
    assert sorted(seen) == sorted(SEEN)


def test_a_sequential_window_hands_on_only_the_chunks_other_windows_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Patches of one step claim no chunk in the share (no other window reaches theirs, so
    nothing is copied to hand on); forecast pairs claim the chunks at each window's ends."""
    from daskzarr_batches.read.chunk_share import ChunkShare

    claimed: list[Any] = []
    claim = ChunkShare.claim

    def counted(self: ChunkShare, key: Any, last: Any = None) -> Any:
        claimed.append(key)
        return claim(self, key, last)

    monkeypatch.setattr(ChunkShare, "claim", counted)
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    batches(KINDS["sequential"](array))
    assert claimed == []
    stream = KINDS["pairs"](array, reader=counting)
    batches(stream)
    once_each(array)
    windows = len(stream.summary().windows)
    # each window boundary: its chunk (two across the trailing axis) claimed on both sides
    assert len(claimed) == 2 * 2 * (windows - 1)


def test_a_chunk_handed_on_that_does_not_decode_is_skipped_by_both_windows(
    tmp_path: Path,
) -> None:
    """Forecast pairs over windows of three steps: the chunk at a window's end (claimed by
    it, awaited by the next) is junk.  Neither window waits for ever: the error names it,
    and with ``on_error="skip"`` the pairs touching it leave the epoch, the others stay."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    (tmp_path / "f.zarr" / "c" / "3" / "0" / "0").write_bytes(b"junk")
    make = KINDS["pairs"]
    with pytest.raises(dzb.errors.CorruptChunkError, match=r"chunk \(3, 0, 0\)"):
        batches(make(array, reader=counting))
    with pytest.warns(dzb.errors.SkippedChunksWarning, match=r"chunk \(3, 0, 0\)"):
        got = batches(make(array, reader=counting, on_error="skip", return_origins=True))
    data = np.arange(12 * 8 * 6, dtype="f4").reshape(12, 8, 6)
    steps = [int(t) for _, _, where in got for t in where[:, 0]]
    assert steps == [t for t in range(11) if t not in (2, 3)]
    for x, y, where in got:
        for a, b, (t, _, _) in zip(x, y, where.tolist(), strict=True):
            np.testing.assert_array_equal(a, data[t : t + 1])
            np.testing.assert_array_equal(b, data[t + 1 : t + 2])


@pytest.mark.cluster
def test_on_a_cluster_with_a_cache_epoch_two_asks_nothing(client: Any, tmp_path: Path) -> None:
    """The cache keeps the blocks on the cluster (read through the reader once); the second
    epoch cuts its patches from them, asking no reader anything."""
    array = field(tmp_path / "f.zarr", (12, 8, 6), (1, 4, 6))
    cache = dzb.ChunkCache("16MiB")
    expected = batches(KINDS["pairs"](array))
    assert_same(
        batches(KINDS["pairs"](array, reader=counting, client=client, cache=cache)), expected
    )
    once_each(array)
    SEEN.clear()
    second = KINDS["pairs"](array, reader=counting, client=client, cache=cache)
    assert_same(batches(second), expected)
    cache.clear()  # its futures leave the cluster
    assert SEEN == []
    assert second.stats.cache_misses == 0 and second.stats.cache_hits > 0
