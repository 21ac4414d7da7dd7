"""``store/sparse.py``: a CSR group's units of rows, its refusals, its rows gathered."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from hypothesis import given
from hypothesis import strategies as st
from sparse_layout import random_cells, write_sharded_like, write_zarr_like

import daskzarr_batches as dzb
from daskzarr_batches.errors import (
    ArgumentTypeError,
    CorruptChunkError,
    DaskZarrBatchesError,
    InvalidMetadataError,
)
from daskzarr_batches.store.sparse import CsrArray, needed_chunks, unit_bounds


@given(
    st.lists(st.integers(0, 40), min_size=0, max_size=60),
    st.integers(1, 30),
    st.integers(1, 4),
)
def test_units_start_where_a_group_of_chunks_starts(lengths, unit, per_unit):
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    bounds = unit_bounds(indptr, unit, per_unit)
    n = len(lengths)
    assert bounds[0] == 0 and bounds[-1] == n and np.all(np.diff(bounds) > 0) | (n == 0)
    step = unit * per_unit
    for first, end in itertools.pairwise(bounds):
        groups = indptr[first:end] // step  # the group each row's first non-zero is in
        assert groups.max() - groups.min() <= 1 if end - first > 1 else True
        if first > 0:  # a unit starts at the first row starting in a later group
            assert indptr[first] // step > indptr[first - 1] // step or lengths[first - 1] == 0


def test_needed_chunks_are_every_chunk_a_row_touches():
    indptr = np.array([0, 3, 3, 10, 25], dtype=np.int64)
    source = type("S", (), {"indptr": indptr})()
    assert needed_chunks(source, np.array([0, 1, 2, 3]), 5).tolist() == [0, 1, 2, 3, 4]
    assert needed_chunks(source, np.array([1]), 5).tolist() == []
    assert needed_chunks(source, np.array([3]), 5).tolist() == [2, 3, 4]


@pytest.fixture
def cells():
    return random_cells(200, 40, 6, seed=1)


def test_a_row_spanning_many_chunks_is_a_unit_and_reads_whole(tmp_path, cells):
    wide = sp.vstack([cells[:50], sp.csr_matrix(np.arange(1, 41, dtype=np.float32)), cells[50:]])
    write_zarr_like(tmp_path / "w.zarr", sp.csr_matrix(wide), chunk=4)
    x = dzb.open_array(tmp_path / "w.zarr", "X")
    out = sp.vstack(list(dzb.batch_stream(x, batch_size=16)), format="csr")
    assert (out != wide).nnz == 0


def test_open_array_names_the_group_and_its_units(tmp_path, cells):
    write_sharded_like(tmp_path / "c.zarr", cells, n_obs_per_chunk=4)
    x = dzb.open_array(str(tmp_path / "c.zarr"), "X")
    assert isinstance(x, CsrArray) and x.shape == (200, 40) and x.nnz == cells.nnz
    assert sum(x.chunks[0]) == 200 and "c.zarr/X" in repr(x)
    group = zarr.open_group(tmp_path / "c.zarr", mode="r")
    assert dzb.open_array(group, "X").shape == (200, 40)
    assert dzb.open_array(group["X"]).nnz == cells.nnz


def _broken(tmp_path, cells, change) -> zarr.Group:
    root = write_zarr_like(tmp_path / "b.zarr", cells, chunk=16)
    change(root["X"])
    return zarr.open_group(tmp_path / "b.zarr", mode="r")


def test_csc_is_refused_naming_the_group(tmp_path, cells):
    root = _broken(tmp_path, cells, lambda g: g.attrs.update({"encoding-type": "csc_matrix"}))
    with pytest.raises(InvalidMetadataError, match="CSC matrix") as info:
        dzb.batch_stream(root["X"], batch_size=8)
    assert "b.zarr/X" in str(info.value)


def test_a_group_without_indptr_is_refused(tmp_path, cells):
    root = write_zarr_like(tmp_path / "b.zarr", cells, chunk=16)
    del root["X"]["indptr"]
    with pytest.raises(InvalidMetadataError, match="without a 1-D array 'indptr'") as info:
        dzb.open_array(tmp_path / "b.zarr", "X")
    assert "b.zarr/X" in str(info.value)


def test_indptr_not_monotone_is_refused(tmp_path, cells):
    root = write_zarr_like(tmp_path / "b.zarr", cells, chunk=16)
    indptr = root["X"]["indptr"]
    values = indptr[:]
    values[10], values[11] = values[11], values[10] - 1
    indptr[:] = values
    with pytest.raises(InvalidMetadataError, match="not monotone: row 10"):
        dzb.open_array(tmp_path / "b.zarr", "X")


def test_a_shape_that_disagrees_with_indptr_is_refused(tmp_path, cells):
    root = write_zarr_like(tmp_path / "b.zarr", cells, chunk=16)
    root["X"].attrs["shape"] = [199, 40]
    with pytest.raises(InvalidMetadataError, match="indptr has 201 entries"):
        dzb.open_array(tmp_path / "b.zarr", "X")


def test_indices_out_of_range_fail_the_read_naming_the_group(tmp_path, cells):
    root = write_zarr_like(tmp_path / "b.zarr", cells, chunk=16)
    root["X"].attrs["shape"] = [200, 20]  # columns 20..39 now lie outside
    with pytest.raises(DaskZarrBatchesError, match="outside its 20 columns") as info:
        list(dzb.batch_stream(dzb.open_array(tmp_path / "b.zarr", "X"), batch_size=50))
    assert "b.zarr/X" in str(info.value)
    assert isinstance(info.value, CorruptChunkError) or isinstance(
        info.value.__cause__, CorruptChunkError
    )


def test_another_group_is_still_refused_as_not_an_array(tmp_path):
    root = zarr.open_group(tmp_path / "g.zarr", mode="w")
    root.create_array("a", shape=(4,), dtype="i4")
    with pytest.raises(ArgumentTypeError, match="got Group"):
        dzb.batch_stream(root, batch_size=2)
