"""The benchmark's store cases: the latency wrapper store and the sharded copy (issue 10)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zarr
import zarr.storage

from benchmarks.latency_store import LatencyStore
from benchmarks.suite import stores_cases
from benchmarks.suite.dataset import make_dataset, make_sharded


def test_latency_store_waits_before_each_request(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, 4 * 64, 4, 64)
    local = zarr.storage.LocalStore(ds.path, read_only=True)
    store = LatencyStore(local, 0.1, metadata=True)
    x = zarr.open_array(store=store, path="features", mode="r")
    opened = store.requests  # metadata reads wait too (zarr asks for several at once)
    store.state["peak"] = 0
    started = time.perf_counter()
    for lo in (0, 64):  # one request at a time: two delays
        x[lo : lo + 64]
    assert time.perf_counter() - started >= 0.2
    assert store.requests - opened == 2 and store.state["peak"] == 1
    np.testing.assert_array_equal(x[:], ds.features[:])  # zarr asks for the 4 chunks at once
    assert store.requests - opened == 6 and store.state["peak"] == 4
    assert store.state["now"] == 0


def test_sharded_copy_has_eight_chunks_per_shard_and_the_same_data(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, 10 * 64 + 5, 3, 64)  # a partial last shard and chunk
    sharded = make_sharded(ds)
    x = sharded.features
    assert x.shards == (8 * 64, 3) and x.chunks == (64, 3)
    np.testing.assert_array_equal(x[:], ds.features[:])
    np.testing.assert_array_equal(sharded.labels[:], ds.labels[:])
    assert make_sharded(ds).path == sharded.path  # made once
    # sharded inner-chunk reads through the latency store are byte-range requests, counted
    store = LatencyStore(zarr.storage.LocalStore(sharded.path, read_only=True), 0, metadata=True)
    opened = stores_cases.open_group("s", store, 64)
    before = store.requests
    np.testing.assert_array_equal(opened.x[64:128], ds.features[64:128])
    assert store.requests > before


def test_latency_store_leaves_metadata_alone_unless_asked(tmp_path: Path) -> None:
    """Chunk requests only by default (as the tests count them); per-key delays."""
    ds = make_dataset(tmp_path, 4 * 64, 4, 64)
    local = zarr.storage.LocalStore(ds.path, read_only=True)
    store = LatencyStore(local, 0.0, delays={"features/c/1/0": 0.2})
    x = zarr.open_array(store=store, path="features", mode="r")
    assert store.requests == 0  # the metadata read at open is not a request here
    started = time.perf_counter()
    x[0:64]
    assert time.perf_counter() - started < 0.15 and store.requests == 1
    x[64:128]
    assert time.perf_counter() - started >= 0.2 and store.requests == 2
