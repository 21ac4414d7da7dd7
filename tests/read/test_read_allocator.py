"""The read context allocates the outputs a read's chunk requests point at (issue 36).

``ReadContext(allocator=...)``: the arrays it makes are the ``out`` of every
request a window (``read_window``) or a block (``read_block``) asks the
array's reader for, and the rows returned, whoever fills them (the user's
reader, or the library's planned read); numpy's, from the pool where it
applies, without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import zarr

from daskzarr_batches.plan.windows import chunk_offsets, pieces_for
from daskzarr_batches.read.buffers import BufferPool
from daskzarr_batches.read.context import ReadContext
from daskzarr_batches.read.tasks import read_block
from daskzarr_batches.read.window import read_window
from daskzarr_batches.readers import ChunkReader, ChunkRequest
from daskzarr_batches.store.policy import ReadPolicy
from daskzarr_batches.store.reader_hook import ReaderHook


class Recording:
    """An allocator that records what it made (numpy arrays, as pinned memory would be)."""

    def __init__(self) -> None:
        self.made: list[np.ndarray] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        self.made.append(np.full(shape, -1, dtype))
        return self.made[-1]


class Outs:
    """A reader that records its requests' outputs, and lets ``default`` read (or reads itself)."""

    def __init__(self, array: Any, default: ChunkReader, itself: bool) -> None:
        self.array, self.default, self.itself = array, default, itself
        self.outs: list[Any] = []

    def read(self, requests: Sequence[ChunkRequest]) -> None:
        self.outs += [r.out for r in requests]
        if not self.itself:
            self.default.read(requests)
            return
        for r in requests:  # a reader of its own: each chunk read whole, its part placed
            r.fill(np.asarray(self.array[r.region]))


@pytest.fixture
def array() -> zarr.Array:
    x = zarr.create_array({}, shape=(20, 4), chunks=(6, 2), dtype="f4")
    x[:] = np.arange(80, dtype="f4").reshape(20, 4)
    return x


def _context(readers: list[Outs], itself: bool, allocator: Any, pool: Any = None) -> ReadContext:
    def factory(array: Any, default: ChunkReader) -> Outs:
        readers.append(Outs(array, default, itself))
        return readers[-1]

    return ReadContext(ReadPolicy(readers=ReaderHook(factory)), allocator=allocator, pool=pool)


@pytest.mark.parametrize("itself", [False, True], ids=["library", "users"])
@pytest.mark.parametrize("samples", [range(3, 17), [15, 2, 9, 3, 11]], ids=["run", "shuffled"])
def test_a_windows_requests_point_at_the_allocators_output(
    array: zarr.Array, itself: bool, samples: Any
) -> None:
    made, readers = Recording(), []
    ids = np.asarray(samples)
    pieces = pieces_for(samples if isinstance(samples, range) else ids, chunk_offsets([6, 6, 6, 2]))
    ctx = _context(readers, itself, made, BufferPool(2**20))
    rows, _ = read_window(array, "x", len(ids), 16, pieces, ctx)
    assert len(made.made) == 1 and rows is made.made[0]
    assert readers[0].outs and all(out is rows for out in readers[0].outs)
    np.testing.assert_array_equal(rows, array[:][np.sort(ids)])


@pytest.mark.parametrize("itself", [False, True], ids=["library", "users"])
def test_a_blocks_requests_point_at_the_allocators_output(array: zarr.Array, itself: bool) -> None:
    made, readers = Recording(), []
    slices = (slice(6, 12), slice(2, 4))
    block, _ = read_block(array, "x", (1, 1), slices, _context(readers, itself, made))
    assert len(made.made) == 1 and readers[0].outs
    assert all(out is made.made[0] for out in readers[0].outs)
    if itself:  # the user's reader filled the allocator's array: the block is it
        assert block is made.made[0]
    np.testing.assert_array_equal(block, array[6:12, 2:4])


def test_without_an_allocator_outputs_are_numpys_or_the_pools() -> None:
    pool = BufferPool(2**20)
    ctx = ReadContext(pool=pool)
    taken = ctx.allocate((3, 2), "f4", pooled=True)
    assert taken.shape == (3, 2) and taken.dtype == np.float32
    pool.give(taken)
    again = ctx.allocate((3, 2), "f4", pooled=True)
    assert np.shares_memory(again, taken)  # the pool's buffer again
    assert not np.shares_memory(ctx.allocate((3, 2), "f4"), taken)  # not pooled: numpy's own
    made = Recording()
    assert ReadContext(pool=pool, allocator=made).allocate((3, 2), "f4", True) is made.made[0]
