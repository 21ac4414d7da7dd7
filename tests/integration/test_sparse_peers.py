"""anndata's own CSR writers beside this library (the ``peers`` extra: annbatch, anndata).

``annbatch.write_sharded`` and ``anndata.AnnData.write_zarr`` write a sparse ``X`` and a
categorical ``obs`` column; this library streams the cells exactly (a scipy oracle), and
the pure-zarr fixture writers of ``tests/sparse_layout.py`` (what the pinned leg tests
with) write the same layout: dtypes, chunks, shards, codecs and attributes.  annbatch's
``Loader`` reads the same store to the same cells.  Not collected where insitubatch is
missing (tests/conftest.py: the ``peers`` files).
"""

from __future__ import annotations

import annbatch
import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import zarr
from sparse_layout import random_cells, write_sharded_like, write_zarr_like

import daskzarr_batches as dzb

pytestmark = [
    pytest.mark.peers,
    pytest.mark.filterwarnings("ignore:The 'future.infer_string' option is deprecated"),
    pytest.mark.filterwarnings("ignore:Consolidated metadata is currently not part"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

N_CELLS, N_GENES = 600, 400
TYPES = ["B", "T", "NK"]


@pytest.fixture(scope="module")
def cells() -> sp.csr_matrix:
    return random_cells(N_CELLS, N_GENES, 15, seed=7)


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 3, N_CELLS)


def _adata(cells, codes) -> ad.AnnData:
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical.from_codes(codes, TYPES)},
        index=[f"c{i}" for i in range(N_CELLS)],
    )
    return ad.AnnData(X=cells, obs=obs)


@pytest.fixture(scope="module", params=["write_sharded", "write_zarr"])
def written(request, cells, codes, tmp_path_factory):
    real = tmp_path_factory.mktemp("real") / "cells.zarr"
    mine = tmp_path_factory.mktemp("mine") / "cells.zarr"
    obs = {"cell_type": (codes, TYPES)}
    if request.param == "write_sharded":
        annbatch.write_sharded(zarr.open_group(real, mode="w", zarr_format=3), _adata(cells, codes))
        write_sharded_like(mine, cells, obs=obs)
    else:
        _adata(cells, codes).write_zarr(real)
        write_zarr_like(mine, cells, obs=obs)
    return real, mine, request.param


def _layout(path) -> dict:
    group = zarr.open_group(path, mode="r")
    out = {"attrs": {k: v for k, v in group["X"].attrs.items()}}
    for name in ("data", "indices", "indptr"):
        array = group["X"][name]
        codecs = [type(c).__name__ for c in array.compressors]
        out[name] = (str(array.dtype), array.chunks, array.shards, codecs)
    out["cell_type"] = dict(group["obs/cell_type"].attrs)
    return out


def test_the_fixture_writers_write_what_anndata_writes(written):
    real, mine, kind = written
    ours, theirs = _layout(mine), _layout(real)
    sharded = kind == "write_sharded"  # its chunks are fixed; write_zarr's are zarr's choice
    for name in ("data", "indices"):
        dtype, chunks, shards, codecs = ours[name]
        assert (dtype, shards, codecs) == (theirs[name][0], *theirs[name][2:]), name
        assert chunks == theirs[name][1] or not sharded, name
    assert ours["attrs"] == theirs["attrs"]
    assert ours["cell_type"]["encoding-type"] == theirs["cell_type"]["encoding-type"]


def test_cells_stream_exactly_from_anndatas_own_writers(written, cells, codes):
    real, _, _ = written
    x = dzb.open_array(real, "X")
    rows = sp.vstack(list(dzb.batch_stream(x, 100)), format="csr")
    assert (rows != cells).nnz == 0
    column = dzb.open_array(real, "obs/cell_type")
    assert list(column.categories) == TYPES and np.array_equal(np.asarray(column), codes)
    loader = dzb.Loader({"x": x, "y": column, "id": np.arange(N_CELLS)}, 64, shuffle=True)
    seen = []
    for batch in loader:
        assert (batch["x"] != cells[batch["id"]]).nnz == 0
        assert np.array_equal(batch["y"], codes[batch["id"]])
        seen.append(batch["id"])
    assert sorted(np.concatenate(seen).tolist()) == list(range(N_CELLS))


def test_annbatch_reads_the_same_cells_from_the_fixture_layout(written, cells):
    _, mine, _ = written
    x = ad.io.sparse_dataset(zarr.open_group(mine, mode="r")["X"])
    loader = annbatch.Loader(
        batch_size=100, chunk_size=50, preload_nchunks=4, preload_to_gpu=False
    ).add_adata(ad.AnnData(X=x))
    rows = sp.vstack([batch["X"] for batch in loader], format="csr")
    assert (rows != cells).nnz == 0
