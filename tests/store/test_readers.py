"""The chunk readers (``store.readers``): one contract, run against every reader.

Each reader reads a window's pieces into its output (a sequential window, a
shuffled one keeping some rows of two chunks) and a stored block, and a chunk
that fails is named by the task's fallback (``read.failures``), whichever
reader failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import zarr

import daskzarr_batches as dzb
from daskzarr_batches.plan.windows import ChunkPiece
from daskzarr_batches.read.tasks import read_block
from daskzarr_batches.read.window import read_window
from daskzarr_batches.store.pipelines import with_codec_pipeline
from daskzarr_batches.store.policy import DEFAULT_POLICY, Ledger
from daskzarr_batches.store.readers import Access, RowsWindow, reader_for
from daskzarr_batches.store.rows import runs_of

ROWS, CHUNK = 45, 10
DATA = np.arange(ROWS * 3, dtype="f4").reshape(ROWS, 3)
KINDS = ["zarr", "zarrs", "direct", "shards", "numpy", "dask"]


class Flaky:
    """An array in memory whose chunk 2 fails to read (any read touching rows 20:30)."""

    shape, dtype, ndim = DATA.shape, DATA.dtype, 2

    def __getitem__(self, selection: Any) -> np.ndarray:
        rows = range(ROWS)[selection[0] if isinstance(selection, tuple) else selection]
        if set(rows) & set(range(20, 30)):
            raise OSError("the device is unplugged")
        return DATA[selection]


def _fail_block_2(block: np.ndarray, block_info: Any = None) -> np.ndarray:
    if block_info[0]["chunk-location"][0] == 2:
        raise OSError("the worker lost it")
    return block


def make(kind: str, tmp_path: Path, broken: bool = False) -> Any:
    """An array of ``DATA`` read by reader ``kind`` (``broken``: chunk 2 fails)."""
    if kind == "numpy":
        return Flaky() if broken else DATA.copy()
    if kind == "dask":
        x = da.from_array(DATA, chunks=(CHUNK, 3))
        return x.map_blocks(_fail_block_2, dtype=DATA.dtype) if broken else x
    kw: dict[str, Any] = {"compressors": zarr.codecs.GzipCodec()}
    if kind == "direct":
        kw = {}  # zarr's default: bytes + zstd, read directly
    if kind == "shards":
        kw["shards"] = (2 * CHUNK, 3)
    path = tmp_path / f"{kind}.zarr"
    array = zarr.create_array(path, shape=DATA.shape, chunks=(CHUNK, 3), dtype="f4", **kw)
    array[:] = DATA
    if broken:  # chunk 2: garbage where its bytes (or its shard's) are
        (path / "c" / ("1" if kind == "shards" else "2") / "0").write_bytes(b"not a chunk" * 9)
    if kind == "zarrs":
        pytest.importorskip("zarrs")
        return with_codec_pipeline(array, "zarrs")
    return array


def pieces(shuffled: bool) -> list[ChunkPiece]:
    """A sequential window of every row, or a shuffled one of some rows of chunks 1 and 3."""
    if not shuffled:
        bounds = [(lo, min(ROWS, lo + CHUNK)) for lo in range(0, ROWS, CHUNK)]
        return [
            ChunkPiece(c, lo, hi, slice(0, hi - lo), slice(lo, hi))
            for c, (lo, hi) in enumerate(bounds)
        ]
    return [
        ChunkPiece(1, 10, 20, np.array([0, 3, 7]), np.array([4, 0, 2])),
        ChunkPiece(3, 30, 40, slice(2, 6), np.array([1, 3, 5, 6])),
    ]


def expected(shuffled: bool) -> np.ndarray:
    return DATA[[10, 13, 17, 32, 33, 34, 35]] if shuffled else DATA


@pytest.mark.parametrize("kind", KINDS)
def test_reader_for_chooses_the_reader_once_by_layout_and_pipeline(
    kind: str, tmp_path: Path
) -> None:
    reader = reader_for(make(kind, tmp_path), DEFAULT_POLICY)
    assert reader.kind == kind
    if kind == "direct":
        assert reader.other.kind == "zarr"  # type: ignore[attr-defined]


@pytest.mark.parametrize("shuffled", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_reads_a_windows_pieces_into_its_output(
    kind: str, shuffled: bool, tmp_path: Path
) -> None:
    array, window = make(kind, tmp_path), pieces(shuffled)
    want = expected(shuffled)
    reader = reader_for(array, DEFAULT_POLICY)
    access = Access(array, "x", DEFAULT_POLICY, Ledger(), None, lambda: [], reader.native)
    job = RowsWindow(
        runs_of(window, 10**6), len(want), False, 10**6, shuffled, True,
        lambda: np.empty(want.shape, want.dtype),
    )  # fmt: skip
    rows = reader.read_rows(access, job)
    if rows is not None:  # None: not this reader's window, the task's fallback reads it
        np.testing.assert_array_equal(rows, want)
    rows, report = read_window(array, "x", len(want), 12, window)
    np.testing.assert_array_equal(rows, want)
    assert not report.skipped and not report.missing_keys


@pytest.mark.parametrize("kind", KINDS)
def test_a_reader_reads_a_stored_block(kind: str, tmp_path: Path) -> None:
    array = make(kind, tmp_path)
    slices = (slice(40, 45), slice(0, 3))  # the edge block
    reader = reader_for(array, DEFAULT_POLICY)
    access = Access(array, "x", DEFAULT_POLICY, Ledger(), None, lambda: [], reader.native)
    block = reader.read_block(access, slices)
    if block is not None:  # None: read through the policy view by the task
        np.testing.assert_array_equal(block, DATA[40:45])
    block, _ = read_block(array, "x", (4, 0), slices)
    np.testing.assert_array_equal(block, DATA[40:45])


@pytest.mark.parametrize("kind", KINDS)
def test_a_failing_chunk_is_named_whichever_reader_failed(kind: str, tmp_path: Path) -> None:
    array = make(kind, tmp_path, broken=True)
    error = dzb.CorruptChunkError if isinstance(array, zarr.Array) else dzb.ChunkReadError
    with pytest.raises(error, match=r"axis-0 chunk 2 \(samples 20:30"):
        read_window(array, "x", ROWS, 12, pieces(False))
    with pytest.raises(error, match=r"chunk \(2, 0\) \(samples 20:30"):
        read_block(array, "x", (2, 0), (slice(20, 30), slice(0, 3)))
