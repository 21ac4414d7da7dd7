"""anndata's CSR rows through every stream, against a scipy oracle.

The fixtures are annbatch's ``write_sharded`` layout and ``AnnData.write_zarr``'s, written
with zarr alone (``tests/sparse_layout.py``); the real writers are checked against them in
``integration/test_sparse_peers.py``.  Each cell carries its id in a dense label array, so
"each cell once" and "the rows are those cells" are checked together.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from sparse_layout import random_cells, write_sharded_like, write_zarr_like

import daskzarr_batches as dzb

N_CELLS, N_GENES = 1200, 300


@pytest.fixture(scope="module")
def cells() -> sp.csr_matrix:
    return random_cells(N_CELLS, N_GENES, 12, seed=3)


@pytest.fixture(scope="module", params=["write_sharded", "write_zarr"])
def store(request, cells, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "cells.zarr"
    codes = np.arange(N_CELLS) % 3
    obs = {"cell_type": (codes, ["B", "T", "NK"])}
    if request.param == "write_sharded":
        write_sharded_like(path, cells, n_obs_per_chunk=8, obs_per_shard=200, obs=obs)
    else:
        write_zarr_like(path, cells, chunk=97, obs=obs)
    return path


def _rows(batches) -> sp.csr_matrix:
    return sp.vstack([b if sp.issparse(b) else b[0] for b in batches], format="csr")


def _same(a: sp.spmatrix, b: sp.spmatrix) -> bool:
    return a.shape == b.shape and (a != b).nnz == 0


def _pairs(stream) -> tuple[sp.csr_matrix, np.ndarray]:
    xs, ids = zip(*stream, strict=True)
    for x in xs:
        assert isinstance(x, sp.csr_matrix) and x.shape[1] == N_GENES
    return sp.vstack(xs, format="csr"), np.concatenate(ids)


def test_a_csr_group_streams_its_rows_in_order(store, cells):
    group = zarr.open_group(store, mode="r")["X"]  # the first try: the group itself
    stream = dzb.batch_stream(group, batch_size=100)
    batches = list(stream)
    assert all(isinstance(b, sp.csr_matrix) for b in batches)
    assert [b.shape[0] for b in batches] == [100] * 12
    assert _same(_rows(batches), cells)
    assert stream.stats.samples_yielded == N_CELLS
    assert stream.stats.read_amplification <= 1.05


@pytest.mark.parametrize("buffer", [300, "auto", None], ids=["buffered", "auto", "exact"])
def test_shuffled_pairs_give_each_cell_once_with_its_row(store, cells, buffer):
    x = dzb.open_array(store, "X")
    ids = np.arange(N_CELLS)

    def epoch(seed):
        return dzb.paired_shuffled_batch_stream(
            x, ids, batch_size=64, seed=seed, shuffle_buffer_size=buffer
        )

    stream = epoch(5)
    rows, order = _pairs(stream)
    assert sorted(order.tolist()) == list(range(N_CELLS))
    assert not np.array_equal(order, ids)
    assert _same(rows, cells[order])
    again = _pairs(epoch(5))
    assert np.array_equal(again[1], order) and _same(again[0], rows)
    assert not np.array_equal(_pairs(epoch(6))[1], order)
    if buffer is None:
        return
    # buffered and auto: each stored chunk of data and indices read about once
    alone = dzb.shuffled_batch_stream(x, batch_size=64, seed=5, shuffle_buffer_size=buffer)
    got = _rows(alone)
    assert got.shape == rows.shape
    if buffer != "auto":  # "auto" sizes the buffer by the arrays' row bytes: another order
        assert _same(got, rows)
    assert alone.stats.read_amplification <= 1.05
    if buffer == "auto":
        assert alone.summary().buffer_figure is not None


def test_loader_ranks_cover_every_cell_and_resume_exactly(store, cells):
    x = dzb.open_array(store, "X")
    ids = np.arange(N_CELLS)

    def loader(rank=0, world_size=1):
        return dzb.Loader(
            {"x": x, "id": ids}, batch_size=50, shuffle=True, shuffle_buffer_size=400, seed=2,
            rank=rank, world_size=world_size,
        )  # fmt: skip

    seen = []
    for rank in range(2):
        for batch in loader(rank, 2):
            assert _same(batch["x"], cells[batch["id"]])
            seen.append(batch["id"])
    assert sorted(np.concatenate(seen).tolist()) == list(range(N_CELLS))

    whole = [batch["id"] for batch in loader()]
    first = loader()
    it = iter(first)
    for _ in range(7):
        next(it)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(whole) - 7
    for expected, batch in zip(whole[7:], rest, strict=True):
        assert np.array_equal(batch["id"], expected)
        assert _same(batch["x"], cells[expected])


def test_categorical_obs_column_labels_pairs_and_class_sampler(store, cells):
    column = dzb.open_array(store, "obs/cell_type")
    assert list(column.categories) == ["B", "T", "NK"]
    codes = np.asarray(column)
    assert np.array_equal(codes, np.arange(N_CELLS) % 3)
    x = dzb.open_array(store, "X")
    loader = dzb.Loader({"x": x, "y": column}, batch_size=60, shuffle=True, labels="y", seed=1)
    for batch in loader:
        assert batch["x"].shape == (len(batch["y"]), N_GENES)
    sampler = dzb.ClassSampler(column, weights={0: 1.0, 1: 0.0, 2: 0.0}, num_samples=120)
    drawn = dzb.Loader((x, column), batch_size=40, shuffle=True, sampler=sampler, seed=1)
    rows, labels = _pairs(drawn)
    assert rows.shape == (120, N_GENES) and set(labels.tolist()) == {0}


def test_an_epoch_as_dask_and_the_group_as_dask(store, cells):
    x = dzb.open_array(store, "X")
    assert _same(x.to_dask().compute(), cells)
    stream = dzb.shuffled_batch_stream(x, batch_size=64, seed=4, shuffle_buffer_size=300)
    lazy = stream.to_dask()
    assert isinstance(lazy._meta, sp.csr_matrix)
    assert _same(lazy.compute(), _rows(stream))


def test_chunk_stream_and_map_chunks_hand_out_units_of_rows(store, cells):
    x = dzb.open_array(store, "X")
    blocks = list(dzb.chunk_stream(x))
    assert [b.shape[0] for b in blocks] == list(x.chunks[0])
    assert all(isinstance(b, sp.csr_matrix) for b in blocks)
    assert _same(sp.vstack(blocks, format="csr"), cells)
    sums = list(dzb.map_chunks(lambda block: np.asarray(block.sum(axis=1)).ravel(), x))
    assert np.allclose(np.concatenate(sums), np.asarray(cells.sum(axis=1)).ravel())


def test_collections_and_mixtures_of_csr_groups(store, cells, tmp_path):
    other = random_cells(500, N_GENES, 20, seed=9)
    write_sharded_like(tmp_path / "other.zarr", other, n_obs_per_chunk=8)
    x, y = dzb.open_array(store, "X"), dzb.open_array(tmp_path / "other.zarr", "X")
    joined = dzb.concat([x, y])
    both = sp.vstack([cells, other], format="csr")
    assert _same(_rows(dzb.batch_stream(joined, batch_size=128)), both)
    shuffled = dzb.Loader(
        {"x": joined, "id": np.arange(both.shape[0])}, batch_size=64, shuffle=True,
        shuffle_buffer_size=500, seed=3,
    )  # fmt: skip
    ids = []
    for batch in shuffled:
        assert _same(batch["x"], both[batch["id"]])
        ids.append(batch["id"])
    assert sorted(np.concatenate(ids).tolist()) == list(range(both.shape[0]))
    mixture = dzb.mix([x, y], [0.5, 0.5], seed=1)
    mixed = list(dzb.shuffled_batch_stream(mixture, batch_size=100, shuffle_buffer_size=400))
    assert all(isinstance(b, sp.csr_matrix) for b in mixed)
    assert sum(b.shape[0] for b in mixed) == len(mixture)


def test_sparse_rows_on_a_cluster_in_plan_order(store, cells, client):
    x = dzb.open_array(store, "X")
    ids = np.arange(N_CELLS)
    stream = dzb.paired_shuffled_batch_stream(
        x, ids, batch_size=64, seed=5, shuffle_buffer_size=300, client=client
    )
    rows, order = _pairs(stream)
    assert sorted(order.tolist()) == list(range(N_CELLS))
    assert _same(rows, cells[order])
    local = _pairs(
        dzb.paired_shuffled_batch_stream(x, ids, batch_size=64, seed=5, shuffle_buffer_size=300)
    )
    assert np.array_equal(local[1], order)  # the same order whatever the scheduler
