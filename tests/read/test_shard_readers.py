"""Sharded and unsharded arrays read through the reader hook: chunk streams, per-chunk jobs,
batch windows, the cluster tier of the cache, the factory once per stream per process.

A counting wrapper (``reader=lambda array, default: Counting(default)``) must see
each stored chunk decoded once (a sharded array's inner chunks), while the shard
is still fetched with one request; nothing on an epoch served by a cache.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from stores import CountingStore, open_wrapped

import daskzarr_batches as dzb
from daskzarr_batches.readers import ChunkRequest
from daskzarr_batches.store.shards import reads_by_shard

ROWS, COLS, CHUNK, SHARD = 64, 6, 8, 32
#: every chunk of the grid: 8 axis-0 chunks by 2 along the columns
GRID = sorted(itertools.product(range(ROWS // CHUNK), range(2)))
DATA = np.arange(ROWS * COLS, dtype="f4").reshape(ROWS, COLS)

#: what the counting readers of this process saw, by the test's label (the in-process
#: cluster's workers count here too)
SEEN: dict[str, list[tuple[int, ...]]] = collections.defaultdict(list)
_LOCK = threading.Lock()


class Counting:
    """Counts the chunks asked of it, and lets ``inner`` read them."""

    def __init__(self, inner: Any, label: str) -> None:
        self.inner, self.label = inner, label

    def read(self, requests: list[ChunkRequest]) -> None:
        with _LOCK:
            SEEN[self.label].extend(r.chunk for r in requests)
        self.inner.read(requests)


def counting(label: str) -> Callable[[Any, Any], Counting]:
    SEEN.pop(label, None)
    return lambda array, default: Counting(default, label)


def stored(sharded: bool, store: Any = None) -> tuple[zarr.Array, CountingStore]:
    """``DATA`` in 8 x 3 chunks (in 32 x 6 shards if ``sharded``), read through a counter."""
    base = zarr.storage.MemoryStore() if store is None else store
    zarr.create_array(
        base, shape=DATA.shape, chunks=(CHUNK, 3), shards=(SHARD, COLS) if sharded else None,
        dtype="f4",
    )[:] = DATA  # fmt: skip
    counts = CountingStore(base)
    return open_wrapped(counts), counts


def on_disk(sharded: bool, path: Path) -> zarr.Array:
    """``DATA`` as :func:`stored` keeps it, in a local directory (for a cluster)."""
    stored(sharded, zarr.storage.LocalStore(path))
    return zarr.open_array(zarr.storage.LocalStore(path, read_only=True), mode="r")


def seen(label: str) -> list[tuple[int, ...]]:
    return sorted(SEEN[label])


def assert_one_request_per_object(counts: CountingStore, sharded: bool) -> None:
    assert set(counts.counts.values()) == {1}
    assert len(counts.counts) == (2 if sharded else len(GRID))


@pytest.fixture(params=[False, True], ids=["unsharded", "sharded"])
def sharded(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def test_the_one_shard_decision() -> None:
    plain, _ = stored(False)
    x, _ = stored(True)
    assert reads_by_shard(x, cached=False) and reads_by_shard(x, cached=True)
    assert not reads_by_shard(plain, cached=False)
    assert not reads_by_shard(DATA, cached=False)
    # zarrs reads its shards itself, but not through a cache (the policy view is Zarr's)
    native = zarr.open_array(x.store, mode="r")
    from daskzarr_batches.store.pipelines import codec_pipeline_of, with_codec_pipeline

    native = with_codec_pipeline(native, "zarrs")
    if codec_pipeline_of(native) == "zarrs":
        assert not reads_by_shard(native, cached=False)
        assert reads_by_shard(native, cached=True)


def test_chunk_stream_asks_each_inner_chunk_once(sharded: bool) -> None:
    x, counts = stored(sharded)
    with dzb.chunk_stream(x, with_index=True, reader=counting("chunks")) as stream:
        got = dict(stream)
    assert seen("chunks") == GRID
    assert_one_request_per_object(counts, sharded)
    for (row, col), block in got.items():
        np.testing.assert_array_equal(block, DATA[row * 8 : row * 8 + 8, col * 3 : col * 3 + 3])


def test_a_sharded_array_zarrs_reads_is_read_by_zarrs_in_chunk_streams_too(tmp_path: Path) -> None:
    pytest.importorskip("zarrs")
    from daskzarr_batches.store.pipelines import codec_pipeline_of, with_codec_pipeline

    x = with_codec_pipeline(on_disk(True, tmp_path / "x"), "zarrs")
    if codec_pipeline_of(x) != "zarrs":
        pytest.skip("zarrs does not read this array natively here")
    with dzb.chunk_stream(x, with_index=True, reader=counting("zarrs")) as stream:
        got = dict(stream)
    assert seen("zarrs") == GRID
    assert stream._units == [(block,) for block in GRID]  # a block per read, as windows read it
    for (row, col), block in got.items():
        np.testing.assert_array_equal(block, DATA[row * 8 : row * 8 + 8, col * 3 : col * 3 + 3])


@pytest.mark.parametrize("job", ["map_chunks", "reduce_chunks", "feature_moments"])
def test_per_chunk_jobs_ask_each_inner_chunk_once(sharded: bool, job: str) -> None:
    x, counts = stored(sharded)
    reader = counting(job)
    if job == "map_chunks":
        with dzb.map_chunks(np.sum, x, reader=reader) as stream:
            total = sum(stream)
    elif job == "reduce_chunks":
        total = dzb.reduce_chunks(np.sum, np.add, x, reader=reader)
    else:
        total = dzb.feature_moments(x, reader=reader).mean.sum() * ROWS
    assert total == pytest.approx(DATA.sum(), rel=1e-6)
    assert seen(job) == GRID
    assert_one_request_per_object(counts, sharded)


def test_map_to_zarr_reads_each_inner_chunk_once(sharded: bool, tmp_path: Path) -> None:
    x, counts = stored(sharded)
    out = dzb.map_to_zarr(
        lambda rows: rows * 2, x, str(tmp_path / "out"), dtype="f4", sample_shape=(COLS,),
        reader=counting("writes"),
    )  # fmt: skip
    np.testing.assert_array_equal(out[:], DATA * 2)
    assert seen("writes") == GRID
    if not sharded:
        assert_one_request_per_object(counts, sharded)
    else:  # a write unit is one output chunk (8 rows): each reads its index and 2 ranges
        assert set(counts.counts.values()) == {3 * SHARD // CHUNK}


@pytest.mark.parametrize("kind", ["sequential", "buffered", "exact"])
def test_batch_windows_ask_each_inner_chunk_once(sharded: bool, kind: str) -> None:
    x, counts = stored(sharded)
    reader = counting(kind)
    if kind == "sequential":
        stream = dzb.batch_stream(x, 16, reader=reader)
    elif kind == "buffered":
        stream = dzb.shuffled_batch_stream(x, 16, seed=0, shuffle_buffer_size=SHARD, reader=reader)
    else:
        stream = dzb.shuffled_batch_stream(x, 16, seed=0, reader=reader)
    with stream:
        rows = np.concatenate(list(stream))
    np.testing.assert_array_equal(np.sort(rows[:, 0]), DATA[:, 0])
    assert seen(kind) == GRID
    assert_one_request_per_object(counts, sharded)


class Filling:
    """A reader of its own: reads every request through Zarr itself, the library's asked nothing."""

    def __init__(self, array: Any, default: Any) -> None:
        self.array = array

    def read(self, requests: list[ChunkRequest]) -> None:
        for request in requests:
            request.fill(self.array[request.region])


class Failing:
    """A reader that fails every read."""

    def __init__(self, array: Any, default: Any) -> None:
        pass

    def read(self, requests: list[ChunkRequest]) -> None:
        raise OSError("this reader cannot read")


def test_a_shard_read_by_a_reader_of_its_own() -> None:
    x, counts = stored(True)
    with dzb.chunk_stream(x, with_index=True, reader=Filling) as stream:
        got = dict(stream)
    assert sorted(got) == GRID
    for (row, col), block in got.items():
        np.testing.assert_array_equal(block, DATA[row * 8 : row * 8 + 8, col * 3 : col * 3 + 3])
    assert counts.counts  # read by Zarr, through the reader's own reads


def test_a_failing_reader_of_a_shard_is_named() -> None:
    x, _ = stored(True)
    with (
        pytest.raises(
            dzb.ChunkReadError, match=r"reader .* of array .* failed reading chunks \(0, 0\)"
        ),
        dzb.chunk_stream(x, reader=Failing) as stream,
    ):
        list(stream)


def test_a_cache_serves_epoch_two_of_a_sharded_chunk_stream_asking_nothing() -> None:
    x, counts = stored(True)
    cache = dzb.ChunkCache("1MiB")
    for label in ("first", "second"):
        with dzb.chunk_stream(x, cache=cache, reader=counting(label)) as stream:
            values = np.concatenate([b.ravel() for b in stream])
        np.testing.assert_array_equal(np.sort(values), DATA.ravel())
    assert seen("first") == GRID
    assert seen("second") == []
    assert_one_request_per_object(counts, True)


def test_a_shard_the_cache_holds_in_part_reads_only_the_rest_in_one_request() -> None:
    x, counts = stored(True)
    cache = dzb.ChunkCache("1MiB")
    half = dzb.chunk_split(x, [0.5, 0.5], seed=0)[0]  # every inner chunk of half the rows
    with dzb.batch_stream(half, 8, cache=cache, reader=counting("half")) as stream:
        list(stream)
    counts.counts.clear()
    with dzb.chunk_stream(x, with_index=True, cache=cache, reader=counting("rest")) as stream:
        got = dict(stream)
    for (row, col), block in got.items():
        np.testing.assert_array_equal(block, DATA[row * 8 : row * 8 + 8, col * 3 : col * 3 + 3])
    assert seen("half") and seen("rest")
    assert sorted(seen("half") + seen("rest")) == GRID  # each inner chunk decoded once
    assert set(counts.counts.values()) == {1}  # each shard still fetched once, whole
    assert stream.stats.cache_hits == len(seen("half"))


# --------------------------------------------------------------------------
# The cluster tier: kept futures read through the reader, windows cut from them ask nothing


def epochs(kind: str, x: Any, client: Any, cache: Any, label: str) -> np.ndarray:
    reader = counting(label)
    if kind == "chunks":
        stream: Any = dzb.chunk_stream(x, client=client, cache=cache, reader=reader)
        with stream:
            return np.sort(np.concatenate([b.ravel() for b in stream]))
    stream = dzb.shuffled_batch_stream(
        x, 16, seed=0, shuffle_buffer_size=SHARD, client=client, cache=cache, reader=reader
    )
    with stream:
        return np.sort(np.concatenate(list(stream)).ravel())


@pytest.mark.parametrize("kind", ["chunks", "windows"])
def test_on_a_cluster_a_kept_chunk_is_read_once_and_epoch_two_asks_nothing(
    client: Any, sharded: bool, kind: str, tmp_path: Path
) -> None:
    x = on_disk(sharded, tmp_path / "x")
    cache = dzb.ChunkCache("1MiB")
    try:
        for label in ("first", "second"):
            np.testing.assert_array_equal(
                epochs(kind, x, client, cache, label), np.sort(DATA.ravel())
            )
        assert seen("first") == GRID  # each kept part's task asked for its chunks once
        assert seen("second") == []
    finally:
        cache.clear()


# --------------------------------------------------------------------------
# The factory: once per array per stream in each worker process


class Logged:
    """A factory that appends ``pid stream array`` to a file each time it is called."""

    def __init__(self, path: Path, stream: str) -> None:
        self.path, self.stream = path, stream

    def __call__(self, array: Any, default: Any) -> Any:
        with open(self.path, "a") as log:
            log.write(f"{os.getpid()} {self.stream} {array.store_path}\n")
        return default


@pytest.fixture(scope="module")
def process_client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=2, processes=True, host="127.0.0.1",
            dashboard_address=":0", memory_limit="1GiB",
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):  # fmt: skip
        yield client


def test_the_factory_is_called_once_per_array_per_stream_in_each_worker_process(
    process_client: Any, tmp_path: Path
) -> None:
    x, y = on_disk(True, tmp_path / "x"), on_disk(False, tmp_path / "y")
    log = tmp_path / "factory.log"
    for stream in ("a", "b"):
        with dzb.chunk_stream(x, client=process_client, reader=Logged(log, stream)) as chunks:
            assert len(list(chunks)) == len(GRID)
        paired = dzb.paired_batch_stream(
            x, y, 8, client=process_client, reader=Logged(log, "p" + stream)
        )
        with paired:
            assert sum(len(b) for b, _ in paired) == ROWS
    calls = collections.Counter(log.read_text().splitlines())
    workers = set(process_client.run(os.getpid).values())
    assert {line.split()[0] for line in calls} <= {str(pid) for pid in workers}
    assert set(calls.values()) == {1}  # once per (process, stream, array)
    streams = {line.split()[1] for line in calls}
    assert streams == {"a", "b", "pa", "pb"}
