"""Sparse rows through the PyTorch adapter: CSR batches as ``torch.sparse_csr_tensor``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sparse_layout import random_cells, write_sharded_like

import daskzarr_batches as dzb

torch = pytest.importorskip("torch")
from daskzarr_batches.torch import ZarrIterableDataset, csr_tensor  # noqa: E402

pytestmark = pytest.mark.torch


def test_csr_batches_become_sparse_csr_tensors_beside_dense_labels(tmp_path):
    cells = random_cells(300, 50, 5, seed=2)
    write_sharded_like(tmp_path / "c.zarr", cells, n_obs_per_chunk=8)
    x = dzb.open_array(tmp_path / "c.zarr", "X")
    loader = dzb.Loader({"x": x, "id": np.arange(300)}, batch_size=64, shuffle=True, seed=1)
    seen = []
    for batch in torch.utils.data.DataLoader(ZarrIterableDataset(loader), batch_size=None):
        assert batch["x"].layout == torch.sparse_csr and batch["x"].shape == (len(batch["id"]), 50)
        expected = cells[batch["id"].numpy()].toarray()
        assert np.array_equal(batch["x"].to_dense().numpy(), expected)
        seen.append(batch["id"].numpy())
    assert sorted(np.concatenate(seen).tolist()) == list(range(300))


def test_densify_in_the_transform_gives_dense_tensors(tmp_path):
    cells = random_cells(100, 20, 4, seed=3)
    write_sharded_like(tmp_path / "c.zarr", cells, n_obs_per_chunk=8)
    x = dzb.open_array(tmp_path / "c.zarr", "X")
    loader = dzb.Loader(x, batch_size=50, transform=lambda rows: rows.toarray())
    batches = list(ZarrIterableDataset(loader))
    assert all(b.layout == torch.strided for b in batches)
    assert np.array_equal(torch.cat(batches).numpy(), cells.toarray())
    assert csr_tensor(sp.csr_matrix(cells[:3])).to_dense().shape == (3, 20)


@pytest.mark.timeout(120)
# torch warns when it rebuilds a sparse tensor a worker sent (its invariant checks are off
# by default): its warning, about its own transfer
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
def test_dataloader_workers_read_sparse_rows_after_the_parent_did(tmp_path):
    """Forked workers make their own slice pool (the parent's threads are not in them)."""
    cells = random_cells(400, 30, 5, seed=4)
    write_sharded_like(tmp_path / "c.zarr", cells, n_obs_per_chunk=8)
    x = dzb.open_array(tmp_path / "c.zarr", "X")
    loader = dzb.Loader({"x": x, "id": np.arange(400)}, batch_size=50)
    assert sum(b["x"].shape[0] for b in loader) == 400  # the parent's pool now exists
    batches = torch.utils.data.DataLoader(
        ZarrIterableDataset(loader), batch_size=None, num_workers=2
    )
    ids = []
    for batch in batches:
        assert np.array_equal(batch["x"].to_dense().numpy(), cells[batch["id"].numpy()].toarray())
        ids.append(batch["id"].numpy())
    assert sorted(np.concatenate(ids).tolist()) == list(range(400))
