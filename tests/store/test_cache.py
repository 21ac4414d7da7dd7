"""The decoded-chunk cache: later epochs from memory or disk, never a wrong chunk."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st

import daskzarr_batches as dzb
from daskzarr_batches.store.cache import ChunkCache
from tests.stores import CountingStore, open_wrapped
from tests.strategies import property_settings


def make(
    path: Path,
    shape: tuple[int, ...] = (400, 6),
    chunks: tuple[int, ...] = (50, 6),
    shards: tuple[int, ...] | None = None,
) -> Any:
    data = np.random.default_rng(0).standard_normal(shape).astype("f4")
    zarr.create_array(
        zarr.storage.LocalStore(str(path)), shape=shape, chunks=chunks, shards=shards,
        dtype="f4", overwrite=True,
    )[:] = data  # fmt: skip
    return data


def counted(path: Path) -> tuple[Any, CountingStore]:
    counting = CountingStore(zarr.storage.LocalStore(str(path), read_only=True))
    return open_wrapped(counting), counting


@pytest.mark.parametrize(
    "make_stream",
    [
        lambda a, c: dzb.batch_stream(a, 32, cache=c),
        lambda a, c: dzb.shuffled_batch_stream(a, 32, seed=1, shuffle_buffer_size=100, cache=c),
        lambda a, c: dzb.shuffled_batch_stream(a, 32, seed=1, memory_budget=20_000, cache=c),
        lambda a, c: dzb.chunk_stream(a, cache=c),
        lambda a, c: dzb.patch_stream(a, {0: 10, 1: 3}, 8, cache=c),
    ],
    ids=["sequential", "buffer", "exact", "chunks", "patches"],
)
@pytest.mark.parametrize("shards", [None, (100, 6)], ids=["chunks", "shards"])
def test_second_epoch_reads_no_store_and_equals_the_first(
    tmp_path: Path, make_stream: Any, shards: Any
) -> None:
    make(tmp_path / "a.zarr", chunks=(25, 3) if shards else (50, 6), shards=shards)
    array, counting = counted(tmp_path / "a.zarr")
    reference = list(make_stream(array, None))
    uncached = dict(counting.counts)
    counting.counts.clear()
    cache = ChunkCache("64MiB")
    first = make_stream(array, cache)
    got = list(first)
    # no more requests than uncached, each stored object fetched once (an exact shuffle reads
    # chunks in several windows: later windows hit); a shard's index and ranges are two
    assert set(counting.counts) == set(uncached)
    if not shards:  # (the shard reader may read a shard as its index and a range: two)
        assert set(counting.counts.values()) == {1}
    assert first.stats.cache_misses > 0
    counting.counts.clear()
    second = make_stream(array, cache)
    again = list(second)
    assert not counting.counts  # nothing fetched from the store
    assert second.stats.cache_misses == 0 and second.stats.cache_hits > 0
    assert second.stats.bytes_from_cache > 0
    # the caller owns what it gets: never a read-only view of a cached chunk
    assert all(item.flags.writeable for item in got + again if isinstance(item, np.ndarray))
    for a, b, c in zip(reference, got, again, strict=True):
        for x, y, z in zip(np.atleast_1d(a), np.atleast_1d(b), np.atleast_1d(c), strict=True):
            np.testing.assert_array_equal(x, y)
            np.testing.assert_array_equal(x, z)


def test_directory_serves_a_new_process_and_detects_damage(tmp_path: Path) -> None:
    data = make(tmp_path / "a.zarr")
    directory = tmp_path / "cache"
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")

    def here() -> list[str]:  # a cache of its own over the directory (memory=0: disk alone)
        stream = dzb.batch_stream(array, 64, cache=ChunkCache(0, directory=directory))
        x = np.concatenate(list(stream))
        stats = stream.stats
        return [str(v) for v in (stats.cache_hits, stats.cache_misses, stats.cache_damaged)] + [
            str(float(x.sum()))
        ]

    script = (
        "import sys, numpy as np, zarr, daskzarr_batches as dzb\n"
        "c = dzb.ChunkCache(0, directory=sys.argv[2])\n"
        "s = dzb.batch_stream(zarr.open_array(sys.argv[1], mode='r'), 64, cache=c)\n"
        "x = np.concatenate(list(s))\n"
        "print(s.stats.cache_hits, s.stats.cache_misses, s.stats.cache_damaged, float(x.sum()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    expected = str(float(data.sum()))
    assert here() == ["0", "8", "0", expected]
    other = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "a.zarr"), str(directory)],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    assert other.stdout.split() == ["8", "0", "0", expected]  # another process: all from disk
    files = sorted(directory.glob("*.chunk"))
    assert len(files) == 8
    truncated, flipped = files[0], files[1]
    truncated.write_bytes(truncated.read_bytes()[:-5])
    raw = bytearray(flipped.read_bytes())
    raw[-1] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    files[2].unlink()
    assert here() == ["5", "3", "2", expected]  # damaged ones dropped and read again
    assert here() == ["8", "0", "0", expected]


def test_a_rewritten_array_is_never_served_from_the_cache(tmp_path: Path) -> None:
    make(tmp_path / "a.zarr")
    cache = ChunkCache("64MiB", directory=tmp_path / "cache")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    list(dzb.batch_stream(array, 64, cache=cache))
    for chunks in [(40, 6), (50, 6)]:  # other metadata; then the same metadata, written again
        time.sleep(0.01)
        new = make(tmp_path / "a.zarr", chunks=chunks) + 1
        zarr.open_array(str(tmp_path / "a.zarr"), mode="r+")[:] = new
        reopened = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
        stream = dzb.batch_stream(reopened, 64, cache=cache)
        np.testing.assert_array_equal(np.concatenate(list(stream)), new)
        assert stream.stats.cache_hits == 0


def test_budget_smaller_than_a_chunk_bypasses_and_a_full_disk_warns(tmp_path: Path) -> None:
    data = make(tmp_path / "a.zarr")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    cache = ChunkCache(100, directory=tmp_path / "cache", disk=100)  # a chunk is 1,200 bytes
    for _ in range(2):
        stream = dzb.batch_stream(array, 64, cache=cache)
        np.testing.assert_array_equal(np.concatenate(list(stream)), data)
        assert stream.stats.cache_hits == 0
    assert not list((tmp_path / "cache").glob("*.chunk"))
    blocked = tmp_path / "blocked"
    cache = ChunkCache(0, directory=blocked)
    os.chmod(blocked, 0o500)  # not writable (as root: a file where the directory was)
    if os.access(blocked, os.W_OK):
        os.chmod(blocked, 0o700)
        blocked.rmdir()
        blocked.write_text("not a directory")
    try:
        with pytest.warns(dzb.CacheWarning, match="cannot write"):
            stream = dzb.batch_stream(array, 64, cache=cache)
            np.testing.assert_array_equal(np.concatenate(list(stream)), data)
    finally:
        if blocked.is_dir():
            os.chmod(blocked, 0o700)


def test_bad_cache_arguments_are_named() -> None:
    with pytest.raises(dzb.ArgumentValueError, match="memory='lots'"):
        ChunkCache("lots")
    with pytest.raises(dzb.ArgumentValueError, match="needs a directory"):
        ChunkCache(disk="1GiB")
    with pytest.raises(dzb.ArgumentTypeError, match="cache must be a ChunkCache"):
        dzb.batch_stream(np.zeros((4, 2)), 2, cache="yes")


@pytest.mark.parametrize("shards", [None, (100, 6)], ids=["chunks", "shards"])
def test_the_plan_says_what_the_cache_holds_and_keeps_its_order(
    tmp_path: Path, shards: Any
) -> None:
    make(tmp_path / "a.zarr", chunks=(25, 3) if shards else (50, 6), shards=shards)
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    cache = ChunkCache("64MiB", directory=tmp_path / "cache")
    exact = {"shuffle": True, "seed": 1, "memory_budget": 20_000}
    plain = dzb.plan_epoch(array, 32, **exact)
    assert plain.chunks_cached is None and "chunks_cached" not in plain.totals()
    empty = dzb.plan_epoch(array, 32, cache=cache, **exact)
    assert empty.chunks_cached == 0 and empty.windows[0].chunks_cached == 0
    assert [w.chunks for w in empty.windows] == [w.chunks for w in plain.windows]
    half = dzb.chunk_split(array, [0.5, 0.5], seed=0)[0]  # every chunk of half the rows
    list(dzb.batch_stream(half, 32, cache=cache))
    rows = dzb.plan_epoch(array, 32, cache=cache)
    assert 0 < rows.chunks_cached < rows.chunks_read
    assert "cache holds" in str(rows) and rows.rows()[0]["chunks_cached"] >= 0
    stream = dzb.batch_stream(array, 32, cache=cache)
    assert stream.summary().chunks_cached == rows.chunks_cached  # the same function
    list(stream)
    per_chunk = 2 if shards else 1  # stored chunks per axis-0 chunk
    assert stream.stats.cache_hits == rows.chunks_cached * per_chunk
    assert stream.stats.cache_misses == (rows.chunks_read - rows.chunks_cached) * per_chunk
    full = dzb.plan_epoch(array, 32, cache=cache, **exact)
    assert full.chunks_cached == full.chunks_read
    assert [w.chunks for w in full.windows] == [w.chunks for w in plain.windows]
    disk = dzb.plan_epoch(array, 32, cache=ChunkCache(0, directory=tmp_path / "cache"), **exact)
    assert disk.chunks_cached == full.chunks_read  # the directory's files count too
    patches = dzb.plan_epoch(array, 8, input_dims={0: 10, 1: 3}, cache=cache)
    # a patch stream reads sharded arrays through Zarr's pipeline: whole shards, not held yet
    assert patches.chunks_cached == (0 if shards else patches.chunks_read)
    assert dzb.plan_epoch(np.zeros((10, 2)), 4, cache=cache).chunks_cached == 0


# --------------------------------------------------------------------------
# Reliability: shared directories, files gone mid-epoch, a full disk

CHUNK = 50 * 6 * 4  # decoded bytes of one chunk of make()'s array
#: memory and disk budgets around one chunk: none, less than one, a few, all of them
budgets = st.sampled_from([0, CHUNK // 2, 3 * CHUNK, 64 * CHUNK])
disks = st.sampled_from([None, CHUNK // 2, 3 * CHUNK + 600, 64 * CHUNK])


def epoch_of(array: Any, cache: ChunkCache | None, epoch: int) -> np.ndarray:
    stream = dzb.shuffled_batch_stream(
        array, 32, seed=3, epoch=epoch, shuffle_buffer_size=100, cache=cache
    )
    return np.concatenate(list(stream))


@property_settings(12)
@given(memory=st.tuples(budgets, budgets), disk=st.tuples(disks, disks))
def test_two_caches_sharing_a_directory_always_serve_the_uncached_epoch(
    memory: tuple[int, int], disk: tuple[int | None, int | None]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        make(Path(tmp) / "a.zarr")
        array = zarr.open_array(str(Path(tmp) / "a.zarr"), mode="r")
        expected = [epoch_of(array, None, epoch) for epoch in range(3)]
        caches = [
            ChunkCache(m, directory=Path(tmp) / "cache", disk=d)
            for m, d in zip(memory, disk, strict=True)
        ]
        got: dict[tuple[int, int], np.ndarray] = {}

        def run(i: int) -> None:  # each thread its own cache over the one directory
            for epoch in range(3):
                got[(i, epoch)] = epoch_of(array, caches[i], epoch)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(got) == 6
        for (_, epoch), x in got.items():
            np.testing.assert_array_equal(x, expected[epoch])
        assert not list((Path(tmp) / "cache").glob(".*.tmp"))  # no partial file left


def test_a_second_process_sharing_the_directory_at_the_same_time(tmp_path: Path) -> None:
    make(tmp_path / "a.zarr")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    expected = [epoch_of(array, None, epoch) for epoch in range(4)]
    np.save(tmp_path / "expected.npy", np.stack(expected))
    directory = tmp_path / "cache"
    script = (
        "import sys, numpy as np, zarr, daskzarr_batches as dzb\n"
        "a = zarr.open_array(sys.argv[1], mode='r'); expected = np.load(sys.argv[3])\n"
        "c = dzb.ChunkCache(0, directory=sys.argv[2], disk=3 * 1200 + 600)\n"
        "for e in range(4):\n"
        "    s = dzb.shuffled_batch_stream(\n"
        "        a, 32, seed=3, epoch=e, shuffle_buffer_size=100, cache=c)\n"
        "    assert (np.concatenate(list(s)) == expected[e]).all(), e\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    other = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "a.zarr"), str(directory),
         str(tmp_path / "expected.npy")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    cache = ChunkCache(CHUNK, directory=directory, disk=5 * CHUNK)  # evicts the other's files
    for _ in range(3):
        for epoch in range(4):
            np.testing.assert_array_equal(epoch_of(array, cache, epoch), expected[epoch])
    out, err = other.communicate(timeout=120)
    assert other.returncode == 0, err
    assert out.split() == ["ok"]


def test_cache_files_deleted_mid_epoch_are_read_from_the_store(tmp_path: Path) -> None:
    data = make(tmp_path / "a.zarr")
    array, counting = counted(tmp_path / "a.zarr")
    directory = tmp_path / "cache"
    list(dzb.batch_stream(array, 25, cache=ChunkCache(0, directory=directory)))
    counting.counts.clear()
    stream = dzb.batch_stream(
        array, 25, window_bytes=CHUNK, cache=ChunkCache(0, directory=directory)
    )
    batches = [next(stream)]
    removed = sorted(directory.glob("*.chunk"))
    for path in removed:  # another rank clears the cache while this epoch runs
        path.unlink()
    batches += list(stream)
    np.testing.assert_array_equal(np.concatenate(batches), data)
    assert stream.stats.cache_misses > 0 and stream.stats.cache_damaged == 0
    assert stream.stats.cache_misses + stream.stats.cache_hits == 8
    assert sum(counting.counts.values()) == stream.stats.cache_misses  # refetched once each


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 64 KiB tmpfs (as root), which fills as a cache writes to it."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True
        ).returncode
        == 0
        if hasattr(os, "geteuid") and os.geteuid() == 0
        else False
    )
    if not mounted:
        pytest.skip("cannot mount a tmpfs (not root); the unwritable directory is tested above")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def test_a_disk_that_fills_warns_once_and_the_epochs_stay_right(
    tmp_path: Path, small_disk: Path
) -> None:
    data = make(tmp_path / "a.zarr", shape=(4000, 6), chunks=(500, 6))  # 12 KB chunks, 96 KB
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")
    cache = ChunkCache(0, directory=small_disk / "cache")  # no disk budget: until it is full
    with pytest.warns(dzb.CacheWarning, match="cannot write") as caught:
        first = dzb.batch_stream(array, 64, cache=cache)
        np.testing.assert_array_equal(np.concatenate(list(first)), data)
    assert len([w for w in caught if w.category is dzb.CacheWarning]) == 1
    held = len(list((small_disk / "cache").glob("*.chunk")))
    assert 0 < held < 8 and not list((small_disk / "cache").glob(".*.tmp"))
    second = dzb.batch_stream(array, 64, cache=cache)  # no second warning (filterwarnings=error)
    np.testing.assert_array_equal(np.concatenate(list(second)), data)
    assert (second.stats.cache_hits, second.stats.cache_misses) == (held, 8 - held)


# --------------------------------------------------------------------------
# On a cluster: every entry point keeps its decoded chunks as the cache's cluster futures


def _pass(entry: str, arrays: tuple[Any, Any], cache: Any, client: Any) -> tuple[Any, Any]:
    """One pass of ``entry`` over ``arrays``: what it gives, and its stream's stats (if any)."""
    a, b = arrays
    kw: dict[str, Any] = {"cache": cache, "client": client}
    if entry == "reduce_chunks":
        return dzb.reduce_chunks(lambda x: x.sum(axis=0), np.add, a, **kw), None
    if entry == "feature_moments":
        moments = dzb.feature_moments(a, **kw)
        return [moments.count, moments.mean, moments.m2], None
    stream = {
        "chunk_stream": lambda: dzb.chunk_stream(a, **kw),
        "chunk_stream-shards": lambda: dzb.chunk_stream(b, **kw),
        "map_chunks": lambda: dzb.map_chunks(lambda x: x.sum(axis=0), a, ordered=False, **kw),
        "patch_stream": lambda: dzb.patch_stream(
            a, {0: 10, 1: 3}, 8, shuffle=True, shuffle_buffer_size=64, **kw
        ),
        "patch_stream-split": lambda: dzb.patch_stream(
            dzb.chunk_split(a, [0.5, 0.5])[0], {0: 10, 1: 3}, 8, **kw
        ),
        "chunk_split": lambda: dzb.batch_stream(dzb.chunk_split(a, [0.5, 0.5])[1], 16, **kw),
        "chunk_split-chunks": lambda: dzb.chunk_stream(
            dzb.chunk_split(a, [0.5, 0.5], dim=1)[0], **kw
        ),
        "concat": lambda: dzb.shuffled_batch_stream(
            dzb.concat([a, b]), 16, seed=3, shuffle_buffer_size=100, **kw
        ),
        "concat-chunks": lambda: dzb.chunk_stream(dzb.concat([a, b]), **kw),
    }[entry]()
    with stream:
        if isinstance(stream, dzb.BatchStream) and client is not None and cache.cluster_chunks:
            plan = stream.summary()  # what the cache keeps on the cluster counts as held
            assert plan.chunks_cached == plan.chunks_read > 0
        got = list(stream)
    if entry == "map_chunks":  # as reads complete: compare in a fixed order
        got = sorted(got, key=lambda x: x.tobytes())
    return got, stream.stats


@pytest.mark.parametrize(
    "entry",
    [
        "chunk_stream", "chunk_stream-shards", "map_chunks", "reduce_chunks", "feature_moments",
        "patch_stream", "patch_stream-split", "chunk_split", "chunk_split-chunks", "concat",
        "concat-chunks",
    ],
)  # fmt: skip
def test_every_entry_point_keeps_its_chunks_on_the_cluster(
    client: Any, tmp_path: Path, entry: str
) -> None:
    """Pass 2 with the pass-1 cache reads no chunk from the store, and both equal the
    uncached local reference; the chunks live on the cluster as the cache's futures
    (``dzb-cached-*``, dask's memory and spilling), not in a per-worker copy."""
    from tests.scheduler_state import our_tasks
    from tests.stores import NamedCountingStore

    make(tmp_path / "a.zarr", chunks=(50, 3))  # two blocks per axis-0 chunk: cut from it
    make(tmp_path / "b.zarr", shape=(200, 6), chunks=(25, 3), shards=(50, 6))

    def opened(name: str) -> Any:
        local = zarr.storage.LocalStore(str(tmp_path / name), read_only=True)
        counting = NamedCountingStore(local, f"entry-{entry}-{name}-{tmp_path.name}")
        return zarr.open_array(store=counting, mode="r")

    arrays = (opened("a.zarr"), opened("b.zarr"))
    a, b = (array.store.counts for array in arrays)
    reference, _ = _pass(entry, arrays, None, None)
    needed = (set(a), set(b))  # the chunks an uncached pass reads
    cache = ChunkCache("64MiB")
    results = []
    for number in range(2):
        a.clear()
        b.clear()
        got, stats = _pass(entry, arrays, cache, client)
        results.append(got)
        if number == 0:  # those chunks once; a shard once per part kept (a batch window
            # keeps the rows of each axis-0 chunk: 2 of the shard, a chunk stream the shard)
            assert (set(a), set(b)) == needed and (a or b)
            assert set(a.values()) <= {1} and set(b.values()) <= {1 if "chunk" in entry else 2}
        else:
            assert not a and not b  # nothing fetched from the store
            if stats is not None:
                assert stats.cache_misses == 0 and stats.cache_hits > 0
    assert cache.cluster_chunks > 0
    assert all(key.startswith("dzb-cached-") for key in our_tasks(client, settle=0.5))
    for got in results:
        assert len(got) == len(reference)
        for x, y in zip(reference, got, strict=True):
            for p, q in zip(np.atleast_1d(x), np.atleast_1d(y), strict=True):
                np.testing.assert_array_equal(p, q)
    cache.clear()


@pytest.mark.parametrize("entry", ["chunk_stream", "patch_stream"])
def test_a_kept_chunk_that_does_not_decode_skips_what_it_skips_uncached(
    client: Any, tmp_path: Path, entry: str
) -> None:
    """One stored block of a kept axis-0 chunk does not decode: with ``on_error="skip"``
    only what touches that block is skipped, as without a cache (the kept chunk is
    skipped whole, so the block or window is read alone)."""
    make(tmp_path / "a.zarr", chunks=(50, 3))
    (tmp_path / "a.zarr" / "c" / "2" / "1").write_bytes(b"not zstd")
    array = zarr.open_array(str(tmp_path / "a.zarr"), mode="r")

    def run(cache: Any, client: Any) -> list[Any]:
        kw = {"cache": cache, "client": client, "on_error": "skip"}
        stream = (
            dzb.chunk_stream(array, **kw)
            if entry == "chunk_stream"
            else dzb.patch_stream(array, {0: 10, 1: 3}, 8, **kw)
        )
        with pytest.warns(dzb.SkippedChunksWarning), stream:
            return list(stream)

    reference = run(None, None)
    cache = ChunkCache("64MiB")
    for _ in range(2):
        got = run(cache, client)
        assert len(got) == len(reference)
        for x, y in zip(reference, got, strict=True):
            np.testing.assert_array_equal(x, y)
    cache.clear()
