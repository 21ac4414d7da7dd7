"""The decoded-chunk cache: later epochs from memory or disk, never a wrong chunk."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage

import daskzarr_batches as dzb
from daskzarr_batches.store.cache import ChunkCache
from tests.stores import CountingStore, open_wrapped


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
