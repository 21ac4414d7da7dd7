"""Streams on real ``distributed`` clusters on loopback.

Two clusters, each started and stopped by a module fixture:

- an in-process ``LocalCluster`` (2 workers x 1 thread) for determinism,
  prefetch, default-client resolution, timeouts and clean-up;
- a ``LocalCluster`` of 2 process workers under nannies for the fault tests:
  a worker SIGKILLed mid-epoch (every batch still delivered once, identical to
  the local reference), and a cluster that gives up (``allowed_failures=0``):
  ``WindowError`` from ``next()`` naming the window, nothing left behind.

"Nothing left behind" is checked on the scheduler: no task whose key carries
the library's ``dzb-`` prefix survives the stream.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from scheduler_state import our_tasks
from zarr.testing.store import LatencyStore

import daskzarr_batches as dzb
from daskzarr_batches.execute.runners import ClientRunner, ThreadRunner

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(120)


# --------------------------------------------------------------------------
# Helpers


def make_zarr(
    path: Any, shape: tuple[int, ...], chunks: tuple[int, ...], latency: float = 0.0
) -> tuple[zarr.Array, np.ndarray]:
    data = np.random.default_rng(7).standard_normal(shape).astype("float32")
    store: Any = zarr.storage.LocalStore(str(path))
    zarr.create_array(store=store, shape=shape, chunks=chunks, dtype="float32")[:] = data
    if latency:
        store = LatencyStore(store, get_latency=latency, set_latency=0.0)
    return zarr.open_array(store=store, mode="r"), data


def local(stream_factory: Any) -> list[Any]:
    """Consume a stream on the local threaded scheduler (the reference)."""
    with dask.config.set(scheduler="threads"):
        stream = stream_factory()
    assert isinstance(stream._runner, ThreadRunner)
    with stream:
        return list(stream)


def assert_same_batches(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        if isinstance(b, tuple):
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(x, y, strict=True)
        else:
            np.testing.assert_array_equal(a, b, strict=True)


# --------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[zarr.Array, np.ndarray]:
    return make_zarr(tmp_path_factory.mktemp("data") / "x.zarr", (1000, 6), (64, 4))


# --------------------------------------------------------------------------
# Same bytes as the local path


@pytest.mark.parametrize("mode", ["sequential", "buffer", "exact", "paired", "chunks"])
def test_sharded_streams_identical_to_local(client: Any, tmp_path: Any, mode: str) -> None:
    """Sharded arrays on a cluster: shard-aware windows in plan order, shards per chunk task."""
    data = np.random.default_rng(3).standard_normal((500, 6)).astype("float32")
    array = zarr.create_array(
        zarr.storage.LocalStore(str(tmp_path / "s.zarr")), shape=data.shape, chunks=(20, 4),
        shards=(80, 8), dtype="float32",
    )  # fmt: skip
    array[:] = data
    labels = np.arange(500, dtype="int64")

    def stream(**kw: Any) -> Any:
        if mode == "sequential":
            return dzb.batch_stream(array, 37, window_bytes=6000, **kw)
        if mode == "buffer":
            return dzb.shuffled_batch_stream(array, 37, seed=5, shuffle_buffer_size=170, **kw)
        if mode == "exact":
            return dzb.shuffled_batch_stream(array, 37, seed=5, memory_budget=20_000, **kw)
        if mode == "paired":
            return dzb.paired_shuffled_batch_stream(
                array, labels, 37, seed=5, shuffle_buffer_size=170, **kw
            )
        return dzb.chunk_stream(array, **kw)

    expected = local(stream)
    with stream(client=client) as remote:
        got = list(remote)
    assert_same_batches(got, expected)
    if mode == "paired":  # row i of the features is the sample of label i
        for features, ids in got:
            np.testing.assert_array_equal(features, data[ids])


@pytest.mark.parametrize("kind", ["zarr", "numpy", "dask"])
def test_patch_streams_identical_to_local(client: Any, tmp_path: Any, kind: str) -> None:
    """Patches and forecast targets on a cluster: one read task per base array, plan order."""
    array, data = make_zarr(tmp_path / "f.zarr", (12, 10, 9), (3, 5, 4))
    source = {"zarr": array, "numpy": data, "dask": da.from_array(data, chunks=(4, 3, 9))}[kind]

    def stream(**kw: Any) -> Any:
        return dzb.patch_stream(
            source, {0: 2, 1: 4, 2: 3}, 7, input_overlap={1: 1}, target_offset={0: 1},
            shuffle=True, shuffle_buffer_size=40, return_origins=True, **kw,
        )  # fmt: skip

    expected = local(stream)
    with stream(client=client) as remote:
        got = list(remote)
    assert_same_batches(got, expected)
    for x, y, where in got:
        for patch, target, (t, a, b) in zip(x, y, where.tolist(), strict=True):
            np.testing.assert_array_equal(patch, data[t : t + 2, a : a + 4, b : b + 3])
            np.testing.assert_array_equal(target, data[t + 1 : t + 3, a : a + 4, b : b + 3])


@pytest.mark.parametrize("prefetch", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("buffer", [None, 300])
def test_shuffled_batches_identical_to_local(
    client: Any, dataset: Any, prefetch: int, buffer: int | None
) -> None:
    array, _ = dataset

    def stream(**kw: Any) -> dzb.BatchStream:
        return dzb.shuffled_batch_stream(
            array,
            96,
            seed=11,
            shuffle_buffer_size=buffer,
            memory_budget=20_000,
            prefetch=prefetch,
            **kw,
        )

    expected = local(stream)
    with stream(client=client) as remote:
        assert isinstance(remote._runner, ClientRunner)
        got = list(remote)
        # prefetch + 1 windows' worth of samples: the ramp's small windows count as a share
        small = sum(1 for w in remote.plan.windows() if w.size < remote.spec.window_rows)
        assert remote._runner.peak_in_flight <= prefetch + 1 + small
        assert remote.stats.windows_read == len(list(remote.plan.windows())) > 1
    assert_same_batches(got, expected)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_consumed_windows_leave_the_cluster(client: Any, dataset: Any, prefetch: int) -> None:
    array, _ = dataset

    def windows_held(dask_scheduler: Any) -> set[int]:  # a window's outputs, or its tuple
        return {
            int(key[1])
            for key in dask_scheduler.tasks
            if isinstance(key, tuple) and str(key[0]).startswith(("dzb-window-", "dzb-array-"))
        }

    stream = dzb.batch_stream(array, 64, window_bytes=64 * 24, prefetch=prefetch, client=client)
    for index, _ in enumerate(stream):  # one window per batch
        deadline = time.monotonic() + 5
        while True:
            held = client.run_on_scheduler(windows_held)
            if all(window > index for window in held) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert all(window > index for window in held), (index, held)  # consumed: released
        assert len(held) <= prefetch + 1


def test_paired_numpy_and_zarr_identical_to_local(client: Any, dataset: Any) -> None:
    array, data = dataset
    labels = np.arange(len(data))

    def stream(**kw: Any) -> dzb.BatchStream:
        return dzb.paired_shuffled_batch_stream(
            array, labels, 50, seed=3, shuffle_buffer_size=256, drop_remainder=True, **kw
        )

    expected = local(stream)
    got = list(stream(client=client))
    assert_same_batches(got, expected)
    for features, label in got:  # rows still belong together
        np.testing.assert_array_equal(features, data[label])


@pytest.mark.parametrize("buffer", [None, 300])
def test_paired_dask_and_zarr_identical_to_local(client: Any, dataset: Any, buffer: Any) -> None:
    """A dask array's pieces are joined in plan order on the worker, beside the Zarr rows."""
    array, data = dataset
    labels = da.from_array(np.arange(len(data)), chunks=77)

    def stream(**kw: Any) -> dzb.BatchStream:
        return dzb.paired_shuffled_batch_stream(
            array, labels, 64, seed=5, shuffle_buffer_size=buffer, memory_budget=9000, **kw
        )

    expected = local(stream)
    got = list(stream(client=client))
    assert_same_batches(got, expected)
    for features, label in got:
        np.testing.assert_array_equal(features, data[label])


def test_sequential_batches_identical_to_local(client: Any, dataset: Any) -> None:
    array, data = dataset
    got = list(dzb.batch_stream(array, 128, window_bytes=10_000, client=client))
    np.testing.assert_array_equal(np.concatenate(got), data)
    assert [len(b) for b in got] == [128] * 7 + [104]


@pytest.mark.parametrize("ordered", [True, False])
def test_chunk_stream_on_cluster(client: Any, dataset: Any, ordered: bool) -> None:
    array, data = dataset
    with dzb.chunk_stream(
        array, client=client, ordered=ordered, with_index=True, concurrency=3
    ) as stream:
        items = list(stream)
    blocks = [block for block, _ in items]
    expected = [(i, j) for i in range(16) for j in range(2)]
    assert (blocks == expected) if ordered else (sorted(blocks) == expected)
    for (i, j), chunk in items:
        np.testing.assert_array_equal(chunk, data[i * 64 : (i + 1) * 64, j * 4 : (j + 1) * 4])


# --------------------------------------------------------------------------
# Which scheduler runs a stream


def test_active_client_is_used_and_threads_config_forces_local(cluster: Any, dataset: Any) -> None:
    array, _ = dataset
    with dzb.batch_stream(array, 10) as stream:
        assert isinstance(stream._runner, ThreadRunner)  # no client yet
    with distributed.Client(cluster) as active:  # set_as_default=True
        with dzb.batch_stream(array, 10) as stream:
            assert isinstance(stream._runner, ClientRunner)
            assert stream._runner.client is active
        with dzb.chunk_stream(array) as stream:
            assert isinstance(stream._runner, ClientRunner)
        with dask.config.set(scheduler="threads"), dzb.batch_stream(array, 10) as stream:
            assert isinstance(stream._runner, ThreadRunner)
        with dask.config.set(scheduler="sync"), dzb.chunk_stream(array) as stream:
            assert isinstance(stream._runner, ThreadRunner)


def test_numpy_source_is_scattered_once_not_shipped_per_window(client: Any) -> None:
    # 16 MB would trip distributed's "Sending large graph" warning (an error
    # under filterwarnings=error) if the array were embedded in every window.
    data = np.arange(4_000_000, dtype="float32").reshape(250_000, 16)
    stream = dzb.batch_stream(data, 50_000, window_bytes=1_000_000, client=client)
    first = next(stream)
    held = client.run_on_scheduler(
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if "dzb-scattered" in str(k)]
    )
    assert len(held) == 1
    got = [first, *stream]
    np.testing.assert_array_equal(np.concatenate(got), data)


def test_streams_back_to_back_over_one_array_keep_their_scattered_copy(client: Any) -> None:
    # The first stream's release of its scattered copy is queued to the scheduler; a
    # second stream scattering under the same key had it forgotten mid-epoch (lost
    # dependencies, 59 of 60 runs).  Each stream scatters under a key of its own.
    # (a collection keeps its members' sources, so their tokens, from stream to stream)
    rows = np.arange(71 * 3).reshape(71, 3)
    data = dzb.concat([rows[:30], rows[30:]])
    for buffer in (None, 16, None):
        kwargs = {"seed": 4, "shuffle_buffer_size": buffer, "client": client}
        got = list(dzb.shuffled_batch_stream(data, 6, **kwargs))
        assert sorted(np.concatenate(got)[:, 0]) == list(rows[:, 0])


def test_memory_store_zarr_behind_a_wrapper_is_scattered_too(client: Any) -> None:
    data = np.random.default_rng(0).random((300, 5))
    inner = zarr.storage.MemoryStore()
    zarr.create_array(store=inner, shape=data.shape, chunks=(64, 5), dtype="float64")[:] = data
    array = zarr.open_array(store=LatencyStore(inner, get_latency=0, set_latency=0), mode="r")
    stream = dzb.batch_stream(array, 100, window_bytes=1, client=client)
    first = next(stream)
    held = client.run_on_scheduler(
        lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks if "dzb-scattered" in str(k)]
    )
    assert len(held) == 1
    np.testing.assert_array_equal(np.concatenate([first, *stream]), data)


# --------------------------------------------------------------------------
# Clean-up: nothing of ours stays on the scheduler


def test_break_releases_every_future(client: Any, dataset: Any) -> None:
    array, data = dataset
    gc.disable()  # prove reference counting alone finalises the stream
    try:
        for _ in dzb.shuffled_batch_stream(
            array, 10, seed=1, memory_budget=100_000, prefetch=3, client=client
        ):
            break
        for _ in dzb.batch_stream(data, 10, prefetch=2, client=client):  # numpy: scattered
            break
        assert our_tasks(client) == []
    finally:
        gc.enable()


def test_exception_in_consumer_releases_every_future(client: Any, dataset: Any) -> None:
    array, _ = dataset
    with pytest.raises(ZeroDivisionError):
        for _ in dzb.chunk_stream(array, client=client, concurrency=4):
            raise ZeroDivisionError
    assert our_tasks(client) == []
    with (
        pytest.raises(KeyError),
        dzb.shuffled_batch_stream(array, 10, seed=2, prefetch=4, client=client) as stream,
    ):
        next(stream)
        raise KeyError("consumer")
    assert our_tasks(client) == []


def test_close_and_garbage_collection_release_every_future(
    client: Any, dataset: Any, tmp_path: Any
) -> None:
    _, data = dataset
    # A window's future is released as soon as its result is fetched, and the exact
    # order's ramped windows are small: read instantly they can finish between two polls
    # of the scheduler.  Each read waits 50 ms here, and batches are taken until windows
    # are seen in flight, so close has futures to release.
    array, _ = make_zarr(tmp_path / "slow.zarr", (1000, 6), (64, 4), latency=0.05)
    stream = dzb.shuffled_batch_stream(
        array, 10, seed=1, memory_budget=20_000, prefetch=2, client=client
    )
    in_flight: list[str] = []
    for _ in stream:
        if in_flight := our_tasks(client, settle=0):
            break
    assert in_flight  # windows really are in flight
    stream.close()
    assert our_tasks(client) == []
    assert list(stream) == []

    stream = dzb.batch_stream(data, 10, prefetch=2, client=client)
    next(stream)
    del stream
    gc.collect()
    assert our_tasks(client) == []


# --------------------------------------------------------------------------
# Timeout


def test_timeout_names_the_batch_and_releases(client: Any, tmp_path: Any) -> None:
    slow, _ = make_zarr(tmp_path / "slow.zarr", (40, 3), (10, 3), latency=1.0)
    stream = dzb.batch_stream(slow, 8, window_bytes=1, prefetch=1, timeout=0.2, client=client)
    started = time.perf_counter()
    with pytest.raises(dzb.WindowTimeoutError, match=r"window 0 \(batches 0\.\.1,") as info:
        next(stream)
    assert time.perf_counter() - started < 0.9
    assert isinstance(info.value, TimeoutError)
    assert "timeout=0.2 s" in str(info.value)
    assert our_tasks(client) == []
    chunks = dzb.chunk_stream(slow, client=client, ordered=False, timeout=0.2)
    started = time.perf_counter()
    with pytest.raises(dzb.WindowTimeoutError, match=r"chunk \(0, 0\) .* timeout=0.2 s"):
        next(chunks)
    assert time.perf_counter() - started < 0.9


def test_cluster_without_workers_fails_the_window(tmp_path: Any) -> None:
    array, _ = make_zarr(tmp_path / "x.zarr", (40, 3), (10, 3))
    with (
        dask.config.set({"distributed.scheduler.no-workers-timeout": "300ms"}),
        distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty,
        distributed.Client(empty, set_as_default=False) as client,
    ):
        # the first window is one chunk (the fast-start ramp): batch 0 only
        with pytest.raises(dzb.WindowError, match=r"window 0 \(batches 0\.\.0,.*NoWorkerError"):
            next(dzb.batch_stream(array, 10, client=client))
        # a numpy source must first be scattered: that times out, naming the array
        with pytest.raises(dzb.WindowTimeoutError, match=r"could not send <numpy array"):
            next(dzb.batch_stream(np.zeros((40, 3)), 10, client=client, timeout=0.3))
        assert our_tasks(client) == []


def test_corrupt_chunk_raises_chunk_read_error_from_the_worker(client: Any, tmp_path: Any) -> None:
    array, _ = make_zarr(tmp_path / "x.zarr", (40, 3), (10, 3))
    (tmp_path / "x.zarr" / "c" / "2" / "0").write_bytes(b"not zstd")
    stream = dzb.batch_stream(array, 10, window_bytes=1, client=client)
    assert next(stream).shape == (10, 3)
    with pytest.raises(
        dzb.CorruptChunkError, match=r"axis-0 chunk 2 \(samples 20:30, key 'c/2/0'\)"
    ):
        list(stream)
    assert our_tasks(client) == []


# --------------------------------------------------------------------------
# A chunk cache on a cluster


def counted_array(tmp_path: Any, name: str) -> tuple[zarr.Array, np.ndarray, Any]:
    """A 1000 x 6 float32 array in 20 chunks behind a store counting its chunk reads."""
    from tests.stores import NamedCountingStore

    _, data = make_zarr(tmp_path / "c.zarr", (1000, 6), (50, 6))
    store = NamedCountingStore(
        zarr.storage.LocalStore(str(tmp_path / "c.zarr"), read_only=True),
        f"{name}-{tmp_path.name}",
    )
    return zarr.open_array(store=store, mode="r"), data, store


def test_exact_shuffle_with_a_cache_reads_each_chunk_once_then_never(
    client: Any, tmp_path: Any
) -> None:
    """A quarter-size budget reads the data ~4 times an epoch; with a cache holding the
    array, epoch 1 fetches each chunk from the store once and epoch 2 none.

    The decoded chunks are cluster futures the cache holds (``dzb-cached-*``), which the
    window tasks depend on; closing a stream keeps them, clearing the cache releases them.
    """
    array, data, store = counted_array(tmp_path, "cluster-cache")
    budget = data.nbytes // 4

    def stream(cache: Any = None, **kw: Any) -> Any:
        return dzb.shuffled_batch_stream(array, 32, seed=4, memory_budget=budget, cache=cache, **kw)

    plan = stream().summary()
    assert plan.read_amplification > 3  # without a cache: the data about 4 times an epoch
    expected = local(stream)
    store.counts.clear()
    cache = dzb.ChunkCache("64MiB")
    for epoch in range(2):
        with stream(cache, client=client) as remote:
            assert remote.summary().chunks_cached == (0 if epoch == 0 else plan.chunks_read)
            got = list(remote)
        assert_same_batches(got, expected)
        assert dict(store.counts) == ({key: 1 for key in store.counts} if epoch == 0 else {})
        if epoch == 0:
            assert len(store.counts) == 20  # every chunk, once
            assert remote.stats.cache_misses == 20
            assert remote.stats.cache_hits == plan.chunks_read - 20
        else:
            assert remote.stats.cache_misses == 0
            assert remote.stats.cache_hits == plan.chunks_read
        store.counts.clear()
        # the stream is closed: its windows are gone, the cache's chunks stay
        left = our_tasks(client, settle=0.5)
        assert len(left) == 20 and all(key.startswith("dzb-cached-") for key in left)
    assert cache.cluster_chunks == 20
    cache.clear()
    assert cache.cluster_chunks == 0
    assert our_tasks(client) == []


def test_buffered_shuffle_with_a_cache_reads_nothing_in_epoch_two(
    client: Any, tmp_path: Any
) -> None:
    array, _, store = counted_array(tmp_path, "cluster-buffer")

    def stream(epoch: int, cache: Any = None, **kw: Any) -> Any:
        return dzb.shuffled_batch_stream(
            array, 32, seed=4, epoch=epoch, shuffle_buffer_size=200, cache=cache, **kw
        )

    cache = dzb.ChunkCache("64MiB")
    for epoch in range(2):
        expected = local(lambda e=epoch: stream(e))
        store.counts.clear()
        with stream(epoch, cache, client=client) as remote:
            got = list(remote)
        assert_same_batches(got, expected)
        assert sum(store.counts.values()) == (20 if epoch == 0 else 0)
        assert remote.stats.cache_hits == (0 if epoch == 0 else 20)
    del remote
    cache_id = cache.id
    del cache  # dropped: its futures are released
    gc.collect()
    assert our_tasks(client) == []
    assert cache_id not in dzb.store.cache._REGISTRY


def test_cache_on_a_cluster_keeps_at_most_its_memory(client: Any, tmp_path: Any) -> None:
    """A budget of 5 chunks keeps 5 (least recently used released); batches still equal."""
    array, _, _ = counted_array(tmp_path, "cluster-small")
    chunk_bytes = 50 * 6 * 4

    def stream(**kw: Any) -> Any:
        return dzb.shuffled_batch_stream(array, 32, seed=1, shuffle_buffer_size=200, **kw)

    expected = local(stream)
    cache = dzb.ChunkCache(5 * chunk_bytes)
    with stream(cache=cache, client=client) as remote:
        got = list(remote)
    assert_same_batches(got, expected)
    assert cache.cluster_chunks == 5
    assert len(our_tasks(client, settle=0.5)) == 5
    cache.clear()


def test_cached_chunk_that_fails_is_read_again_next_epoch(client: Any, tmp_path: Any) -> None:
    """The chunk task applies the read policy; a failed one is not kept as the chunk."""
    array, data = make_zarr(tmp_path / "x.zarr", (40, 3), (10, 3))
    chunk = tmp_path / "x.zarr" / "c" / "2" / "0"
    good = chunk.read_bytes()
    chunk.write_bytes(b"not zstd")
    cache = dzb.ChunkCache("1MiB")
    stream = dzb.batch_stream(array, 10, window_bytes=1, client=client, cache=cache)
    with pytest.raises(dzb.CorruptChunkError, match=r"axis-0 chunk 2 \(samples 20:30"):
        list(stream)
    stream.close()
    chunk.write_bytes(good)
    with dzb.batch_stream(array, 10, window_bytes=1, client=client, cache=cache) as again:
        np.testing.assert_array_equal(np.concatenate(list(again)), data)
    cache.clear()


# --------------------------------------------------------------------------
# Process workers: a worker killed mid-epoch, and a cluster that gives up


@pytest.fixture(scope="module")
def process_client() -> Iterator[Any]:
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=":0",
            memory_limit="1GiB",
        ) as cluster,
        distributed.Client(cluster, set_as_default=False) as client,
    ):
        yield client


class WorkerKiller(threading.Thread):
    """SIGKILLs the first worker seen computing one of our tasks, once armed.

    Polling runs beside the consumer (which keeps windows in flight), so the
    kill lands while a ``dzb-`` task is really running, however fast windows
    are computed.
    """

    def __init__(self, client: Any) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.pids = client.run(os.getpid)  # address -> worker process id
        self.armed = threading.Event()
        self.killed = threading.Event()
        self.stopped = threading.Event()
        self.victim_tasks: list[str] = []

    def run(self) -> None:
        self.armed.wait(60)
        while not self.stopped.is_set():
            for address, keys in self.client.processing().items():
                ours = [str(key) for key in keys if "dzb-" in str(key)]
                if ours and address in self.pids:
                    os.kill(self.pids[address], signal.SIGKILL)
                    self.victim_tasks = ours
                    self.killed.set()
                    return
            time.sleep(0.002)

    def __enter__(self) -> WorkerKiller:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.armed.set()
        self.stopped.set()
        self.join(10)


def test_cache_on_process_workers_reads_each_chunk_once(process_client: Any, tmp_path: Any) -> None:
    """Process workers: epoch 2 of an exact shuffle at a quarter budget reads no chunk
    from the store on any worker (windows run where the cache's chunks live, or fetch
    them from the worker that does), and its batches equal the uncached local ones."""
    from tests.stores import named_counts

    array, data, store = counted_array(tmp_path, "process-cache")

    def stream(cache: Any = None, **kw: Any) -> Any:
        return dzb.shuffled_batch_stream(
            array, 32, seed=4, memory_budget=data.nbytes // 4, cache=cache, **kw
        )

    expected = local(stream)
    cache = dzb.ChunkCache("64MiB")
    reads = []
    for _ in range(2):
        before = process_client.run(named_counts, store.name)
        with stream(cache, client=process_client) as remote:
            assert_same_batches(list(remote), expected)
        after = process_client.run(named_counts, store.name)
        reads.append(sum(sum(after[w].values()) - sum(before[w].values()) for w in after))
    assert reads == [20, 0]
    assert remote.stats.cache_hits == remote.summary().chunks_read
    cache.clear()
    assert our_tasks(process_client) == []


def test_map_chunks_with_a_cache_on_process_workers_reads_each_chunk_once(
    process_client: Any, tmp_path: Any
) -> None:
    """Process workers: a second ``map_chunks`` pass with the same cache reads no chunk
    on any worker (its blocks are cut from the chunks the cache keeps on the cluster;
    before, each worker kept its own copy and a pass re-read what the other had read)."""
    from tests.stores import named_counts

    array, data, store = counted_array(tmp_path, "process-map-cache")
    cache = dzb.ChunkCache("64MiB")
    reads = []
    for _ in range(2):
        before = process_client.run(named_counts, store.name)
        sums = dzb.map_chunks(lambda x: x.sum(axis=0), array, cache=cache, client=process_client)
        with sums:
            np.testing.assert_allclose(np.sum(list(sums), axis=0), data.sum(axis=0), rtol=1e-5)
        after = process_client.run(named_counts, store.name)
        reads.append(sum(sum(after[w].values()) - sum(before[w].values()) for w in after))
    assert reads == [20, 0]
    assert sums.stats.cache_hits == 20
    cache.clear()
    assert our_tasks(process_client) == []


def test_killed_worker_mid_epoch_still_yields_every_batch_once(
    process_client: Any, tmp_path: Any
) -> None:
    array, data = make_zarr(tmp_path / "x.zarr", (3000, 8), (100, 8), latency=0.1)

    def stream(**kw: Any) -> dzb.BatchStream:
        return dzb.shuffled_batch_stream(
            array, 64, seed=5, shuffle_buffer_size=300, prefetch=2, **kw
        )

    expected = local(stream)
    got = []
    batches_after_kill = 0
    with WorkerKiller(process_client) as killer, stream(client=process_client) as remote:
        for i, batch in enumerate(remote):
            got.append(batch)
            batches_after_kill += killer.killed.is_set()
            if i == 5:
                killer.armed.set()
    assert killer.killed.is_set(), "the epoch ended before a worker could be killed"
    assert batches_after_kill > 0
    assert_same_batches(got, expected)
    seen = np.sort(np.concatenate([b[:, 0] for b in got]))
    np.testing.assert_array_equal(seen, np.sort(data[:, 0]))  # every sample exactly once
    assert our_tasks(process_client) == []
    process_client.wait_for_workers(2, timeout=30)  # the nanny restarts the killed worker


def test_map_to_zarr_survives_a_killed_worker(process_client: Any, tmp_path: Any) -> None:
    """A worker SIGKILLed while it computes an output chunk: the scheduler runs the task
    again elsewhere and the output is that of an undisturbed run."""
    data = np.arange(2000 * 4, dtype=np.float32).reshape(2000, 4)
    x = zarr.create_array(str(tmp_path / "x.zarr"), shape=data.shape, chunks=(100, 4),
                          dtype="f4")  # fmt: skip
    x[:] = data
    marker = str(tmp_path / "killed")

    def func(rows: np.ndarray) -> np.ndarray:
        if rows[0, 0] == 10 * 100 * 4:  # chunk 10: kill this worker, the first time only
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return rows * 2

    stats = dzb.WriteStats()
    y = dzb.map_to_zarr(func, x, str(tmp_path / "y.zarr"), dtype="f4", sample_shape=(4,),
                        client=process_client, stats=stats)  # fmt: skip
    assert os.path.exists(marker), "no worker was killed"
    np.testing.assert_array_equal(y[...], data * 2)
    assert stats.units_written == 20
    assert our_tasks(process_client) == []
    process_client.wait_for_workers(2, timeout=30)  # the nanny restarts the killed worker


def test_cluster_giving_up_raises_window_error_and_leaves_nothing(
    process_client: Any, tmp_path: Any
) -> None:
    array, _ = make_zarr(tmp_path / "x.zarr", (2000, 8), (100, 8), latency=0.2)

    def set_allowed_failures(n: int) -> Any:
        def setter(dask_scheduler: Any) -> int:
            previous = dask_scheduler.allowed_failures
            dask_scheduler.allowed_failures = n
            return int(previous)

        return process_client.run_on_scheduler(setter)

    process_client.wait_for_workers(2, timeout=30)
    previous = set_allowed_failures(0)  # the first lost task fails its window
    try:
        # 10 windows of 2 chunks, 3 in flight: a worker killed while computing
        # one of them makes the scheduler give up on that window.
        stream = dzb.batch_stream(array, 100, window_bytes=6_400, prefetch=2, client=process_client)
        with (
            WorkerKiller(process_client) as killer,
            pytest.raises(dzb.WindowError, match=r"window \d+ \(batches \d+\.\.\d+,") as info,
        ):
            killer.armed.set()
            for _ in stream:
                pass
        assert killer.killed.is_set()
        assert "KilledWorker" in str(info.value)
        assert our_tasks(process_client) == []
    finally:
        set_allowed_failures(previous)
        process_client.wait_for_workers(2, timeout=30)


def test_closed_client_is_a_window_error(cluster: Any, dataset: Any) -> None:
    array, _ = dataset
    client = distributed.Client(cluster, set_as_default=False)
    stream = dzb.batch_stream(array, 10, client=client)
    client.close()
    with pytest.raises(dzb.WindowError, match=r"window 0 \(batches 0\.\..*could not be submitted"):
        next(stream)


def test_client_must_be_a_client(dataset: Any) -> None:
    array, _ = dataset
    with pytest.raises(dzb.ArgumentTypeError, match=r"pass distributed.Client\('tcp://x:8786'\)"):
        dzb.batch_stream(array, 10, client="tcp://x:8786")
    with pytest.raises(dzb.ArgumentTypeError, match="got 3 of type int"):
        dzb.map_chunks(np.sum, array, client=3)
