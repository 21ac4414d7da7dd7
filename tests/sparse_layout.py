"""anndata's layouts of a CSR matrix and a categorical column, written with zarr alone.

The pinned test leg has neither anndata nor annbatch; these write what they write
(checked against the real writers in ``integration/test_sparse_peers.py``):

- :func:`write_sharded_like`: annbatch 0.3's ``write_sharded``: zarr v3, ``data`` /
  ``indices`` / ``indptr`` chunked by ``n_obs_per_chunk`` times the mean non-zeros per
  row, sharded, blosc-lz4 (clevel 3, shuffle), the narrowest unsigned index dtype.
- :func:`write_zarr_like`: ``anndata.AnnData.write_zarr`` (0.13): zarr v3, each array one
  shard of chunks (zarr's automatic chunk length there; here ``chunk``, default the
  whole array), zstd level 0, int32 indices and indptr.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr
from zarr.codecs import BloscCodec, ZstdCodec


def random_cells(
    n_cells: int, n_genes: int, nnz_per_cell: int, seed: int = 0, spread: bool = True
) -> sp.csr_matrix:
    """A CSR matrix of counts: about ``nnz_per_cell`` non-zeros a row (varying if ``spread``)."""
    rng = np.random.default_rng(seed)
    if spread:
        counts = rng.integers(0, 2 * nnz_per_cell + 1, n_cells).clip(0, n_genes)
    else:
        counts = np.full(n_cells, min(nnz_per_cell, n_genes))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    indices = np.concatenate(
        [np.sort(rng.choice(n_genes, c, replace=False)) for c in counts] or [np.empty(0, int)]
    )
    data = rng.integers(1, 50, len(indices)).astype(np.float32)
    return sp.csr_matrix((data, indices, indptr), shape=(n_cells, n_genes))


def _narrowest(n: int) -> np.dtype[Any]:
    for dtype in (np.uint8, np.uint16, np.uint32):
        if n <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def _obs(root: zarr.Group, n: int, obs: Mapping[str, tuple[np.ndarray, Sequence[str]]]) -> None:
    group = root.create_group("obs")
    group.attrs.update(
        {
            "_index": "_index",
            "column-order": list(obs),
            "encoding-type": "dataframe",
            "encoding-version": "0.2.0",
        }
    )
    _strings(group, "_index", [str(i) for i in range(n)])
    for name, (codes, categories) in obs.items():
        column = group.create_group(name)
        column.attrs.update(
            {"encoding-type": "categorical", "encoding-version": "0.2.0", "ordered": False}
        )
        column.create_array("codes", data=np.asarray(codes, dtype=np.int8))
        _strings(column, "categories", list(categories))


def _strings(group: zarr.Group, name: str, values: Sequence[str]) -> None:
    array = group.create_array(name, shape=(len(values),), dtype=str)
    array[:] = np.array(values, dtype=object)


def _csr_group(root: zarr.Group, key: str, matrix: sp.csr_matrix) -> zarr.Group:
    group = root.create_group(key)
    group.attrs.update(
        {"encoding-type": "csr_matrix", "encoding-version": "0.1.0", "shape": list(matrix.shape)}
    )
    return group


def write_sharded_like(
    path: Any,
    matrix: sp.csr_matrix,
    *,
    n_obs_per_chunk: int = 64,
    obs_per_shard: int | None = None,
    obs: Mapping[str, tuple[np.ndarray, Sequence[str]]] | None = None,
) -> zarr.Group:
    """Write ``matrix`` as ``X`` the way annbatch's ``write_sharded`` does; the root group."""
    root = zarr.open_group(path, mode="w", zarr_format=3)
    group = _csr_group(root, "X", matrix)
    n, nnz = matrix.shape[0], matrix.nnz
    mean = nnz / max(n, 1)
    chunk = min(max(1, int(n_obs_per_chunk * mean)), max(nnz, 1))
    shard = nnz if obs_per_shard is None else max(1, int(obs_per_shard * mean))
    shard = max(chunk, min(shard, max(nnz, 1)) // chunk * chunk)
    arrays = {
        "data": matrix.data,
        "indices": matrix.indices.astype(_narrowest(matrix.shape[1])),
        "indptr": matrix.indptr.astype(np.int32 if nnz < 2**31 else np.int64),
    }
    for name, values in arrays.items():
        blosc = BloscCodec(cname="lz4", clevel=3, shuffle="shuffle")
        array = group.create_array(
            name,
            shape=values.shape,
            dtype=values.dtype,
            chunks=(chunk,),
            shards=(shard,),
            compressors=(blosc,),
        )
        array[:] = values
    if obs is not None:
        _obs(root, n, obs)
    return root


def write_zarr_like(
    path: Any,
    matrix: sp.csr_matrix,
    *,
    chunk: int | None = None,
    obs: Mapping[str, tuple[np.ndarray, Sequence[str]]] | None = None,
    encoding: str = "csr_matrix",
) -> zarr.Group:
    """Write ``matrix`` as ``X`` the way ``AnnData.write_zarr`` does; the root group.

    ``encoding``: the group's ``encoding-type`` (``"csc_matrix"`` to test refusals).
    """
    root = zarr.open_group(path, mode="w", zarr_format=3)
    group = _csr_group(root, "X", matrix)
    group.attrs["encoding-type"] = encoding
    arrays = {
        "data": matrix.data,
        "indices": matrix.indices.astype(np.int32),
        "indptr": matrix.indptr.astype(np.int32),
    }
    for name, values in arrays.items():
        whole = max(len(values), 1)
        size = whole if chunk is None or name == "indptr" else min(chunk, whole)
        array = group.create_array(
            name,
            shape=values.shape,
            dtype=values.dtype,
            chunks=(size,),
            shards=(-(-whole // size) * size,),
            compressors=(ZstdCodec(level=0),),
        )
        array[:] = values
    if obs is not None:
        _obs(root, matrix.shape[0], obs)
    return root
