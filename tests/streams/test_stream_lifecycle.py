"""How a stream behaves as a Python object: repr, one pass, threads, dtypes, failures."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
import zarr
import zarr.storage
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

import daskzarr_batches as dzb

X = np.arange(40, dtype="f4").reshape(10, 4)
Y = np.arange(10, dtype="i8")


def test_repr_shows_kind_arrays_batch_size_mode_position_and_state() -> None:
    stream = dzb.paired_shuffled_batch_stream(X, Y, 4, seed=0, shuffle_buffer_size=4)
    text = repr(stream)
    assert text.startswith("<BatchStream ") and "batch_size=4" in text
    assert "shuffle='buffer'" in text and "batch 0/3" in text and text.endswith("open>")
    assert text.count("numpy") == 2  # both arrays named
    next(stream)
    assert "batch 1/3" in repr(stream)
    stream.close()
    assert repr(stream).endswith("closed>")
    chunks = dzb.chunk_stream(X, ordered=False)
    assert repr(chunks).startswith("<ChunkStream ") and "chunk 0/1, unordered, open>" in repr(
        chunks
    )
    list(chunks)
    assert "chunk 1/1" in repr(chunks) and repr(chunks).endswith("closed>")


@pytest.mark.parametrize("shuffled", [False, True])
def test_an_exhausted_stream_stays_exhausted(shuffled: bool) -> None:
    stream = dzb.shuffled_batch_stream(X, 3, seed=0) if shuffled else dzb.batch_stream(X, 3)
    assert len(list(stream)) == 4
    assert list(stream) == [] and list(stream) == []
    with pytest.raises(StopIteration):
        next(stream)
    assert len(stream) == 4  # the epoch's batch count, as documented


@pytest.mark.parametrize("kind", ["batch", "chunk"])
def test_two_threads_share_a_stream_and_each_item_goes_to_one_of_them(kind: str) -> None:
    data = np.arange(4000, dtype="i8").reshape(2000, 2)
    stream: Any
    if kind == "batch":
        stream = dzb.shuffled_batch_stream(data, 7, seed=3, shuffle_buffer_size=300)
    else:
        stream = dzb.chunk_stream(dzb.open_array(_zarr(data, 50)), concurrency=3)
    got: list[list[np.ndarray]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def consume(mine: list[np.ndarray]) -> None:
        start.wait()
        try:
            for item in stream:
                mine.append(item)
        except BaseException as exc:  # pragma: no cover - the failure being tested
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(mine,)) for mine in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    rows = np.concatenate([*got[0], *got[1]])
    assert sorted(rows[:, 0].tolist()) == list(range(0, 4000, 2))  # every sample exactly once
    assert stream.stats.items_yielded == len(got[0]) + len(got[1])


def _zarr(data: np.ndarray, chunk_rows: int, zarr_format: int = 3) -> zarr.Array:
    z = zarr.create_array(
        zarr.storage.MemoryStore(),
        shape=data.shape,
        chunks=(chunk_rows, *data.shape[1:]),
        dtype=data.dtype,
        zarr_format=zarr_format,  # type: ignore[arg-type]
    )
    z[:] = data
    return z


PADDED = np.dtype(
    {"names": ["a", "b"], "formats": ["i1", ">f8"], "offsets": [0, 8], "itemsize": 24}
)


def _odd_inputs() -> list[tuple[str, Any, np.dtype]]:
    big = np.arange(230, dtype=">i4").reshape(115, 2)
    structured = np.zeros(115, dtype=PADDED)
    structured["a"], structured["b"] = np.arange(115) % 100, np.arange(115) / 2
    return [
        ("numpy >i4", big, big.dtype),
        ("numpy padded struct", structured, PADDED),
        ("zarr v2 >i4", _zarr(big, 10, 2), np.dtype(">i4")),
    ]


@pytest.mark.parametrize("case", _odd_inputs(), ids=lambda c: c[0])
@pytest.mark.parametrize("mode", ["sequential", "buffer", "exact", "paired"])
def test_every_batch_has_the_source_dtype(case: tuple[str, Any, np.dtype], mode: str) -> None:
    _, data, dtype = case
    row = dtype.itemsize * (2 if "i4" in case[0] else 1)
    streams = {  # windows of 16 rows and batches of 7: batches straddle windows, last one short
        "sequential": lambda: dzb.batch_stream(data, 7, window_bytes=16 * row),
        "buffer": lambda: dzb.shuffled_batch_stream(data, 7, seed=1, shuffle_buffer_size=16),
        "exact": lambda: dzb.shuffled_batch_stream(data, 7, seed=1, memory_budget=16 * row),
        "paired": lambda: dzb.paired_batch_stream(data, data, 7, window_bytes=32 * row),
    }
    with streams[mode]() as stream:
        batches = list(stream)
    parts = [part for batch in batches for part in (batch if mode == "paired" else (batch,))]
    assert {part.dtype for part in parts} == {dtype}, [part.dtype for part in parts]
    assert len(batches) == 17 and len(parts[-1]) == 115 - 16 * 7


class FirstReadSlowStore(zarr.storage.WrapperStore[Any]):
    """The first ``get`` of each chunk key sleeps; ``bad`` always fails fast.

    Counts the ``get`` calls in flight and those cancelled while sleeping.
    """

    def __init__(self, store: Any, bad: str, state: dict[str, Any] | None = None) -> None:
        super().__init__(store)
        self.bad = bad
        self.state = state if state is not None else {"now": 0, "cancelled": 0, "seen": set()}

    def _with_store(self, store: Any) -> FirstReadSlowStore:
        return type(self)(store, self.bad, self.state)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if key.endswith("zarr.json"):
            return await self._store.get(key, prototype, byte_range)
        if key == self.bad:
            await asyncio.sleep(0.05)
            raise OSError(f"injected failure reading {key}")
        first = key not in self.state["seen"]
        self.state["seen"].add(key)
        self.state["now"] += 1
        try:
            if first:
                await asyncio.sleep(3)
            return await self._store.get(key, prototype, byte_range)
        except asyncio.CancelledError:
            self.state["cancelled"] += 1
            raise
        finally:
            self.state["now"] -= 1


def test_a_failed_read_cancels_the_other_reads_of_its_window() -> None:
    data = np.arange(160, dtype="f8").reshape(80, 2)
    base = _zarr(data, 10).store
    store = FirstReadSlowStore(base, bad="c/0/0")  # read first, beside chunk 1
    array = zarr.open_array(store=store, mode="r")
    # an exact window of every sample in random order reads all chunks, several at once
    # (its budget lets 4 chunks be decoded at a time: one window, 4 * 160 bytes in flight)
    stream = dzb.shuffled_batch_stream(array, 8, seed=0, memory_budget=32 * 40 * 16)
    started = time.perf_counter()
    with pytest.raises(dzb.ChunkReadError, match=r"chunk 0\b"):
        list(stream)
    assert store.state["now"] == 0, "reads of the failed window were left running"
    assert store.state["cancelled"] > 0
    assert time.perf_counter() - started < 2.5  # nobody waited for the slow first reads


def test_unaligned_results_are_copied_to_aligned_memory() -> None:
    from daskzarr_batches.streams.base import _aligned

    raw = np.frombuffer(bytearray(4 * 12 + 1), dtype="f4", offset=1, count=12).reshape(6, 2)
    assert not raw.flags.aligned  # as a worker's result can arrive
    fixed = _aligned(raw)
    assert fixed.flags.aligned and fixed.dtype == raw.dtype
    np.testing.assert_array_equal(fixed, raw)
    aligned = np.zeros((6, 2), dtype="f4")
    assert _aligned(aligned) is aligned and _aligned("not an array") == "not an array"


def test_time_epoch_runs_one_epoch_from_before_the_stream_is_made() -> None:
    made: list[Any] = []

    def make() -> Any:
        time.sleep(0.05)  # start-up counts in the epoch's time
        made.append(dzb.batch_stream(X, 3))
        return made[-1]

    seen: list[int] = []
    seconds, stats = dzb.time_epoch(make, on_item=lambda item, s, t: seen.append(len(item)))
    assert seconds >= 0.05 and stats is made[0].stats and seen == [3, 3, 3, 1]
    assert stats.samples_yielded == len(X) and repr(made[0]).endswith("closed>")
    loader = dzb.Loader(X, 4)
    _, stats = dzb.time_epoch(lambda: loader)  # a Loader: one epoch of it
    assert stats.items_yielded == 3 and loader.epoch == 1
