"""Plan inspection: what an epoch reads and yields, known before reading."""

from __future__ import annotations

import collections
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr
import zarr.storage
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

import daskzarr_batches as dzb
import daskzarr_batches.plan as dzplan
from daskzarr_batches.plan.epoch import EpochPlan
from daskzarr_batches.plan.summary import PlanSummary
from daskzarr_batches.plan.windows import chunk_offsets, sorting_order

METADATA = (".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json")


class ChunkGetCounter(zarr.storage.WrapperStore[Any]):
    """Counts chunk ``get`` calls (metadata documents are not counted)."""

    def __init__(self, store: Any, counts: collections.Counter[str] | None = None) -> None:
        super().__init__(store)
        self.counts: collections.Counter[str] = collections.Counter() if counts is None else counts

    def _with_store(self, store: Any) -> ChunkGetCounter:
        return type(self)(store, self.counts)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if not key.rsplit("/", 1)[-1].endswith(METADATA):
            self.counts[key] += 1
        return await self._store.get(key, prototype, byte_range)


def counted_array(data: np.ndarray, chunk_rows: int) -> tuple[zarr.Array, ChunkGetCounter]:
    memory = zarr.storage.MemoryStore()
    array = zarr.create_array(
        store=memory, shape=data.shape, chunks=(chunk_rows, *data.shape[1:]), dtype=data.dtype
    )
    array[:] = data
    store = ChunkGetCounter(memory)
    return zarr.open_array(store, mode="r"), store


@pytest.fixture
def features() -> np.ndarray:
    return np.arange(1000 * 3, dtype="f4").reshape(1000, 3)


def test_sequential_plan_totals(features: np.ndarray) -> None:
    x, _ = counted_array(features, 64)
    plan = dzb.plan_epoch(x, 100, window_bytes=200 * 12)
    assert plan.shuffle == "none"
    assert plan.n_samples == 1000 and plan.n_batches == 10
    assert plan.read_amplification == pytest.approx(1.0)
    assert plan.chunks_read == 16  # ceil(1000 / 64), each once
    assert sum(w.samples for w in plan.windows) == 1000
    assert sum(w.batches for w in plan.windows) == 10
    assert plan.peak_window_bytes <= 200 * 12
    assert plan.bytes_yielded == plan.dataset_bytes == 1000 * 12
    assert plan.n_tasks == 2 * plan.n_windows  # one read task + the window tuple


def test_summary_reads_nothing_and_matches_the_epoch(features: np.ndarray) -> None:
    x, store = counted_array(features, 64)
    stream = dzb.shuffled_batch_stream(x, 30, seed=4, memory_budget=1000 * 12 // 2, prefetch=1)
    summary = stream.summary()
    assert summary == dzb.plan_epoch(
        x, 30, shuffle=True, seed=4, memory_budget=1000 * 12 // 2, prefetch=1
    )
    assert sum(store.counts.values()) == 0
    batches = list(stream)
    assert len(batches) == summary.n_batches
    assert stream.stats.windows_read == summary.n_windows
    assert stream.stats.chunks_read == summary.chunks_read
    assert stream.stats.bytes_read == summary.bytes_decoded
    assert stream.stats.read_amplification == pytest.approx(summary.read_amplification)
    # every chunk is fetched once per window that reads it
    assert sum(store.counts.values()) == summary.chunks_read


def test_buffered_plan_reads_each_chunk_once(features: np.ndarray) -> None:
    labels = np.arange(1000)
    plan = dzb.plan_epoch(
        da.from_array(features, chunks=(50, 3)),
        32,
        labels=da.from_array(labels, chunks=(100,)),
        shuffle=True,
        seed=1,
        shuffle_buffer_size=200,
    )
    assert plan.read_amplification == pytest.approx(1.0)
    feature_chunks = [c for w in plan.windows for c in w.chunks[0]]
    label_chunks = [c for w in plan.windows for c in w.chunks[1]]
    assert sorted(feature_chunks) == list(range(20))
    assert sorted(label_chunks) == list(range(10))
    assert all(w.bytes_held == w.samples * (12 + 8) for w in plan.windows)
    assert plan.n_tasks is not None and plan.n_tasks > plan.n_windows


def test_plan_summary_prints_a_table(features: np.ndarray) -> None:
    text = str(dzb.plan_epoch(features, 100, shuffle=True, seed=0, memory_budget=3000))
    assert "read amplification" in text and "window" in text
    rows = dzb.plan_epoch(features, 100).rows()
    assert {"window", "samples", "batches", "chunks_read", "bytes_decoded"} <= set(rows[0])
    totals = dzb.plan_epoch(features, 100).totals()
    assert totals["read_amplification"] == 1.0 and totals["batches"] == 10


def test_plan_without_row_bytes_counts_no_bytes() -> None:
    plan = dzplan.EpochPlan(
        n_samples=10,
        offsets=(np.array([0, 5, 10]),),
        batch_size=3,
        drop_remainder=False,
        shuffle="none",
        window_rows=5,
    )
    summary = plan.summary()
    assert summary.bytes_decoded == 0 and summary.n_tasks is None
    assert [w.batches for w in summary.windows] == [1, 3]  # 3+3 | 3+1 (short last)


def test_shuffle_arguments_need_shuffle_true(features: np.ndarray) -> None:
    with pytest.raises(dzb.ArgumentValueError, match="shuffle_buffer_size=100 needs shuffle=True"):
        dzb.plan_epoch(features, 10, shuffle_buffer_size=100)


@given(st.lists(st.integers(0, 2**40), unique=True, max_size=300), st.integers(0, 2**20))
@settings(max_examples=200, deadline=None)
def test_sorting_order_is_a_stable_argsort(ids: list[int], shift: int) -> None:
    samples = np.asarray(ids, dtype=np.int64) // (1 + shift % 7) + shift
    samples = np.unique(samples)
    np.random.default_rng(shift).shuffle(samples)
    assert np.array_equal(sorting_order(samples), np.argsort(samples, kind="stable"))


# --------------------------------------------------------------------------
# Summaries in O(units) / O(windows x chunks) (issue 39) agree with drawing every row

GENERATE = (Phase.explicit, Phase.generate)  # no shrinking: a failure prints its case


@given(
    n=st.integers(40_000, 80_000),
    chunk=st.integers(50, 2_000),
    buffer=st.integers(1_000, 8_000),  # windows of many batches: a batch straddling two
    seed=st.integers(0, 2**32),  # is counted in the first by expected_mixing
)
@settings(max_examples=10, deadline=None, derandomize=True, phases=GENERATE)
def test_a_buffered_summary_without_rows_is_the_summary_with_them(
    n: int, chunk: int, buffer: int, seed: int
) -> None:
    from daskzarr_batches.plan import epoch_figures

    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    offsets = (chunk_offsets(sizes), chunk_offsets([n // 3, n - n // 3]))
    plan = EpochPlan(n, offsets, 32, False, "buffer", buffer, seed, 1, row_bytes=(16, 8))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(epoch_figures, "BUFFERED_ROWS_DRAWN", 0)  # from 2**20 samples
        fast = epoch_figures._buffered_summary(plan)
        assert fast is not None and plan.summary() == fast
        patch.setattr(epoch_figures, "_buffered_summary", lambda *a, **k: None)
        slow = plan.summary()

    def plain(summary: PlanSummary) -> list[tuple[object, ...]]:
        return [(w.index, w.samples, w.batches, w.chunks, w.bytes_decoded, w.bytes_held,
                 w.shards, w.requests) for w in summary.windows]  # fmt: skip

    assert plain(fast) == plain(slow)
    # the figures in expectation given the windows, the realised ones within noise
    assert abs(fast.quality.entropy - slow.quality.entropy) < 0.02
    assert fast.quality.mixing is not None and slow.quality.mixing is not None
    assert abs(fast.quality.mixing - slow.quality.mixing) < 0.05
    assert abs(fast.quality.displacement - slow.quality.displacement) < 0.05


@given(n=st.integers(1, 40_000), chunk=st.integers(1, 4_000), window=st.integers(1, 30_000))
@settings(max_examples=20, deadline=None, derandomize=True, phases=GENERATE)
def test_an_exact_summary_without_ids_reads_what_the_ids_read(
    n: int, chunk: int, window: int
) -> None:
    sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    plan = EpochPlan(n, (chunk_offsets(sizes),), 16, False, "exact", window, 3, 0, row_bytes=(8,))
    fast = plan.summary()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EpochPlan, "_exact_alone", lambda self: False)
        slow = plan.summary()
    for mine, theirs in zip(fast.windows, slow.windows, strict=True):
        assert (mine.index, mine.samples, mine.batches) == (theirs.index, theirs.samples,
                                                            theirs.batches)  # fmt: skip
        # a dense window counts every chunk: the ids miss one with probability < exp(-24)
        assert mine.chunks == theirs.chunks and mine.bytes_decoded == theirs.bytes_decoded
