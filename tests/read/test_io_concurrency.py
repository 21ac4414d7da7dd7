"""Latency hiding (``io_concurrency``) and chunk streams over sharded arrays.

Real wrapper stores: :class:`LatencyStore` records how many chunk gets were in
flight at once, :class:`CountingStore` how often each stored object was
fetched.
"""

from __future__ import annotations

import collections
import operator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import given
from hypothesis import strategies as st
from stores import CountingStore, FaultStore, LatencyStore, open_wrapped
from strategies import property_settings

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan
from daskzarr_batches.streams import StreamSpec

PROPERTY = property_settings(15)


def consume(stream: Any) -> list[Any]:
    with stream:
        return list(stream)


def slow_array(rows: int, chunk: int, delay: float) -> tuple[zarr.Array, LatencyStore]:
    store = zarr.storage.MemoryStore()
    x = zarr.create_array(store, shape=(rows, 3), chunks=(chunk, 3), dtype="f4")
    x[:] = np.arange(rows * 3, dtype="f4").reshape(rows, 3)
    slow = LatencyStore(store, delay=delay)
    return open_wrapped(slow), slow


@pytest.mark.parametrize("ordered", [True, False])
def test_chunk_stream_keeps_io_concurrency_requests_in_flight(ordered: bool) -> None:
    x, slow = slow_array(120, 10, delay=0.2)
    chunks = consume(dzb.chunk_stream(x, io_concurrency=6, ordered=ordered))
    assert slow.peak == 6  # at least io_concurrency in flight, and never more
    assert np.array_equal(np.sort(np.concatenate(chunks), axis=0), x[:])


def test_map_chunks_and_reduce_chunks_keep_the_requests_in_flight() -> None:
    x, slow = slow_array(100, 10, delay=0.2)
    want = float(np.sum(x[:]))
    slow.state["peak"] = 0
    assert dzb.reduce_chunks(np.sum, operator.add, x, io_concurrency=5) == want
    assert slow.peak == 5


def test_the_default_keeps_more_requests_in_flight_than_cpus() -> None:
    x, slow = slow_array(200, 10, delay=0.2)
    consume(dzb.chunk_stream(x))
    assert slow.peak == min(dzplan.DEFAULT_IO_CONCURRENCY, 20)


def test_concurrency_is_the_former_name_of_io_concurrency() -> None:
    x, slow = slow_array(60, 10, delay=0.2)
    consume(dzb.chunk_stream(x, concurrency=3))
    assert slow.peak == 3
    with pytest.raises(dzb.ArgumentValueError, match="concurrency=3 and io_concurrency=4"):
        dzb.chunk_stream(x, concurrency=3, io_concurrency=4)


def test_batch_streams_cap_their_store_requests_at_io_concurrency() -> None:
    x, slow = slow_array(400, 10, delay=0.05)
    slow.state["peak"] = 0
    batches = consume(dzb.shuffled_batch_stream(x, 32, seed=1, shuffle_buffer_size=100))
    assert slow.peak > 3  # a window's chunks are requested concurrently
    slow.state["peak"] = 0
    capped = consume(
        dzb.shuffled_batch_stream(x, 32, seed=1, shuffle_buffer_size=100, io_concurrency=3)
    )
    assert slow.peak == 3
    assert all(np.array_equal(a, b) for a, b in zip(batches, capped, strict=True))
    slow.state["peak"] = 0
    consume(dzb.batch_stream(x, 32, io_concurrency=2))
    assert slow.peak == 2
    assert dzb.Loader(x, 32, io_concurrency=2).spec.io_concurrency == 2


@pytest.mark.parametrize("bad", [0, -1])
def test_bad_io_concurrency_values_are_named(bad: int) -> None:
    x = np.zeros((10, 2))
    pattern = f"io_concurrency must be a positive integer, got {bad}"
    with pytest.raises(dzb.ArgumentValueError, match=pattern):
        dzb.chunk_stream(x, io_concurrency=bad)
    with pytest.raises(dzb.ArgumentValueError, match=pattern):
        dzb.map_chunks(np.sum, x, io_concurrency=bad)
    with pytest.raises(dzb.ArgumentValueError, match=pattern):
        dzb.batch_stream(x, 2, io_concurrency=bad)
    with pytest.raises(dzb.ArgumentValueError, match=pattern):
        dzb.Loader(x, 2, io_concurrency=bad)
    with pytest.raises(dzb.ArgumentValueError, match=pattern):
        StreamSpec((x,), 2, io_concurrency=bad)


@pytest.mark.parametrize("bad", [1.5, True, "4"])
def test_io_concurrency_of_the_wrong_type_is_named(bad: object) -> None:
    x = np.zeros((10, 2))
    with pytest.raises(dzb.ArgumentTypeError, match=f"io_concurrency must be .*got {bad!r}"):
        dzb.chunk_stream(x, io_concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentTypeError, match="io_concurrency must be"):
        dzb.feature_moments(x, io_concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(dzb.ArgumentTypeError, match="io_concurrency must be"):
        dzb.shuffled_batch_stream(x, 2, io_concurrency=bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Sharded arrays: inner chunks out, each shard read once


def sharded_pair(
    data: np.ndarray, chunks: tuple[int, ...], shards: tuple[int, ...]
) -> tuple[zarr.Array, zarr.Array, collections.Counter[str]]:
    """``data`` sharded behind a CountingStore, and an unsharded copy."""
    store = zarr.storage.MemoryStore()
    x = zarr.create_array(store, shape=data.shape, chunks=chunks, shards=shards, dtype=data.dtype)
    x[...] = data
    plain = zarr.create_array(
        zarr.storage.MemoryStore(), shape=data.shape, chunks=chunks, dtype=data.dtype
    )
    plain[...] = data
    counting = CountingStore(store)
    return open_wrapped(counting), plain, counting.counts


@st.composite
def sharded_cases(draw: st.DrawFn) -> tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]:
    ndim = draw(st.integers(1, 2))
    shape = tuple(draw(st.integers(1, 13)) for _ in range(ndim))
    chunks = tuple(draw(st.integers(1, 4)) for _ in range(ndim))
    shards = tuple(c * draw(st.integers(1, 3)) for c in chunks)
    data = np.arange(int(np.prod(shape)), dtype="i4").reshape(shape)
    return data, chunks, shards


@PROPERTY
@given(case=sharded_cases(), ordered=st.booleans(), io=st.integers(1, 4))
def test_sharded_chunk_stream_equals_the_unsharded_one(
    case: tuple[np.ndarray, tuple[int, ...], tuple[int, ...]], ordered: bool, io: int
) -> None:
    data, chunks, shards = case
    x, plain, counts = sharded_pair(data, chunks, shards)
    got = consume(dzb.chunk_stream(x, with_index=True, ordered=ordered, io_concurrency=io))
    want = consume(dzb.chunk_stream(plain, with_index=True))
    if not ordered:
        got.sort(key=lambda item: item[0])
    assert [block for block, _ in got] == [block for block, _ in want]  # C order of the grid
    for (_, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert set(counts.values()) == {1}  # each shard fetched once, with one get
    assert len(counts) == int(
        np.prod([-(-n // s) for n, s in zip(data.shape, shards, strict=True)])
    )


def test_map_chunks_reads_each_shard_once_and_names_a_failing_chunk() -> None:
    data = np.arange(96, dtype="f8").reshape(48, 2)
    x, plain, counts = sharded_pair(data, (4, 2), (16, 2))
    got = consume(dzb.map_chunks(np.sum, x, with_index=True))
    assert got == consume(dzb.map_chunks(np.sum, plain, with_index=True))
    assert dict(counts) == {"c/0/0": 1, "c/1/0": 1, "c/2/0": 1}
    assert dzb.feature_moments(x).mean.tolist() == dzb.feature_moments(plain).mean.tolist()

    def fails_on_chunk_5(chunk: np.ndarray) -> float:
        if chunk[0, 0] == 40:
            raise ZeroDivisionError("chunk 5")
        return float(chunk.sum())

    stream = dzb.map_chunks(fails_on_chunk_5, x)
    with pytest.raises(dzb.WindowError, match=r"on chunk \(5, 0\) of array") as info:
        consume(stream)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert stream.stats.items_yielded == 5  # the chunks before it were handed out


def test_a_sharded_chunk_stream_applies_the_read_policy(tmp_path: Path) -> None:
    data = np.arange(96, dtype="f4").reshape(48, 2) + 1
    x = zarr.create_array(
        tmp_path / "x.zarr", shape=(48, 2), chunks=(4, 2), shards=(16, 2), dtype="f4"
    )
    x[:] = data
    (tmp_path / "x.zarr" / "c" / "1" / "0").write_bytes(b"garbage" * 20)
    (tmp_path / "x.zarr" / "c" / "2" / "0").unlink()
    x = zarr.open_array(tmp_path / "x.zarr", mode="r")
    with pytest.raises(dzb.CorruptChunkError, match=r"chunk \(4, 0\) \(samples 16:20"):
        consume(dzb.chunk_stream(x))
    with pytest.warns(dzb.SkippedChunksWarning), pytest.warns(dzb.MissingChunksWarning):
        stream = dzb.chunk_stream(x, with_index=True, on_error="skip", ordered=False,
                                  missing="warn")  # fmt: skip
        got = dict(consume(stream))
    assert sorted(got) == [(i, 0) for i in (0, 1, 2, 3, 8, 9, 10, 11)]
    assert [s.chunk for s in stream.stats.skipped] == [(i, 0) for i in range(4, 8)]
    assert stream.stats.chunks_missing == 4 and stream.stats.chunks_read == 4
    assert np.array_equal(got[(1, 0)], data[4:8]) and np.all(got[(9, 0)] == 0)
    with (
        pytest.raises(dzb.MissingChunkError, match="'c/2/0'"),
        pytest.warns(dzb.SkippedChunksWarning),
    ):
        consume(dzb.chunk_stream(x, on_error="skip", missing="error"))


def test_a_sharded_chunk_stream_retries_a_shard_then_names_its_first_block() -> None:
    """Chunk streams read shards with the batch windows' shard reader and its fallback."""
    data = np.arange(96, dtype="f4").reshape(48, 2) + 1
    x, _, _ = sharded_pair(data, (4, 2), (16, 2))
    faults = FaultStore(x.store, {"c/1/0": [ConnectionResetError("reset")] * 2})
    stream = dzb.chunk_stream(open_wrapped(faults), with_index=True, retries=2)
    got = dict(consume(stream))
    assert np.array_equal(np.concatenate([got[(i, 0)] for i in range(12)]), data)
    assert faults.attempts["c/1/0"] == 3 and stream.stats.retries == 2  # one whole-shard get
    gone = FaultStore(x.store, {"c/1/0": [ConnectionResetError("reset")] * 9})
    with pytest.raises(
        dzb.ChunkReadError, match=r"chunk \(4, 0\) \(samples 16:20.*after 1 retries"
    ):
        consume(dzb.chunk_stream(open_wrapped(gone), retries=1))
    assert gone.attempts["c/1/0"] == 2  # retries spent: not read again block by block


def test_a_sharded_chunk_stream_on_a_cluster(client: Any, tmp_path: Path) -> None:
    data = np.arange(100, dtype="f8").reshape(50, 2)
    x = zarr.create_array(
        tmp_path / "x.zarr", shape=(50, 2), chunks=(4, 2), shards=(16, 2), dtype="f8"
    )
    x[:] = data
    for ordered in (True, False):
        stream = dzb.map_chunks(np.sum, x, client=client, ordered=ordered, with_index=True)
        got = dict(consume(stream))
        assert got == {(i, 0): float(data[4 * i : 4 * i + 4].sum()) for i in range(13)}
        blocks = consume(dzb.chunk_stream(x, client=client, ordered=ordered, with_index=True))
        assert sorted(b for b, _ in blocks) == [(i, 0) for i in range(13)]
        assert np.array_equal(np.concatenate([c for _, c in sorted(blocks)]), data)


def test_a_request_limit_travels_as_its_number_and_bounds_a_policy_store() -> None:
    import asyncio
    import pickle

    from daskzarr_batches.store.policy import Ledger, PolicyStore, ReadPolicy, RequestLimit

    policy = ReadPolicy().limited(2)
    assert policy == ReadPolicy() and isinstance(policy.requests, RequestLimit)
    copied = pickle.loads(pickle.dumps(policy))
    assert copied.requests is not None and copied.requests.n == 2
    assert copied.requests is not policy.requests  # rebuilt empty where it is unpickled
    x, slow = slow_array(40, 2, delay=0.02)
    store = PolicyStore(x.store, policy, Ledger(), "x")
    keys = [f"c/{i}/0" for i in range(20)]

    async def get_all() -> None:
        from zarr.core.buffer import default_buffer_prototype

        await asyncio.gather(*(store.get(k, default_buffer_prototype()) for k in keys))

    asyncio.run(get_all())
    assert slow.peak == 2


def test_a_cluster_honours_io_concurrency_in_each_read_task(client: Any) -> None:
    """Two single-threaded workers run two read tasks at once, each held to one request."""
    x, slow = slow_array(400, 10, delay=0.02)
    plain = consume(dzb.batch_stream(x, 32, client=client))
    assert slow.peak > 2  # a window requests its chunks concurrently
    slow.state["peak"] = 0
    capped = consume(dzb.batch_stream(x, 32, client=client, io_concurrency=1))
    assert 1 <= slow.peak <= 2
    assert all(np.array_equal(a, b) for a, b in zip(plain, capped, strict=True))
