"""How windows travel from a cluster's workers to the consumer (issue 40).

Each window is fetched straight from the worker(s) that made it, never
through the scheduler (on a cluster whose workers this host reaches), its
outputs fetched as they are (no task packing them into one), serialised
with their rows out of band; a sequential or buffered stream keeps two
windows per worker thread in flight unless ``prefetch`` is given.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.execute.runners import ClientRunner, direct_fetch, packed_keys
from daskzarr_batches.plan.defaults import DEFAULT_IO_BYTES, DEFAULT_PREFETCH
from daskzarr_batches.store.policy import ReadReport

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def arrays(tmp_path_factory: pytest.TempPathFactory) -> tuple[zarr.Array, zarr.Array]:
    data = np.random.default_rng(3).standard_normal((600, 5)).astype("float32")
    root = tmp_path_factory.mktemp("delivery")
    x = zarr.create_array(store=str(root / "x.zarr"), shape=data.shape, chunks=(50, 5),
                          dtype="float32")  # fmt: skip
    x[:] = data
    y = zarr.create_array(store=str(root / "y.zarr"), shape=(600,), chunks=(50,), dtype="int64")
    y[:] = np.arange(600)
    return zarr.open_array(str(root / "x.zarr"), mode="r"), zarr.open_array(
        str(root / "y.zarr"), mode="r"
    )


def gathers(client: Any) -> int:
    """How many gathers the scheduler has made for its clients so far."""

    def count(dask_scheduler: Any) -> int:
        return sum(
            1 for _, msg in dask_scheduler.get_events("all")
            if isinstance(msg, dict) and msg.get("action") == "gather"
        )  # fmt: skip

    return int(client.run_on_scheduler(count))


def keys_seen(client: Any) -> Any:
    """A scheduler plugin recording every key a graph sent to it; ``.keys`` reads them."""

    class Seen(distributed.diagnostics.plugin.SchedulerPlugin):
        name = "dzb-test-keys-seen"

        def __init__(self) -> None:
            self.keys: list[str] = []

        def update_graph(self, scheduler: Any, *, keys: Any = (), tasks: Any = (),
                         **kwargs: Any) -> None:  # fmt: skip
            self.keys += [str(key) for key in (tasks or keys)]

    client.register_plugin(Seen())

    def read(dask_scheduler: Any) -> list[str]:
        return list(dask_scheduler.plugins["dzb-test-keys-seen"].keys)

    return lambda: client.run_on_scheduler(read)


def test_windows_come_straight_from_the_workers(client: Any, arrays: Any) -> None:
    """Failed before: every window went through the scheduler (``future.result()``)."""
    x, y = arrays
    assert direct_fetch(client)  # a LocalCluster's workers are this host's
    before = gathers(client)
    with dzb.paired_batch_stream(x, y, 64, window_bytes=4096, client=client) as stream:
        batches = list(stream)
    assert gathers(client) == before
    np.testing.assert_array_equal(np.concatenate([b for _, b in batches]), np.arange(600))


def test_direct_to_workers_false_is_honoured(cluster: Any, arrays: Any) -> None:
    x, _ = arrays
    with distributed.Client(cluster, set_as_default=False, direct_to_workers=False) as client:
        assert not direct_fetch(client)
        before = gathers(client)
        with dzb.batch_stream(x, 64, window_bytes=4096, client=client) as stream:
            got = np.concatenate(list(stream))
        assert gathers(client) > before  # through the scheduler, as the client asked
        np.testing.assert_array_equal(got, x[:])


def test_no_task_packs_a_windows_outputs(client: Any, arrays: Any) -> None:
    """Failed before: each window's ``(tuple, outputs)`` task ran on a worker."""
    x, y = arrays
    seen = keys_seen(client)
    with dzb.paired_shuffled_batch_stream(
        x, y, 32, seed=1, shuffle_buffer_size=200, client=client
    ) as stream:
        labels = np.concatenate([b for _, b in stream])
    keys = seen()
    assert any("dzb-array-" in key for key in keys)
    assert not [key for key in keys if "dzb-window-" in key]
    assert sorted(labels) == list(range(600))


def test_packed_keys_only_for_a_pure_tuple_task() -> None:
    dsk = {"a": 1, "b": 2, "w": (tuple, ["a", "b"])}
    assert packed_keys(dsk, "w") == ["a", "b"]
    assert packed_keys(dsk, "a") is None
    assert packed_keys({"a": 1, "w": (tuple, ["a", "z"])}, "w") is None  # z not in the graph
    assert packed_keys({"a": 1, "w": (list, ["a"])}, "w") is None


def test_a_packed_graph_gives_the_same_tuple(client: Any) -> None:
    runner = ClientRunner(client, in_flight=2)
    try:
        one, two = runner.submit_many(
            [({"a": (np.arange, 3), "w": (tuple, ["a"])}, "w"), ({"b": (np.ones, 2)}, "b")], 0
        )
        first = one.result(30)
        assert type(first) is tuple and len(first) == 1
        np.testing.assert_array_equal(first[0], np.arange(3))
        np.testing.assert_array_equal(two.result(30), np.ones(2))
    finally:
        runner.close()


def test_window_results_serialise_their_rows_out_of_band(arrays: Any) -> None:
    """A window's rows travel as their own frame, the array's memory, not inside a pickle."""
    from distributed.protocol import serialize, to_serialize

    x, _ = arrays
    rows = np.ascontiguousarray(x[:200])
    _, frames = serialize(to_serialize(((rows, ReadReport(missing_keys=("k",))),)))
    big = [frame for frame in frames if memoryview(frame).nbytes >= rows.nbytes]
    assert len(big) == 1
    assert np.shares_memory(np.frombuffer(big[0], dtype=rows.dtype), rows)  # no copy
    assert sum(memoryview(f).nbytes for f in frames) < rows.nbytes + 4096


def test_prefetch_on_a_cluster_keeps_two_windows_per_worker_thread(
    client: Any, arrays: Any
) -> None:
    """Failed before: ``DEFAULT_PREFETCH`` (3 windows in flight) whatever the threads."""
    x, _ = arrays
    threads = sum(client.nthreads().values())
    assert threads == 2
    assert dzb.batch_stream(x, 64, client=client).spec.prefetch == 2 * threads
    buffered = dzb.shuffled_batch_stream(x, 64, seed=0, shuffle_buffer_size=100, client=client)
    assert buffered.spec.prefetch == 2 * threads
    # windows that would pass DEFAULT_IO_BYTES together: the local default
    rows = DEFAULT_IO_BYTES // (5 * 4) // 2
    big = dzb.shuffled_batch_stream(x, 64, seed=0, shuffle_buffer_size=rows, client=client)
    assert big.spec.prefetch == DEFAULT_PREFETCH
    assert dzb.batch_stream(x, 64, prefetch=0, client=client).spec.prefetch == 0  # given
    assert dzb.shuffled_batch_stream(x, 64, seed=0, client=client).spec.prefetch == 0  # exact
    assert dzb.batch_stream(x, 64).spec.prefetch == DEFAULT_PREFETCH  # locally
    for stream in (buffered, big):
        stream.close()
