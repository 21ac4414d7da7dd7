"""The newest peer loaders install and work beside this library in one environment.

A smoke test for the newest CI leg (the ``peers`` extra: Python >= 3.12): insitubatch 0.2
(which needs zarr >= 3.3) and annbatch 0.3 are importable next to ``daskzarr_batches``, and
all three read one Zarr v3 store -- an AnnData store written by annbatch's own writer,
``annbatch.write_sharded`` -- and deliver exactly its rows:

* insitubatch through its public API (``obstore_store``, ``open_geometries``,
  ``split_by_chunk``, ``InSituDataset``): every sample once over its ``all`` view and once
  over train, val and test together;
* annbatch through ``Loader.add_adata`` (numpy output, no torch and no cupy: ``to=None``,
  ``preload_to_gpu=False``; torch is needed only for ``to="torch"``), shuffled: a permutation
  of the rows, each with its own ``obs`` name;
* this library through ``batch_stream``: the rows in order.

Not collected where insitubatch is missing (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import annbatch
import anndata as ad
import insitubatch
import numpy as np
import pandas as pd
import pytest
import zarr
from packaging.version import Version

import daskzarr_batches as dzb

pytestmark = [
    pytest.mark.peers,
    # Peers' warnings about each other, not about our code: anndata 0.13 reads pandas'
    # deprecated 'future.infer_string' option whenever it builds an AnnData (pandas 3) ...
    pytest.mark.filterwarnings(
        "ignore:The 'future.infer_string' option is deprecated:pandas.errors.Pandas4Warning"
    ),
    # ... and annbatch.write_sharded consolidates the metadata of a Zarr v3 store, which
    # zarr warns is not part of the v3 specification.
    pytest.mark.filterwarnings(
        "ignore:Consolidated metadata is currently not part:zarr.errors.ZarrUserWarning"
    ),
]

N_OBS, N_VAR = 256, 8
CHUNK_ROWS, SHARD_ROWS = 32, 64
BATCH = 32
# Row i holds 8 * i ... 8 * i + 7: a row's index is its first value / 8, and a mixed-up
# column or row shows.
VALUES = np.arange(N_OBS * N_VAR, dtype=np.float32).reshape(N_OBS, N_VAR)
OBS_NAMES = [f"cell{i}" for i in range(N_OBS)]


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An AnnData Zarr v3 store of ``VALUES`` (``X``: 32-row chunks in 64-row shards)."""
    path = tmp_path_factory.mktemp("peers") / "cells.zarr"
    adata = ad.AnnData(
        X=VALUES,
        # a column: annbatch yields no obs for an obs frame without one
        obs=pd.DataFrame({"row": np.arange(N_OBS)}, index=OBS_NAMES),
        var=pd.DataFrame(index=[f"gene{j}" for j in range(N_VAR)]),
    )
    group = zarr.open_group(path, mode="w", zarr_format=3)
    annbatch.write_sharded(group, adata, n_obs_per_chunk=CHUNK_ROWS, shard_size=SHARD_ROWS)
    return path


def open_x(store_path: Path) -> zarr.Array:
    """The store's ``X`` as a read-only zarr array."""
    x = zarr.open_group(store_path, mode="r")["X"]
    assert isinstance(x, zarr.Array)
    return x


def test_zarr_is_new_enough_for_insitubatch() -> None:
    """insitubatch 0.2 needs zarr >= 3.3, and this environment resolved to it."""
    assert Version(version("zarr")) >= Version("3.3")
    assert Version(version("insitubatch")) >= Version("0.2")
    assert Version(version("annbatch")) >= Version("0.3")


def test_annbatch_writes_a_zarr_v3_store(store_path: Path) -> None:
    """annbatch.write_sharded wrote Zarr v3, chunked and sharded as asked."""
    x = open_x(store_path)
    assert x.metadata.zarr_format == 3
    assert (x.shape, x.dtype) == ((N_OBS, N_VAR), np.dtype("float32"))
    assert (x.chunks, x.shards) == ((CHUNK_ROWS, N_VAR), (SHARD_ROWS, N_VAR))
    np.testing.assert_array_equal(x[:], VALUES)


def test_insitubatch_yields_every_sample_once(store_path: Path) -> None:
    """insitubatch's ``all`` view, and train + val + test, cover each sample exactly once."""
    store = insitubatch.obstore_store(store_path.as_uri())
    geometries = insitubatch.open_geometries(store, variables=["X"])
    # its storage unit is the shard, so its chunk grid is 4 chunks of 64 rows
    assert geometries["X"].chunks == (SHARD_ROWS, N_VAR)
    # fractions of chunks: 2, 1 and 1 of the 4 (the default 0.8/0.1/0.1 leaves val empty)
    manifest = insitubatch.split_by_chunk(geometries["X"], fractions=(0.5, 0.25, 0.25))
    dataset = insitubatch.InSituDataset(
        store, manifest, geometries=geometries, batch_size=BATCH, shuffle=True, seed=0
    )

    def one_pass(view: Iterable[Any]) -> tuple[np.ndarray, np.ndarray]:
        batches = list(view)
        assert all(len(b) <= BATCH for b in batches)
        return (
            np.concatenate([b.sample_indices for b in batches]),
            np.concatenate([b.arrays["X"] for b in batches]),
        )

    indices, rows = one_pass(dataset.all)
    np.testing.assert_array_equal(indices, np.arange(N_OBS))  # deterministic: in order
    np.testing.assert_array_equal(rows, VALUES)

    split_indices = []
    for view in (dataset.train, dataset.val, dataset.test):
        indices, rows = one_pass(view)
        np.testing.assert_array_equal(rows, VALUES[indices])
        split_indices.append(indices)
    np.testing.assert_array_equal(np.sort(np.concatenate(split_indices)), np.arange(N_OBS))


def test_annbatch_loader_yields_every_row_once(store_path: Path) -> None:
    """annbatch's Loader, shuffled, yields a permutation of the rows with their obs names."""
    group = zarr.open_group(store_path, mode="r")
    adata = ad.AnnData(X=open_x(store_path), obs=ad.io.read_elem(group["obs"]))
    loader = annbatch.Loader(
        chunk_size=CHUNK_ROWS,
        preload_nchunks=4,
        batch_size=BATCH,
        shuffle=True,
        rng=np.random.default_rng(0),
        return_index=True,
        preload_to_gpu=False,
    ).add_adata(adata)
    batches = list(loader)
    assert len(batches) == len(loader) == N_OBS // BATCH
    assert all(isinstance(b["X"], np.ndarray) for b in batches)

    indices = np.concatenate([b["index"] for b in batches])
    rows = np.concatenate([b["X"] for b in batches])
    names = np.concatenate([b["obs"].index.to_numpy() for b in batches])
    obs_rows = np.concatenate([b["obs"]["row"].to_numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(indices), np.arange(N_OBS))
    assert not np.array_equal(indices, np.arange(N_OBS))  # shuffled
    np.testing.assert_array_equal(rows, VALUES[indices])
    np.testing.assert_array_equal(names, np.asarray(OBS_NAMES)[indices])
    np.testing.assert_array_equal(obs_rows, indices)


def test_daskzarr_batches_reads_the_same_store(store_path: Path) -> None:
    """This library streams the same ``X`` in order, beside both peers."""
    with dzb.batch_stream(open_x(store_path), BATCH) as stream:
        batches = list(stream)
    assert [b.shape for b in batches] == [(BATCH, N_VAR)] * (N_OBS // BATCH)
    np.testing.assert_array_equal(np.concatenate(batches), VALUES)
