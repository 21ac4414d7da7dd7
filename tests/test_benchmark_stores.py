"""The benchmark's store cases: the latency wrapper store and the sharded copy (issue 10)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import zarr
import zarr.storage

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed package: only ``benchmarks`` comes from here

from benchmarks.suite import stores_cases  # noqa: E402
from benchmarks.suite.dataset import make_dataset, make_sharded  # noqa: E402


def test_latency_store_waits_before_each_request(tmp_path: Path) -> None:
    ds = make_dataset(tmp_path, 4 * 64, 4, 64)
    store = stores_cases.LatencyStore(zarr.storage.LocalStore(ds.path, read_only=True), 0.1)
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
    store = stores_cases.LatencyStore(zarr.storage.LocalStore(sharded.path, read_only=True), 0)
    opened = stores_cases.open_group("s", store, 64)
    before = store.requests
    np.testing.assert_array_equal(opened.x[64:128], ds.features[64:128])
    assert store.requests > before
