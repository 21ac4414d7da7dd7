"""The PyTorch adapter: tensors, worker parts (fork and spawn), epochs, state, pinning."""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

torch = pytest.importorskip("torch")

import daskzarr_batches as dzb  # noqa: E402
from daskzarr_batches._batching import positions_between  # noqa: E402
from daskzarr_batches._batching import worker_part as worker_positions  # noqa: E402
from daskzarr_batches.torch import ZarrIterableDataset, to_tensors  # noqa: E402

N = 50


@pytest.fixture
def arrays(tmp_path: Path) -> dict[str, zarr.Array]:
    """x (N, 2) and y (N,) in a Zarr directory store, chunks of 8: workers read through zarr."""
    y = np.arange(N, dtype="i8")
    x = np.stack([2 * y, 2 * y + 1], axis=1)
    out = {}
    for name, value in {"x": x, "y": y}.items():
        z = zarr.create_array(
            str(tmp_path / f"{name}.zarr"),
            shape=value.shape,
            chunks=(8, *value.shape[1:]),
            dtype=value.dtype,
        )
        z[:] = value
        out[name] = zarr.open_array(str(tmp_path / f"{name}.zarr"), mode="r")
    return out


def make(arrays: dict[str, zarr.Array], **kw: Any) -> dzb.Loader:
    return dzb.Loader(arrays, 4, shuffle=True, seed=5, rank=1, world_size=2, **kw)


def key(batch: dict[str, Any]) -> tuple[int, ...]:
    """A batch as the tuple of its sample ids, checking x belongs to y."""
    y = np.asarray(batch["y"])
    np.testing.assert_array_equal(np.asarray(batch["x"]), np.stack([2 * y, 2 * y + 1], axis=1))
    return tuple(int(i) for i in y)


def test_worker_parts_are_whole_batches_covering_the_share_once() -> None:
    ranges = [(30, 37), (0, 11), (20, 25)]  # 23 positions
    for workers in (1, 2, 3, 7, 30):
        parts = [worker_positions(ranges, 4, w, workers) for w in range(workers)]
        starts = [0]
        for part in parts:
            starts.append(starts[-1] + sum(b - a for a, b in part))
        assert starts[-1] == 23
        assert all(s % 4 == 0 for s in starts[:-1])
        for w, part in enumerate(parts):
            assert part == positions_between(ranges, starts[w], starts[w + 1])


def test_tensors_share_memory_with_numpy() -> None:
    a, b = np.arange(3), np.ones((2, 2), dtype="f4")
    out = to_tensors({"a": a, "pair": (b, "label")})
    assert isinstance(out["a"], torch.Tensor) and out["pair"][1] == "label"
    out["a"][0] = 7
    out["pair"][0][1, 1] = 9
    assert a[0] == 7 and b[1, 1] == 9


def test_no_workers_gives_the_loaders_batches_and_advances_epochs(arrays: Any) -> None:
    expected = [key(b) for b in make(arrays)]
    ds = ZarrIterableDataset(make(arrays))
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    first = list(loader)
    assert all(isinstance(b["x"], torch.Tensor) and set(b) == {"x", "y"} for b in first)
    assert [key(b) for b in first] == expected
    assert len(ds) == len(first) == 7
    assert ds.loader.epoch == 1  # the loader's bookkeeping ran
    second = [key(b) for b in loader]
    assert second != expected  # epoch 1: another order
    ds.set_epoch(1)
    assert [key(b) for b in loader] == second  # the same epoch, the same order
    ds.set_epoch(0)
    assert [key(b) for b in loader] == expected


@pytest.mark.parametrize(
    ("context", "drop"), [(None, False), ("spawn", True)], ids=["fork", "spawn"]
)
def test_workers_yield_the_rank_share_once(arrays: Any, context: str | None, drop: bool) -> None:
    ds = ZarrIterableDataset(make(arrays, drop_remainder=drop))
    ds.set_epoch(3)
    reference = make(arrays, drop_remainder=drop)
    reference.set_epoch(3)
    expected = [key(b) for b in reference]
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context=context
    )
    got = list(loader)
    assert all(isinstance(b["y"], torch.Tensor) for b in got)
    assert Counter(key(b) for b in got) == Counter(expected)  # the same batches
    samples = [i for b in got for i in key(b)]
    assert sorted(samples) == sorted(i for b in expected for i in b)
    assert len(samples) == len(set(samples)) == (24 if drop else 25)


def test_state_dict_forwards_to_the_loader(arrays: Any) -> None:
    ds = ZarrIterableDataset(make(arrays))
    whole = [key(b) for b in make(arrays)]
    it = iter(ds)
    head = [key(next(it)), key(next(it))]
    state = ds.state_dict()
    assert state == ds.loader.state_dict() and state["batches"] == 2
    resumed = ZarrIterableDataset(make(arrays))
    resumed.load_state_dict(state)
    assert head + [key(b) for b in resumed] == whole


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_pin_memory(arrays: Any) -> None:
    ds = ZarrIterableDataset(make(arrays))
    batches = list(torch.utils.data.DataLoader(ds, batch_size=None, pin_memory=True))
    assert [key(b) for b in batches] == [key(b) for b in make(arrays)]


def test_import_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "daskzarr_batches.torch")
    with pytest.raises(ImportError, match=r"pip install 'daskzarr-batches\[torch\]'"):
        importlib.import_module("daskzarr_batches.torch")
